package sharding

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestHashIsFNV1a64(t *testing.T) {
	// Reference values of the FNV-1a 64-bit function (offset basis and the
	// published test vectors), which kube-apiserver's shardRange also uses.
	tests := []struct {
		in   string
		want uint64
	}{
		{"", 0xcbf29ce484222325},
		{"a", 0xaf63dc4c8601ec8c},
		{"foobar", 0x85944171f73967e8},
	}
	for _, tt := range tests {
		if got := Hash(tt.in); got != tt.want {
			t.Errorf("Hash(%q) = %#x, want %#x", tt.in, got, tt.want)
		}
	}
}

func TestNewSpace(t *testing.T) {
	tests := []struct {
		buckets int
		wantErr bool
		bits    uint
	}{
		{1, false, 0}, {2, false, 1}, {32, false, 5}, {4096, false, 12},
		{0, true, 0}, {-4, true, 0}, {3, true, 0}, {48, true, 0}, {8192, true, 0},
	}
	for _, tt := range tests {
		s, err := NewSpace(tt.buckets)
		if (err != nil) != tt.wantErr {
			t.Errorf("NewSpace(%d) error = %v, wantErr %v", tt.buckets, err, tt.wantErr)
			continue
		}
		if err != nil {
			if !strings.Contains(err.Error(), "power of two") {
				t.Errorf("NewSpace(%d) error %q does not say what is allowed", tt.buckets, err)
			}
			continue
		}
		if s.bits != tt.bits || s.Buckets() != tt.buckets {
			t.Errorf("NewSpace(%d) = %+v, want bits %d", tt.buckets, s, tt.bits)
		}
	}
}

func TestBucketIsTopBits(t *testing.T) {
	// "foobar" hashes to 0x85944171f73967e8 = 0b1000_0101_1001_…
	tests := []struct {
		buckets int
		want    int
	}{
		{1, 0},
		{2, 1},     // top bit 1
		{32, 0x10}, // top 5 bits 10000
		{4096, 0x859},
	}
	for _, tt := range tests {
		if got := MustSpace(tt.buckets).Bucket("foobar"); got != tt.want {
			t.Errorf("with %d buckets Bucket(foobar) = %d, want %d", tt.buckets, got, tt.want)
		}
	}
}

func TestRange(t *testing.T) {
	tests := []struct {
		buckets, bucket int
		want            HashRange
	}{
		{1, 0, HashRange{0, ^uint64(0)}},
		{2, 0, HashRange{0, 1<<63 - 1}},
		{2, 1, HashRange{1 << 63, ^uint64(0)}},
		{32, 0, HashRange{0, 1<<59 - 1}},
		{32, 12, HashRange{12 << 59, 13<<59 - 1}},
		{32, 31, HashRange{31 << 59, ^uint64(0)}},
	}
	for _, tt := range tests {
		if got := MustSpace(tt.buckets).Range(tt.bucket); got != tt.want {
			t.Errorf("Range(%d of %d) = %#x, want %#x", tt.bucket, tt.buckets, got, tt.want)
		}
	}
}

func TestEveryNamespaceLandsInItsBucketRange(t *testing.T) {
	for _, n := range []int{1, 2, 32, 4096} {
		s := MustSpace(n)
		for i := 0; i < 2000; i++ {
			ns := "ns-" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + LabelValue(i)
			if !s.Range(s.Bucket(ns)).Contains(Hash(ns)) {
				t.Fatalf("with %d buckets, %q (hash %#x) is not in the range of its bucket %d", n, ns, Hash(ns), s.Bucket(ns))
			}
		}
	}
}

