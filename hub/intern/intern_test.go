package intern_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/ctrlmesh/ctrlmesh/hub/intern"
)

// fresh is a copy of s in memory of its own, as a decoder makes one.
func fresh(s string) string { return strings.Clone(s) }

func same(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// TestInternSharesOneCopy: equal strings interned apart share one copy;
// maps keep their entries, with canonical keys, and canonical values but
// for the keys whose values are each object's own.
func TestInternSharesOneCopy(t *testing.T) {
	a, b := intern.String(fresh("ctrlmesh.io/shardingconfig-name")), intern.String(fresh("ctrlmesh.io/shardingconfig-name"))
	if a != b || !same(a, b) {
		t.Errorf("String: %q and %q are two copies", a, b)
	}
	if intern.String("") != "" {
		t.Error(`String("") is not empty`)
	}

	x, y := fresh("operators"), fresh("operators")
	ss := []string{x, fresh("karmada-es-m1")}
	intern.Strings(&x, &y)
	intern.Slice(ss)
	if !same(x, y) || !same(x, ss[0]) || ss[1] != "karmada-es-m1" {
		t.Errorf("Strings and Slice: %q %q %q are not one copy, or %q changed", x, y, ss[0], ss[1])
	}

	for _, tc := range []struct {
		name string
		in   map[string]string
		own  []string
	}{
		{"nil", nil, nil},
		{"empty", map[string]string{}, nil},
		{"labels, the ID its own", map[string]string{"config": "op", "id": "4f7c2f0e"}, []string{"id"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m1, m2 := copyFresh(tc.in), copyFresh(tc.in)
			got1, got2 := intern.Map(m1, tc.own...), intern.Map(m2, tc.own...)
			if !maps.Equal(got1, tc.in) || (tc.in == nil) != (got1 == nil) {
				t.Fatalf("Map = %v, want %v", got1, tc.in)
			}
			for k, v := range got1 {
				var k2 string
				for kk := range got2 {
					if kk == k {
						k2 = kk
					}
				}
				if !same(k, k2) {
					t.Errorf("key %q: two copies", k)
				}
				if shared := same(v, got2[k]); shared == slices.Contains(tc.own, k) {
					t.Errorf("value of %q: one copy %v, want %v", k, shared, !slices.Contains(tc.own, k))
				}
			}
		})
	}
}

func copyFresh(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := map[string]string{}
	for k, v := range m {
		out[fresh(k)] = fresh(v)
	}
	return out
}
