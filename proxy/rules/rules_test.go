package rules

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// mapScopes is a fixed table of served resources; Compile's logic is pure.
// An unknown resource is a no-match error, as MapperScopes returns it.
type mapScopes map[schema.GroupResource]bool

func (m mapScopes) IsNamespaced(gr schema.GroupResource) (bool, error) {
	namespaced, ok := m[gr]
	if !ok {
		return false, fmt.Errorf("the API server does not serve it: %w", &meta.NoResourceMatchError{PartialResource: gr.WithVersion("")})
	}
	return namespaced, nil
}

var served = mapScopes{
	{Resource: "configmaps"}:                 true,
	{Resource: "secrets"}:                    true,
	{Group: "apps", Resource: "deployments"}: true,
	{Resource: "nodes"}:                      false,
}

func testRoute(mutate func(*ctrlmeshv1alpha1.ShardRoute)) *ctrlmeshv1alpha1.ShardRoute {
	r := &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{
		Cluster: "m1", RoutingGeneration: 4, RulesHash: "h4", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
		Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "op"},
		Limits: ctrlmeshv1alpha1.Limits{
			{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"}}}},
			{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{"apps"}, Resources: []string{"*"}}},
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}},
		},
		Shards: []ctrlmeshv1alpha1.RouteShard{
			{ID: "0", Buckets: "0-15", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-0"}, {Name: "op-standby"}}},
			{ID: "1", Buckets: "16-29", PendingBuckets: "30-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-1"}}},
			{ID: "canary", Namespaces: []string{"team-a"}, Canary: true, Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-canary"}}},
		},
	}}
	if mutate != nil {
		mutate(r)
	}
	return r
}

func TestCompileRefusesBadRules(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*ctrlmeshv1alpha1.ShardRoute)
		mode   Mode
		want   string
	}{
		{"unknown resource", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Limits[0].RelateResources[0].Resources[0] = "configmapz" },
			ModeRange, `limit 0: resource "configmapz": the API server does not serve it`},
		{"cluster-scoped resource", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Limits[0].RelateResources[0].Resources[0] = "nodes" },
			ModeRange, `resource "nodes" is cluster-scoped`},
		{"malformed selector", func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.Limits[1].Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: "Sometimes"}}}
		}, ModeRange, `limit 1 selector: "Sometimes" is not a valid label selector operator`},
		{"empty bucket set", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[0].Buckets = "" },
			ModeRange, `shard "0" of pod "op-0" has an empty bucket set, no pending buckets and no namespaces`},
		{"bucket out of range", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[0].Buckets = "0-32" },
			ModeRange, `shard "0" buckets: bucket set "0-32": bucket 32 is out of range`},
		{"two owners", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[1].Buckets = "15-29" },
			ModeRange, `bucket 15 is served by both shard "0" and shard "1"`},
		{"namespace twice", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[1].Namespaces = []string{"team-a"} },
			ModeRange, `namespace "team-a" is served by both shard "1" and shard "canary"`},
		{"pod twice", func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.Shards[1].Pods = append(r.Spec.Shards[1].Pods, ctrlmeshv1alpha1.RoutePod{Name: "op-0"})
		},
			ModeRange, `pod m1/op-0 is listed in both shard "0" and shard "1"`},
		{"overlapping limits", func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.Limits[1].RelateResources[0] = ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{"*"}, Resources: []string{"secrets"}}
		}, ModeRange, "limits 0 and 1 name the same resource"},
		{"bad bucket count", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Buckets = 24 },
			ModeRange, "spec.buckets: bucket count must be a power of two"},
		{"no hash", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.RulesHash = "" }, ModeRange, "rules have no rulesHash"},
		{"no limits", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Limits = nil }, ModeRange, "rules have no limits"},
		{"label mode mix", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[0].Namespaces = []string{"team-b"} },
			ModeLabel, `shard "0" in label mode: buckets plus single namespaces`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compile(testRoute(tt.mutate), "op-0", tt.mode, served)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Compile error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestCompile(t *testing.T) {
	s := sharding.MustSpace(32)
	tests := []struct {
		pod       string
		shard     string
		ownership string
	}{
		{"op-0", "0", "buckets 0-15 - namespaces [team-a]"},
		{"op-standby", "0", "buckets 0-15 - namespaces [team-a]"},
		{"op-1", "1", "buckets 16-29 - namespaces [team-a]"},
		{"op-canary", "canary", "buckets none + namespaces [team-a]"},
		{"op-new", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.pod, func(t *testing.T) {
			snap, err := Compile(testRoute(nil), tt.pod, ModeLabel, served)
			if err != nil {
				t.Fatal(err)
			}
			if snap.Shard != tt.shard || snap.Assigned() != (tt.shard != "") {
				t.Fatalf("shard = %q, want %q", snap.Shard, tt.shard)
			}
			if tt.shard != "" && snap.Ownership.String() != tt.ownership {
				t.Errorf("ownership = %s, want %s", snap.Ownership, tt.ownership)
			}
			if snap.Hash() != "h4" || snap.Generation() != 4 || snap.LeaderElectionName != "op" {
				t.Errorf("hash %q generation %d lock %q", snap.Hash(), snap.Generation(), snap.LeaderElectionName)
			}
			if !snap.Assigned() && snap.Owns("team-a") {
				t.Error("an unassigned pod owns a namespace")
			}
		})
	}

	// A new shard whose buckets are all pending leads its lock but serves
	// nothing until they are granted.
	pendingOnly, err := Compile(testRoute(func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[1].Buckets = "" }), "op-1", ModeLabel, served)
	if err != nil {
		t.Fatal(err)
	}
	if !pendingOnly.Assigned() || pendingOnly.Serving() || pendingOnly.Owns("team-b") {
		t.Errorf("pending-only shard: assigned %v, serving %v", pendingOnly.Assigned(), pendingOnly.Serving())
	}

	snap, err := Compile(testRoute(nil), "op-0", ModeRange, served)
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Serving() {
		t.Error("a shard with buckets does not serve")
	}
	for _, tc := range []struct {
		gr    schema.GroupResource
		limit int
	}{
		{schema.GroupResource{Resource: "configmaps"}, 0},
		{schema.GroupResource{Group: "apps", Resource: "statefulsets"}, 1},
		{schema.GroupResource{Resource: "pods"}, -1},
	} {
		l, ok := snap.LimitFor(tc.gr)
		if ok != (tc.limit >= 0) || (ok && l != &snap.Limits[tc.limit]) {
			t.Errorf("LimitFor(%s) = %v, %v; want limit %d", tc.gr, l, ok, tc.limit)
		}
	}
	if got := snap.Limits[1].Requirements.String(); got != "tier=web" {
		t.Errorf("limit 1 requirements = %q", got)
	}
	// Owners: by exact namespace first, then by bucket; pending buckets have none.
	if o := snap.OwnerOf("team-a"); o == nil || o.ID != "canary" {
		t.Errorf("owner of team-a = %v", o)
	}
	for i := 0; i < 2000; i++ {
		ns := fmt.Sprintf("ns-%d", i)
		b := s.Bucket(ns)
		o := snap.OwnerOf(ns)
		switch {
		case b <= 15 && (o == nil || o.ID != "0"), b >= 16 && b <= 29 && (o == nil || o.ID != "1"), b >= 30 && o != nil:
			t.Fatalf("owner of %s (bucket %d) = %v", ns, b, o)
		}
	}
}