func TestParseSet(t *testing.T) {
	s := MustSpace(32)
	tests := []struct {
		in      string
		want    []int
		canon   string
		wantErr string
	}{
		{in: "", want: []int{}, canon: ""},
		{in: "  ", want: []int{}, canon: ""},
		{in: "0", want: []int{0}, canon: "0"},
		{in: "0-7,12", want: []int{0, 1, 2, 3, 4, 5, 6, 7, 12}, canon: "0-7,12"},
		{in: "12, 0-3 ,4-7", want: []int{0, 1, 2, 3, 4, 5, 6, 7, 12}, canon: "0-7,12"},
		{in: "3-3", want: []int{3}, canon: "3"},
		{in: "1-4,2-6", want: []int{1, 2, 3, 4, 5, 6}, canon: "1-6"},
		{in: "30,31,0", want: []int{0, 30, 31}, canon: "0,30-31"},
		{in: "0-31", canon: "0-31"},
		{in: "32", wantErr: "bucket 32 is out of range: with 32 buckets they are numbered 0 to 31"},
		{in: "7-3", wantErr: `range "7-3" runs backwards; write it low to high, as 3-7`},
		{in: "1,,2", wantErr: "item 2 is empty"},
		{in: "a", wantErr: `"a" is not a bucket number`},
		{in: "-1", wantErr: `"" is not a bucket number`},
		{in: "+1", wantErr: `"+1" is not a bucket number`},
		{in: "1-2-3", wantErr: `"2-3" is not a bucket number`},
		{in: "99999999999999999999", wantErr: "is not a bucket number"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := s.ParseSet(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseSet(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSet(%q): %v", tt.in, err)
			}
			if tt.want != nil && !slices.Equal(got.Buckets(), tt.want) {
				t.Errorf("ParseSet(%q) = %v, want %v", tt.in, got.Buckets(), tt.want)
			}
			if got.String() != tt.canon {
				t.Errorf("ParseSet(%q).String() = %q, want %q", tt.in, got.String(), tt.canon)
			}
		})
	}
}

func TestSetAlgebra(t *testing.T) {
	s := MustSpace(16)
	a := mustSet(t, s, "0-7")
	b := mustSet(t, s, "4-11")
	if got := a.Union(b).String(); got != "0-11" {
		t.Errorf("union = %q", got)
	}
	if got := a.Intersection(b).String(); got != "4-7" {
		t.Errorf("intersection = %q", got)
	}
	if got := a.Difference(b).String(); got != "0-3" {
		t.Errorf("difference = %q", got)
	}
	if got := s.AllBuckets().String(); got != "0-15" || s.AllBuckets().Len() != 16 {
		t.Errorf("all buckets = %q", got)
	}
	if !a.Equal(mustSet(t, s, "0-3,4-7")) || a.Equal(b) {
		t.Error("Equal disagrees with the buckets")
	}
	if _, err := s.NewSet(16); err == nil {
		t.Error("NewSet accepted a bucket out of range")
	}
	defer func() {
		if recover() == nil {
			t.Error("combining sets of different spaces did not panic")
		}
	}()
	a.Union(mustSet(t, MustSpace(32), "1"))
}

func TestShardSelector(t *testing.T) {
	tests := []struct {
		buckets int
		set     string
		want    string
	}{
		{32, "0-7,12", "shardRange(object.metadata.namespace, '0x0000000000000000', '0x4000000000000000') || " +
			"shardRange(object.metadata.namespace, '0x6000000000000000', '0x6800000000000000')"},
		{32, "0-31", "shardRange(object.metadata.namespace, '0x0000000000000000', '0x10000000000000000')"},
		{32, "31", "shardRange(object.metadata.namespace, '0xf800000000000000', '0x10000000000000000')"},
		{1, "0", "shardRange(object.metadata.namespace, '0x0000000000000000', '0x10000000000000000')"},
		{4096, "1", "shardRange(object.metadata.namespace, '0x0010000000000000', '0x0020000000000000')"},
	}
	for _, tt := range tests {
		got, err := mustSet(t, MustSpace(tt.buckets), tt.set).ShardSelector()
		if err != nil {
			t.Fatalf("ShardSelector(%s of %d): %v", tt.set, tt.buckets, err)
		}
		if got != tt.want {
			t.Errorf("ShardSelector(%s of %d) =\n %s\nwant\n %s", tt.set, tt.buckets, got, tt.want)
		}
	}
	if _, err := mustSet(t, MustSpace(32), "").ShardSelector(); !errors.Is(err, ErrEmptySet) {
		t.Errorf("empty set selector error = %v, want ErrEmptySet", err)
	}
}

func TestLabelSelector(t *testing.T) {
	sel, err := mustSet(t, MustSpace(32), "0-1,12").LabelSelector()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sel.String(), "ctrlmesh.io/sharding-hash in (0,1,12)"; got != want {
		t.Errorf("LabelSelector = %q, want %q", got, want)
	}
	if _, err := mustSet(t, MustSpace(32), "").LabelRequirement(); !errors.Is(err, ErrEmptySet) {
		t.Errorf("empty set requirement error = %v, want ErrEmptySet", err)
	}
}

func mustSet(t *testing.T, s Space, text string) Set {
	t.Helper()
	set, err := s.ParseSet(text)
	if err != nil {
		t.Fatal(err)
	}
	return set
}
