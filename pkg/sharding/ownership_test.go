package sharding

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

func TestOwnership(t *testing.T) {
	s := MustSpace(32)
	// Pick namespaces by their buckets so the cases do not depend on luck.
	in, out := namespaceIn(t, s, 3), namespaceIn(t, s, 20)
	inToo := namespaceInExcept(t, s, 3, in)
	buckets := mustSet(t, s, "0-15")

	tests := []struct {
		name     string
		own      Ownership
		owns     map[string]bool
		labelSel string
		labelErr error
		emptyErr bool
	}{
		{
			name:     "buckets",
			own:      NewOwnership(buckets, nil, nil),
			owns:     map[string]bool{in: true, inToo: true, out: false},
			labelSel: "ctrlmesh.io/sharding-hash in (0,1,10,11,12,13,14,15,2,3,4,5,6,7,8,9)",
		},
		{
			name:     "buckets minus a namespace",
			own:      NewOwnership(buckets, nil, []string{in, in}),
			owns:     map[string]bool{in: false, inToo: true, out: false},
			labelSel: "ctrlmesh.io/namespace notin (" + in + "),ctrlmesh.io/sharding-hash in (0,1,10,11,12,13,14,15,2,3,4,5,6,7,8,9)",
		},
		{
			name:     "namespaces only",
			own:      NewOwnership(mustSet(t, s, ""), []string{out}, nil),
			owns:     map[string]bool{in: false, out: true},
			labelSel: "ctrlmesh.io/namespace in (" + out + ")",
		},
		{
			name:     "buckets plus a namespace",
			own:      NewOwnership(buckets, []string{out}, nil),
			owns:     map[string]bool{in: true, out: true},
			labelErr: ErrNotLabelExpressible,
		},
		{
			name:     "nothing",
			own:      NewOwnership(mustSet(t, s, ""), nil, []string{in}),
			owns:     map[string]bool{in: false, out: false},
			labelErr: ErrEmptySet,
			emptyErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for ns, want := range tt.owns {
				if got := tt.own.Owns(ns); got != want {
					t.Errorf("Owns(%s) = %v, want %v", ns, got, want)
				}
				if got := inRanges(tt.own.HashRanges(), Hash(ns)); got != want {
					t.Errorf("hash of %s in HashRanges = %v, want %v", ns, got, want)
				}
			}
			reqs, err := tt.own.LabelRequirements()
			if !errors.Is(err, tt.labelErr) {
				t.Fatalf("LabelRequirements error = %v, want %v", err, tt.labelErr)
			}
			if err == nil {
				if got := labels.NewSelector().Add(reqs...).String(); got != tt.labelSel {
					t.Errorf("label selector = %q, want %q", got, tt.labelSel)
				}
			}
			sel, err := tt.own.ShardSelector()
			if (err != nil) != tt.emptyErr {
				t.Fatalf("ShardSelector error = %v", err)
			}
			if err == nil {
				parsed, err := ParseShardSelector(sel)
				if err != nil {
					t.Fatalf("our own selector %q does not parse: %v", sel, err)
				}
				if !slices.Equal(parsed, tt.own.HashRanges()) {
					t.Errorf("parse(format(ranges)) = %v, want %v", parsed, tt.own.HashRanges())
				}
			}
		})
	}
}

func TestOwnershipEqualAndString(t *testing.T) {
	s := MustSpace(8)
	a := NewOwnership(mustSet(t, s, "0-3"), []string{"b", "a", "a"}, nil)
	b := NewOwnership(mustSet(t, s, "0,1,2,3"), []string{"a", "b"}, nil)
	if !a.Equal(b) {
		t.Error("equal ownerships differ")
	}
	if a.Equal(NewOwnership(mustSet(t, s, "0-3"), nil, nil)) {
		t.Error("different ownerships equal")
	}
	if got, want := a.String(), "buckets 0-3 + namespaces [a b]"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

func TestParseShardSelectorErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "empty shard selector"},
		{"shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')", "only object.metadata.namespace can be combined"},
		{"shardRange(object.metadata.namespace, '0x0', '0x8000000000000000')", "must be 0x and 16 lowercase hex digits"},
		{"shardRange(object.metadata.namespace, '0x8000000000000000', '0x8000000000000000')", "must be less than end"},
		{"shardRange(object.metadata.namespace, '0x10000000000000000', '0x10000000000000000')", "must be 0x and 16 lowercase hex digits"},
		{"shardRange(object.metadata.namespace, 0x0000000000000000, '0x8000000000000000')", "must be a quoted string"},
		{"shardRange(object.metadata.namespace, '0x0000000000000000')", "takes 3 arguments"},
		{"shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000'", "lacks its closing parenthesis"},
		{"labels(x)", "is not a shardRange"},
		{"shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000') ||", "term 2"},
	}
	for _, tt := range tests {
		if _, err := ParseShardSelector(tt.in); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseShardSelector(%q) error = %v, want %q", tt.in, err, tt.want)
		}
	}
}