func TestSameSelection(t *testing.T) {
	compile := func(pod string, mutate func(*ctrlmeshv1alpha1.ShardRoute)) *Snapshot {
		t.Helper()
		snap, err := Compile(testRoute(mutate), pod, ModeRange, served)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	base := compile("op-0", nil)
	tests := []struct {
		name  string
		other *Snapshot
		same  bool
	}{
		{"another pod's pending buckets", compile("op-0", func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.RoutingGeneration, r.Spec.RulesHash = 5, "h5"
			r.Spec.Shards[1].PendingBuckets = ""
		}), true},
		{"own buckets", compile("op-0", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[0].Buckets = "0-14" }), false},
		{"canary namespace", compile("op-0", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[2].Namespaces = []string{"team-b"} }), false},
		{"limit selector", compile("op-0", func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Limits[1].Selector = nil }), false},
		{"standby of the same shard", compile("op-standby", nil), true},
	}
	for _, tt := range tests {
		if got := base.SameSelection(tt.other); got != tt.same {
			t.Errorf("%s: SameSelection = %v, want %v", tt.name, got, tt.same)
		}
	}
}

// failingScopes is discovery that cannot answer.
type failingScopes struct{}

func (failingScopes) IsNamespaced(schema.GroupResource) (bool, error) {
	return false, fmt.Errorf("the server is currently unable to handle the request")
}

// TestDiscoveryErrorsAreMarked: a compile error that discovery caused is
// ErrDiscovery (callers retry), one the rules caused is not (callers
// refuse).
func TestDiscoveryErrorsAreMarked(t *testing.T) {
	limits := ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}}}}
	if _, err := CompileLimits(limits, failingScopes{}); !errors.Is(err, ErrDiscovery) {
		t.Errorf("discovery failing: error %v, want ErrDiscovery", err)
	}
	limits[0].RelateResources[0].Resources[0] = "configmapz"
	if _, err := CompileLimits(limits, served); err == nil || errors.Is(err, ErrDiscovery) {
		t.Errorf("unknown resource: error %v, want a refusal that is not ErrDiscovery", err)
	}
}
