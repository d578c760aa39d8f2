package intern_test

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
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

// TestInternOutlivesCollections: a string interned after a collection
// shares the copy of one interned before it, which a string still holds.
func TestInternOutlivesCollections(t *testing.T) {
	before := intern.String(fresh("karmada-es-member-0001"))
	runtime.GC()
	runtime.GC()
	if after := intern.String(fresh("karmada-es-member-0001")); !same(before, after) {
		t.Errorf("%q interned after a collection is a second copy", after)
	}
	runtime.KeepAlive(before)
}

// TestInternForgetsDroppedStrings: the canonical copies no string holds
// any more go, with their entries.
func TestInternForgetsDroppedStrings(t *testing.T) {
	start := intern.Held()
	kept := intern.String(fresh("kept"))
	for i := range 10000 {
		intern.String(fmt.Sprintf("dropped-%064d", i))
	}
	deadline := time.Now().Add(time.Minute)
	for intern.Held() > start+1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d canonical copies held a minute after their strings were dropped, want %d", intern.Held(), start+1)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if again := intern.String(fresh("kept")); !same(kept, again) {
		t.Errorf("%q held, interned again, is a second copy", kept)
	}
}

// TestInternConcurrently: strings interned at once from many goroutines,
// while collections drop others, share one copy each.
func TestInternConcurrently(t *testing.T) {
	const goroutines, strs = 8, 200
	got := make([][]string, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range strs {
				got[g] = append(got[g], intern.String(fmt.Sprintf("shared-%d", i)))
				intern.String(fmt.Sprintf("own-%d-%d", g, i))
				if i%50 == 0 {
					runtime.GC()
				}
			}
		})
	}
	wg.Wait()
	for g := 1; g < goroutines; g++ {
		for i := range strs {
			if !same(got[0][i], got[g][i]) {
				t.Fatalf("%q: two copies", got[g][i])
			}
		}
	}
}
