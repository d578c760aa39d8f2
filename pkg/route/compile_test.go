package route

import (
	"fmt"
	"strings"
	"testing"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// compileSpec is a route of 32 buckets: shard 0 serves 0-15, shard 1 16-29
// with 30-31 pending, the canary team-a.
func compileSpec() *ctrlmeshv1alpha1.ShardRouteSpec {
	canary := specShard("canary", "", "op-canary")
	canary.Canary, canary.Namespaces = true, []string{"team-a"}
	pending := specShard("1", "16-29", "op-1")
	pending.PendingBuckets = "30-31"
	return &publishedRoute("m1", 4, 32, specShard("0", "0-15", "op-0", "op-standby"), pending, canary).Spec
}

func TestCompile(t *testing.T) {
	for _, tc := range []struct {
		pod, shard, ownership string
	}{
		{"op-0", "0", "buckets 0-15 - namespaces [team-a]"},
		{"op-standby", "0", "buckets 0-15 - namespaces [team-a]"},
		{"op-1", "1", "buckets 16-29 - namespaces [team-a]"},
		{"op-canary", "canary", "buckets none + namespaces [team-a]"},
		{"op-new", "", ""},
	} {
		a, err := Compile(compileSpec(), tc.pod)
		if err != nil {
			t.Fatalf("%s: %v", tc.pod, err)
		}
		if a.Pod != tc.pod || a.Shard != tc.shard || a.Assigned() != (tc.shard != "") || a.Serving() != (tc.shard != "") {
			t.Errorf("%s: pod %q, shard %q (assigned %v, serving %v), want shard %q", tc.pod, a.Pod, a.Shard, a.Assigned(), a.Serving(), tc.shard)
		}
		if tc.shard != "" && a.Ownership.String() != tc.ownership {
			t.Errorf("%s: ownership %s, want %s", tc.pod, a.Ownership, tc.ownership)
		}
		if !a.Assigned() && a.Owns("team-a") {
			t.Errorf("%s: an unassigned pod owns a namespace", tc.pod)
		}
	}

	a, err := Compile(compileSpec(), "op-0")
	if err != nil {
		t.Fatal(err)
	}
	// Owners: by exact namespace first, then by bucket; pending buckets have
	// none.
	if o := a.OwnerOf("team-a"); o == nil || o.ID != "canary" {
		t.Errorf("owner of team-a = %v", o)
	}
	for i := range 2000 {
		ns := fmt.Sprintf("ns-%d", i)
		b, o := a.Bucket(ns), a.OwnerOf(ns)
		if b != space32.Bucket(ns) {
			t.Fatalf("bucket of %s = %d, want %d", ns, b, space32.Bucket(ns))
		}
		switch {
		case b <= 15 && (o == nil || o.ID != "0"), b >= 16 && b <= 29 && (o == nil || o.ID != "1"), b >= 30 && o != nil:
			t.Fatalf("owner of %s (bucket %d) = %v", ns, b, o)
		}
	}

	// A new shard whose buckets are all pending leads its lock but serves
	// nothing until they are granted.
	spec := compileSpec()
	spec.Shards[1].Buckets = ""
	pendingOnly, err := Compile(spec, "op-1")
	if err != nil {
		t.Fatal(err)
	}
	if !pendingOnly.Assigned() || pendingOnly.Serving() || pendingOnly.Owns("team-b") {
		t.Errorf("pending-only shard: assigned %v, serving %v", pendingOnly.Assigned(), pendingOnly.Serving())
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*ctrlmeshv1alpha1.ShardRouteSpec)
		want   string
	}{
		{"empty bucket set", func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[0].Buckets = "" },
			`shard "0" of pod "op-0" has an empty bucket set, no pending buckets and no namespaces`},
		{"bucket out of range", func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[0].Buckets = "0-32" },
			`shard "0" buckets: bucket set "0-32": bucket 32 is out of range`},
		{"pending buckets out of range", func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[1].PendingBuckets = "30-32" },
			`shard "1" pendingBuckets: bucket set "30-32": bucket 32 is out of range`},
		{"two owners", func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[1].Buckets = "15-29" },
			`bucket 15 is served by both shard "0" and shard "1"`},
		{"pod twice", func(s *ctrlmeshv1alpha1.ShardRouteSpec) {
			s.Shards[1].Pods = append(s.Shards[1].Pods, ctrlmeshv1alpha1.RoutePod{Name: "op-0"})
		}, `pod m1/op-0 is listed in both shard "0" and shard "1"`},
		{"bad bucket count", func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Buckets = 24 }, "spec.buckets: bucket count must be a power of two"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := compileSpec()
			tc.mutate(spec)
			if _, err := Compile(spec, "op-0"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Compile = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