func TestIntersectRanges(t *testing.T) {
	top := ^uint64(0)
	tests := []struct {
		a, b, want []HashRange
	}{
		{[]HashRange{{0, 99}}, []HashRange{{50, 150}}, []HashRange{{50, 99}}},
		{[]HashRange{{0, 9}, {20, 29}}, []HashRange{{5, 24}}, []HashRange{{5, 9}, {20, 24}}},
		{[]HashRange{{0, 9}}, []HashRange{{10, 19}}, nil},
		{[]HashRange{{0, top}}, []HashRange{{7, 7}, {top, top}}, []HashRange{{7, 7}, {top, top}}},
	}
	for _, tt := range tests {
		if got := IntersectRanges(tt.a, tt.b); !slices.Equal(got, tt.want) {
			t.Errorf("IntersectRanges(%v, %v) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

func FuzzParseShardSelector(f *testing.F) {
	f.Add("shardRange(object.metadata.namespace, '0x0000000000000000', '0x10000000000000000')")
	f.Add("shardRange(object.metadata.namespace,'0x00000000000000ff','0x0000000000000100') || shardRange(object.metadata.namespace, '0x0000000000000100', '0x0000000000000200')")
	f.Add("shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')")
	f.Fuzz(func(t *testing.T, sel string) {
		ranges, err := ParseShardSelector(sel)
		if err != nil {
			return
		}
		again, err := ParseShardSelector(FormatShardSelector(ranges))
		if err != nil {
			t.Fatalf("formatted ranges of %q do not parse: %v", sel, err)
		}
		if !slices.Equal(again, ranges) {
			t.Fatalf("%q: %v then %v", sel, ranges, again)
		}
		for i := 1; i < len(ranges); i++ {
			if ranges[i].First <= ranges[i-1].Last+1 {
				t.Fatalf("%q: ranges %v not sorted and merged", sel, ranges)
			}
		}
	})
}

// FuzzOwnershipRanges: membership by Owns equals membership by hash ranges,
// and intersecting with a client's selector keeps exactly the common hashes.
func FuzzOwnershipRanges(f *testing.F) {
	f.Add(uint32(0x0000ffff), "team-a", "team-b", "probe", uint64(0), uint64(1<<63))
	f.Fuzz(func(t *testing.T, mask uint32, include, exclude, probe string, lo, hi uint64) {
		s := MustSpace(32)
		var buckets []int
		for b := 0; b < 32; b++ {
			if mask&(1<<b) != 0 {
				buckets = append(buckets, b)
			}
		}
		set, err := s.NewSet(buckets...)
		if err != nil {
			t.Fatal(err)
		}
		own := NewOwnership(set, []string{include}, []string{exclude})
		h := Hash(probe)
		collides := probe != include && probe != exclude && (h == Hash(include) || h == Hash(exclude))
		if !collides && own.Owns(probe) != inRanges(own.HashRanges(), h) {
			t.Fatalf("Owns(%q)=%v but ranges say %v", probe, own.Owns(probe), !own.Owns(probe))
		}
		if lo > hi {
			lo, hi = hi, lo
		}
		client := []HashRange{{First: lo, Last: hi}}
		both := IntersectRanges(own.HashRanges(), client)
		if want := inRanges(own.HashRanges(), h) && inRanges(client, h); inRanges(both, h) != want {
			t.Fatalf("intersection holds %#x: %v, want %v", h, !want, want)
		}
	})
}

func inRanges(ranges []HashRange, h uint64) bool {
	for _, r := range ranges {
		if r.Contains(h) {
			return true
		}
	}
	return false
}

func namespaceIn(t *testing.T, s Space, bucket int) string {
	return namespaceInExcept(t, s, bucket, "")
}

func namespaceInExcept(t *testing.T, s Space, bucket int, except string) string {
	t.Helper()
	for i := 0; i < 100000; i++ {
		ns := "ns-" + LabelValue(i)
		if ns != except && s.Bucket(ns) == bucket {
			return ns
		}
	}
	t.Fatalf("no namespace found in bucket %d", bucket)
	return ""
}
