package main

import (
	"io"
	"slices"
	"testing"
)

func TestSpreadNamespacesBalanced(t *testing.T) {
	for _, n := range []int{1, 31, 32, 200} {
		names, count := spreadNamespaces(n)
		if len(names) != n {
			t.Fatalf("%d names, want %d", len(names), n)
		}
		if slices.Max(count)-slices.Min(count) > 1 {
			t.Errorf("n=%d: bucket counts %v differ by more than one", n, count)
		}
		for i, c := range count {
			got := 0
			for _, name := range names {
				if scheme.Bucket(name) == i {
					got++
				}
			}
			if got != c {
				t.Errorf("n=%d: bucket %d counted %d, has %d", n, i, c, got)
			}
		}
	}
}

func TestMakeObjects(t *testing.T) {
	objs := makeObjects([]string{"a", "b", "c"}, 10, 256)
	if len(objs) != 10 {
		t.Fatalf("%d objects, want 10", len(objs))
	}
	seen := map[string]bool{}
	for _, o := range objs {
		if len(o.Data["config.yaml"]) != 256 {
			t.Errorf("%s/%s: payload of %d bytes, want 256", o.Namespace, o.Name, len(o.Data["config.yaml"]))
		}
		k := key(o.Namespace, o.Name)
		if seen[k] {
			t.Errorf("%s twice", k)
		}
		seen[k] = true
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.objects != 20000 || o.pods != 4 || o.edits != 20 || !slices.Equal(o.phases, allPhases) {
		t.Errorf("defaults %+v do not match the issue's sizes", o)
	}
	if o.operatorQPS != 200 || o.operatorBurst() != 400 {
		t.Errorf("operator client limit %d/%d, want 200 QPS, burst 400", o.operatorQPS, o.operatorBurst())
	}
	if _, err := parseFlags([]string{"-operator-qps=0"}, io.Discard); err == nil {
		t.Error("-operator-qps=0 was accepted")
	}
	if _, err := parseFlags([]string{"-phases=memory,bogus"}, io.Discard); err == nil {
		t.Error("an unknown phase was accepted")
	}
	if _, err := parseFlags([]string{"-pods-per-member=1"}, io.Discard); err == nil {
		t.Error("one pod per member was accepted: a kill would leave no survivor")
	}
}
