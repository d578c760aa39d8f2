package sharding

import (
	"regexp"
	"strings"
	"testing"
)

// FuzzParseSet: any text either fails to parse, or parses to a set whose
// compact form is a fixed point that parses back to the same set.
func FuzzParseSet(f *testing.F) {
	for _, seed := range []string{"", "0-7,12", "31", "1,,2", "7-3", " 3 , 4-5", "0-31", "00-0001", "-", "4096"} {
		f.Add(seed)
	}
	s := MustSpace(32)
	f.Fuzz(func(t *testing.T, text string) {
		set, err := s.ParseSet(text)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		canon := set.String()
		again, err := s.ParseSet(canon)
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", canon, text, err)
		}
		if !again.Equal(set) || again.String() != canon {
			t.Fatalf("%q -> %q -> %q: not a fixed point", text, canon, again.String())
		}
	})
}

var shardRangeTerm = regexp.MustCompile(`^shardRange\(object\.metadata\.namespace, '0x([0-9a-f]{16})', '0x([0-9a-f]{16}|10000000000000000)'\)$`)

// FuzzShardSelector: for any bucket set and namespace, the namespace's hash is
// in the selector's ranges exactly when its bucket is in the set, and the
// selector is well formed, with one term per maximal run of buckets.
func FuzzShardSelector(f *testing.F) {
	f.Add(uint8(5), uint64(0x00ff00ff00ff00ff), "default")
	f.Add(uint8(0), uint64(1), "kube-system")
	f.Add(uint8(12), uint64(0xffffffffffffffff), "")
	f.Fuzz(func(t *testing.T, bitsIn uint8, mask uint64, namespace string) {
		s := MustSpace(1 << (bitsIn % 13))
		var buckets []int
		for b := 0; b < s.Buckets(); b++ {
			// Spread the 64 mask bits over up to 4096 buckets.
			if mask&(1<<(uint(b*2654435761)%64)) != 0 {
				buckets = append(buckets, b)
			}
		}
		set, err := s.NewSet(buckets...)
		if err != nil {
			t.Fatal(err)
		}
		sel, err := set.ShardSelector()
		if set.IsEmpty() {
			if err == nil {
				t.Fatal("empty set gave a selector")
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		terms := strings.Split(sel, " || ")
		ranges := set.HashRanges()
		if len(terms) != len(ranges) {
			t.Fatalf("%d terms for %d ranges", len(terms), len(ranges))
		}
		for i, term := range terms {
			if !shardRangeTerm.MatchString(term) {
				t.Fatalf("malformed term %q", term)
			}
			if i > 0 && ranges[i-1].Last+1 >= ranges[i].First {
				t.Fatalf("ranges %d and %d touch but were not merged", i-1, i)
			}
		}
		h := Hash(namespace)
		inRanges := false
		for _, r := range ranges {
			inRanges = inRanges || r.Contains(h)
		}
		if inRanges != set.HasNamespace(namespace) {
			t.Fatalf("namespace %q (hash %#x, bucket %d): in ranges %v, in set %v", namespace, h, s.Bucket(namespace), inRanges, set.HasNamespace(namespace))
		}
	})
}
