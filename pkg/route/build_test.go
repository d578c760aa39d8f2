package route

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

var scheme8 = sharding.MustSpace(8)

func set(t testing.TB, text string) sharding.Set {
	t.Helper()
	s, err := scheme8.ParseSet(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pod(cluster, name string) PodID { return PodID{Cluster: cluster, Name: name} }

// testConfig is a ShardingConfig of 8 buckets as the API server serves it,
// defaults set.
func testConfig(namespace string, scope ctrlmeshv1alpha1.ShardingScope) *ctrlmeshv1alpha1.ShardingConfig {
	return &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector:   metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "op-lock"},
			Webhook:    &ctrlmeshv1alpha1.WebhookConfig{CertDir: "/tmp/certs", Port: 9443},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}},
			}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"m1", "m2"}},
			Scope:    scope,
			Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 8, PodsPerShard: 1},
		},
	}
}

func withCanary(c *ctrlmeshv1alpha1.ShardingConfig) *ctrlmeshv1alpha1.ShardingConfig {
	c.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
		Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
		Steps:    []ctrlmeshv1alpha1.CanaryStep{{Namespaces: []string{"ns-a"}}},
	}
	return c
}

// routeSpec is the spec Build should make of testConfig, without its
// hash.
func routeSpec(cluster string, scope ctrlmeshv1alpha1.ShardingScope, generation int64, shards ...ctrlmeshv1alpha1.RouteShard) ctrlmeshv1alpha1.ShardRouteSpec {
	c := testConfig("x", scope).Spec
	spec := ctrlmeshv1alpha1.ShardRouteSpec{
		Cluster: cluster, RoutingGeneration: generation, Scope: scope, Buckets: 8,
		Selector: c.Selector, Controller: c.Controller, Webhook: c.Webhook, Limits: c.Limits, Shards: shards,
	}
	if scope == ctrlmeshv1alpha1.ScopeFleet {
		// Rules another member's pods could be granted expire.
		spec.ValiditySeconds = 30
	}
	return spec
}

type buildCase struct {
	name    string
	config  *ctrlmeshv1alpha1.ShardingConfig
	cluster string
	table   func(t testing.TB) Table
	want    ctrlmeshv1alpha1.ShardRouteSpec
}

func buildCases() []buildCase {
	addressed := func(name, address string) ctrlmeshv1alpha1.RoutePod {
		return ctrlmeshv1alpha1.RoutePod{Name: name, Address: address}
	}
	canarySpec := routeSpec("m1", ctrlmeshv1alpha1.ScopePerCluster, 4,
		ctrlmeshv1alpha1.RouteShard{ID: "0", Buckets: "0-7", Pods: []ctrlmeshv1alpha1.RoutePod{addressed("op-0", "10.0.0.1")}},
		ctrlmeshv1alpha1.RouteShard{ID: "canary", Namespaces: []string{"ns-a"}, Canary: true, Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-c"}}})
	canarySpec.CanarySelector = &metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}}
	pendingCanarySpec := routeSpec("m1", ctrlmeshv1alpha1.ScopePerCluster, 3,
		ctrlmeshv1alpha1.RouteShard{ID: "0", Buckets: "0-1,3-7", PendingBuckets: "2", Pods: []ctrlmeshv1alpha1.RoutePod{addressed("op-0", "10.0.0.1")}},
		ctrlmeshv1alpha1.RouteShard{ID: "canary", Canary: true, PendingNamespaces: []string{"ns-a"}, Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-c"}}})
	pendingCanarySpec.CanarySelector = canarySpec.CanarySelector
	subsetSpec := routeSpec("m1", ctrlmeshv1alpha1.ScopePerCluster, 6,
		ctrlmeshv1alpha1.RouteShard{ID: "0", Buckets: "0-5", Pods: []ctrlmeshv1alpha1.RoutePod{addressed("op-0", "10.0.0.1")}},
		ctrlmeshv1alpha1.RouteShard{ID: "v2", Buckets: "6-7", Namespaces: []string{"ns-a"}, Subset: "v2", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-v2"}}})
	subsetSpec.Subsets = []ctrlmeshv1alpha1.RouteSubset{{Name: "v2", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"version": "v2"}}}}
	subsetConfig := testConfig("team-a", ctrlmeshv1alpha1.ScopePerCluster)
	subsetConfig.Spec.Subsets = []ctrlmeshv1alpha1.Subset{{Name: "v2", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"version": "v2"}},
		Buckets: "6-7", Namespaces: []string{"ns-a"}}}

	interceptedConfig := testConfig("team-a", ctrlmeshv1alpha1.ScopePerCluster)
	interceptedConfig.Spec.Interception = ctrlmeshv1alpha1.InterceptEnvironment
	interceptedSpec := routeSpec("m1", ctrlmeshv1alpha1.ScopePerCluster, 3,
		ctrlmeshv1alpha1.RouteShard{ID: "0", Buckets: "0-7", Pods: []ctrlmeshv1alpha1.RoutePod{addressed("op-0", "10.0.0.1")}})
	interceptedSpec.Interception = ctrlmeshv1alpha1.InterceptEnvironment

	return []buildCase{{
		name:    "PerCluster",
		config:  testConfig("team-a", ctrlmeshv1alpha1.ScopePerCluster),
		cluster: "m1",
		table: func(t testing.TB) Table {
			return Table{Generation: 3, Shards: []Shard{
				{ID: "0", Cluster: "m1", Pods: []PodID{pod("m1", "op-0"), pod("m1", "op-1")}, Buckets: set(t, "0-3"), PendingBuckets: set(t, "")},
				{ID: "1", Cluster: "m1", Pods: []PodID{pod("m1", "op-2")}, Buckets: set(t, "4-7"), PendingBuckets: set(t, "")},
			}}
		},
		want: routeSpec("m1", ctrlmeshv1alpha1.ScopePerCluster, 3,
			ctrlmeshv1alpha1.RouteShard{ID: "0", Buckets: "0-3", Pods: []ctrlmeshv1alpha1.RoutePod{addressed("op-0", "10.0.0.1"), addressed("op-1", "10.0.0.2")}},
			ctrlmeshv1alpha1.RouteShard{ID: "1", Buckets: "4-7", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-2"}}}),
	}, {
		name:    "Fleet lists every shard, with this cluster's pods only",
		config:  testConfig("team-a", ctrlmeshv1alpha1.ScopeFleet),
		cluster: "m2",
		table: func(t testing.TB) Table {
			return Table{Generation: 7, Shards: []Shard{
				{ID: "0", Cluster: "m1", Pods: []PodID{pod("m1", "op-0")}, Buckets: set(t, "0-2"), PendingBuckets: set(t, "")},
				// Pod names repeat across clusters: only m2's op-0 is listed.
				{ID: "1", Cluster: "m2", Pods: []PodID{pod("m1", "op-1"), pod("m2", "op-0")}, Buckets: set(t, "3-5"), PendingBuckets: set(t, "")},
				{ID: "2", Cluster: "m2", Pods: []PodID{pod("m2", "op-1")}, Buckets: set(t, "6"), PendingBuckets: set(t, "7")},
			}}
		},
		want: routeSpec("m2", ctrlmeshv1alpha1.ScopeFleet, 7,
			ctrlmeshv1alpha1.RouteShard{ID: "0", Buckets: "0-2"},
			ctrlmeshv1alpha1.RouteShard{ID: "1", Buckets: "3-5", Pods: []ctrlmeshv1alpha1.RoutePod{addressed("op-0", "10.1.0.1")}},
			ctrlmeshv1alpha1.RouteShard{ID: "2", Buckets: "6", PendingBuckets: "7", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-1"}}}),
	}, {
		name:    "canary serving its namespaces",
		config:  withCanary(testConfig("team-a", ctrlmeshv1alpha1.ScopePerCluster)),
		cluster: "m1",
		table: func(t testing.TB) Table {
			return Table{Generation: 4, Shards: []Shard{
				{ID: "0", Cluster: "m1", Pods: []PodID{pod("m1", "op-0")}, Buckets: set(t, "0-7"), PendingBuckets: set(t, "")},
				{ID: "canary", Cluster: "m1", Canary: true, Pods: []PodID{pod("m1", "op-c")}, Buckets: set(t, ""), PendingBuckets: set(t, ""), Namespaces: []string{"ns-a"}},
			}}
		},
		want: canarySpec,
	}, {
		name:    "a canary whose namespaces are all pending is listed with them pending",
		config:  withCanary(testConfig("team-a", ctrlmeshv1alpha1.ScopePerCluster)),
		cluster: "m1",
		table: func(t testing.TB) Table {
			bucket := scheme8.Bucket("ns-a")
			rest, _ := scheme8.NewSet(bucket)
			return Table{Generation: 3, Shards: []Shard{
				{ID: "0", Cluster: "m1", Pods: []PodID{pod("m1", "op-0")}, Buckets: scheme8.AllBuckets().Difference(rest), PendingBuckets: rest},
				{ID: "canary", Cluster: "m1", Canary: true, Pods: []PodID{pod("m1", "op-c")}, Buckets: set(t, ""), PendingBuckets: set(t, ""), PendingNamespaces: []string{"ns-a"}},
			}}
		},
		want: pendingCanarySpec,
	}, {
		name:    "a subset's shard names its subset, and the route the subsets' pod selectors without their rules",
		config:  subsetConfig,
		cluster: "m1",
		table: func(t testing.TB) Table {
			return Table{Generation: 6, Shards: []Shard{
				{ID: "0", Cluster: "m1", Pods: []PodID{pod("m1", "op-0")}, Buckets: set(t, "0-5"), PendingBuckets: set(t, "")},
				{ID: "v2", Cluster: "m1", Subset: "v2", Pods: []PodID{pod("m1", "op-v2")}, Buckets: set(t, "6-7"), PendingBuckets: set(t, ""), Namespaces: []string{"ns-a"}},
			}}
		},
		want: subsetSpec,
	}, {
		name:    "a shard with pending buckets only is listed with its pods, which serve nothing yet",
		config:  testConfig("team-a", ctrlmeshv1alpha1.ScopePerCluster),
		cluster: "m1",
		table: func(t testing.TB) Table {
			return Table{Generation: 5, Shards: []Shard{
				{ID: "0", Cluster: "m1", Pods: []PodID{pod("m1", "op-0")}, Buckets: set(t, "0-3"), PendingBuckets: set(t, "")},
				{ID: "1", Cluster: "m1", Pods: []PodID{pod("m1", "op-1")}, Buckets: set(t, ""), PendingBuckets: set(t, "4-7")},
			}}
		},
		want: routeSpec("m1", ctrlmeshv1alpha1.ScopePerCluster, 5,
			ctrlmeshv1alpha1.RouteShard{ID: "0", Buckets: "0-3", Pods: []ctrlmeshv1alpha1.RoutePod{addressed("op-0", "10.0.0.1")}},
			ctrlmeshv1alpha1.RouteShard{ID: "1", PendingBuckets: "4-7", Pods: []ctrlmeshv1alpha1.RoutePod{addressed("op-1", "10.0.0.2")}}),
	}, {
		name:    "interception carried to the injector",
		config:  interceptedConfig,
		cluster: "m1",
		table: func(t testing.TB) Table {
			return Table{Generation: 3, Shards: []Shard{{ID: "0", Cluster: "m1", Pods: []PodID{pod("m1", "op-0")}, Buckets: set(t, "0-7"), PendingBuckets: set(t, "")}}}
		},
		want: interceptedSpec,
	}}
}

var testAddresses = map[PodID]string{
	pod("m1", "op-0"): "10.0.0.1", pod("m1", "op-1"): "10.0.0.2", pod("m2", "op-0"): "10.1.0.1",
}

// TestBuild checks the routes Build makes of the case table's route tables.
// The case "canary whose namespaces are all pending" relies on ns-a's bucket
// being 2.
func TestBuild(t *testing.T) {
	if b := scheme8.Bucket("ns-a"); b != 2 {
		t.Fatalf("ns-a is in bucket %d of 8; the table expects 2", b)
	}
	for _, tc := range buildCases() {
		t.Run(tc.name, func(t *testing.T) {
			route, err := Build(tc.config, tc.cluster, tc.table(t), testAddresses, FleetValidity)
			if err != nil {
				t.Fatal(err)
			}
			if route.APIVersion != "ctrlmesh.io/v1alpha1" || route.Kind != "ShardRoute" || route.Namespace != "team-a" || route.Name != "op" {
				t.Errorf("route %s %s %s/%s, want ctrlmesh.io/v1alpha1 ShardRoute team-a/op", route.APIVersion, route.Kind, route.Namespace, route.Name)
			}
			if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(route.Spec.RulesHash) || route.Spec.RulesHash != RulesHash(&route.Spec) {
				t.Errorf("rulesHash %q is not the hex hash of the spec, %s", route.Spec.RulesHash, RulesHash(&route.Spec))
			}
			got := route.Spec
			got.RulesHash = ""
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("spec:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestBuildRefuses(t *testing.T) {
	perCluster := testConfig("team-a", ctrlmeshv1alpha1.ScopePerCluster)
	valid := func(id string, pods ...PodID) Shard {
		return Shard{ID: id, Cluster: "m1", Pods: pods, Buckets: set(t, id), PendingBuckets: set(t, "")}
	}
	for _, tc := range []struct {
		name   string
		config *ctrlmeshv1alpha1.ShardingConfig
		table  Table
		want   string
	}{{
		name:   "nothing published",
		config: perCluster,
		table:  Table{Shards: []Shard{valid("0", pod("m1", "a"))}},
		want:   "spec.routingGeneration is 0",
	}, {
		name:   "a pod of another cluster in PerCluster scope",
		config: perCluster,
		table:  Table{Generation: 1, Shards: []Shard{valid("0", pod("m2", "a"))}},
		want:   `pod m2/a is of another cluster`,
	}, {
		name:   "a set of another bucket count",
		config: perCluster,
		table: Table{Generation: 1, Shards: []Shard{
			{ID: "0", Buckets: sharding.MustSpace(16).AllBuckets(), PendingBuckets: set(t, "")}}},
		want: `shard "0": buckets are a set of 16 buckets, want 8`,
	}, {
		name:   "a zero set",
		config: perCluster,
		table:  Table{Generation: 1, Shards: []Shard{{ID: "0", Buckets: set(t, "0")}}},
		want:   `shard "0": pending buckets are a set of 0 buckets, want 8`,
	}, {
		name:   "a bucket in two shards",
		config: perCluster,
		table: Table{Generation: 1, Shards: []Shard{
			valid("0"), {ID: "1", Buckets: set(t, "0-1"), PendingBuckets: set(t, "")}}},
		want: `bucket 0 is served by both shard "0" and shard "1"`,
	}, {
		name:   "a pod in two shards",
		config: perCluster,
		table:  Table{Generation: 1, Shards: []Shard{valid("0", pod("m1", "a")), valid("1", pod("m1", "a"))}},
		want:   `pod m1/a is listed in both shard "0" and shard "1"`,
	}, {
		name:   "a shard ID that is no DNS label",
		config: perCluster,
		table:  Table{Generation: 1, Shards: []Shard{{ID: "Shard_0", Buckets: set(t, "0"), PendingBuckets: set(t, "")}}},
		want:   `shard "Shard_0": the ID must be a DNS label`,
	}, {
		name:   "too many pods",
		config: perCluster,
		table: Table{Generation: 1, Shards: []Shard{valid("0",
			pod("m1", "p0"), pod("m1", "p1"), pod("m1", "p2"), pod("m1", "p3"), pod("m1", "p4"), pod("m1", "p5"), pod("m1", "p6"), pod("m1", "p7"), pod("m1", "p8"),
			pod("m1", "p9"), pod("m1", "p10"), pod("m1", "p11"), pod("m1", "p12"), pod("m1", "p13"), pod("m1", "p14"), pod("m1", "p15"), pod("m1", "p16"))}},
		want: "17 pods in this cluster, at most 16",
	}, {
		name:   "no scope",
		config: testConfig("team-a", ""),
		table:  Table{Generation: 1},
		want:   `scope "" is neither PerCluster nor Fleet`,
	}, {
		name: "no bucket count",
		config: func() *ctrlmeshv1alpha1.ShardingConfig {
			c := testConfig("team-a", ctrlmeshv1alpha1.ScopePerCluster)
			c.Spec.Sharding.Buckets = 0
			return c
		}(),
		table: Table{Generation: 1},
		want:  "sharding.buckets: bucket count must be a power of two",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			route, err := Build(tc.config, "m1", tc.table, nil, FleetValidity)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build = %v, %v; want an error containing %q", route, err, tc.want)
			}
		})
	}
}

func TestRulesHash(t *testing.T) {
	base := buildCases()[2] // canary: every optional field set
	build := func() *ctrlmeshv1alpha1.ShardRoute {
		route, err := Build(base.config, base.cluster, base.table(t), testAddresses, FleetValidity)
		if err != nil {
			t.Fatal(err)
		}
		return route
	}
	first := build()
	if again := build(); again.Spec.RulesHash != first.Spec.RulesHash {
		t.Fatalf("building the same route twice gave hashes %s and %s", first.Spec.RulesHash, again.Spec.RulesHash)
	}
	same := first.Spec.DeepCopy()
	same.RulesHash = "anything"
	if RulesHash(same) != first.Spec.RulesHash {
		t.Error("the hash depends on the rulesHash field itself")
	}

	for name, change := range map[string]func(s *ctrlmeshv1alpha1.ShardRouteSpec){
		"cluster":             func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Cluster = "m2" },
		"routingGeneration":   func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.RoutingGeneration++ },
		"scope":               func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Scope = ctrlmeshv1alpha1.ScopeFleet },
		"buckets":             func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Buckets = 16 },
		"selector":            func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Selector.MatchLabels["app"] = "other" },
		"canarySelector":      func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.CanarySelector = nil },
		"controller":          func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Controller.LeaderElectionName = "other" },
		"webhook":             func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Webhook.Port++ },
		"limits":              func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Limits[0].Selector = &metav1.LabelSelector{} },
		"shard buckets":       func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[0].Buckets = "0-6" },
		"shard pendingBucket": func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[0].PendingBuckets = "7" },
		"shard namespaces":    func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[1].Namespaces = []string{"ns-b"} },
		"shard canary":        func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[1].Canary = false },
		"shard subset":        func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[1].Subset = "v2" },
		"subsets": func(s *ctrlmeshv1alpha1.ShardRouteSpec) {
			s.Subsets = []ctrlmeshv1alpha1.RouteSubset{{Name: "v2", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"version": "v2"}}}}
		},
		"pod name":      func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[0].Pods[0].Name = "op-9" },
		"pod address":   func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[1].Pods[0].Address = "10.0.0.9" },
		"shard list":    func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards = s.Shards[:1] },
		"webhook unset": func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Webhook = nil },
		"pod added": func(s *ctrlmeshv1alpha1.ShardRouteSpec) {
			s.Shards[0].Pods = append(s.Shards[0].Pods, ctrlmeshv1alpha1.RoutePod{Name: "op-1"})
		},
		"limit resource":   func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Limits[0].RelateResources[0].Resources[0] = "secrets" },
		"controller unset": func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Controller = nil },
		"selector expression": func(s *ctrlmeshv1alpha1.ShardRouteSpec) {
			s.Selector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "k", Operator: metav1.LabelSelectorOpExists}}
		},
	} {
		changed := first.Spec.DeepCopy()
		change(changed)
		if RulesHash(changed) == first.Spec.RulesHash {
			t.Errorf("changing %s leaves the hash as it was", name)
		}
	}
}

// TestBuiltRoutesAreValid creates every route of the Build case table on a
// real API server, and checks that routes checkCRD refuses are refused by
// the API server too.
func TestBuiltRoutesAreValid(t *testing.T) {
	ctx := context.Background()
	ns := unique("built-routes")
	createNamespace(t, ctx, hub.Client, ns)
	for i, tc := range buildCases() {
		route, err := Build(tc.config, tc.cluster, tc.table(t), testAddresses, FleetValidity)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		route.Namespace, route.Name = ns, fmt.Sprintf("case-%d", i)
		if err := hub.Client.Create(ctx, route); err != nil {
			t.Errorf("%s: the API server refuses the built route: %v", tc.name, err)
		}
	}

	valid, err := Build(testConfig(ns, ctrlmeshv1alpha1.ScopePerCluster), "m1", buildCases()[0].table(t), testAddresses, FleetValidity)
	if err != nil {
		t.Fatal(err)
	}
	for name, breakIt := range map[string]func(s *ctrlmeshv1alpha1.ShardRouteSpec){
		"a shard serving nothing":  func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[1].Buckets = "" },
		"generation 0":             func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.RoutingGeneration = 0 },
		"a long cluster name":      func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Cluster = strings.Repeat("c", 49) },
		"a shard ID with capitals": func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[0].ID = "A" },
		"a long shard ID":          func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[0].ID = strings.Repeat("s", 51) },
		"a long namespace":         func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[0].Namespaces = []string{strings.Repeat("n", 64)} },
		"a pod without a name":     func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[0].Pods[0].Name = "" },
		"a long address":           func(s *ctrlmeshv1alpha1.ShardRouteSpec) { s.Shards[0].Pods[0].Address = strings.Repeat("a", 254) },
		"17 pods": func(s *ctrlmeshv1alpha1.ShardRouteSpec) {
			for i := range 16 {
				s.Shards[1].Pods = append(s.Shards[1].Pods, ctrlmeshv1alpha1.RoutePod{Name: fmt.Sprintf("extra-%d", i)})
			}
		},
	} {
		route := valid.DeepCopy()
		route.Name = unique("invalid")
		breakIt(&route.Spec)
		if err := checkCRD(&route.Spec); err == nil {
			t.Errorf("%s: checkCRD accepts it", name)
		}
		if err := hub.Client.Create(ctx, route); !apierrors.IsInvalid(err) {
			t.Errorf("%s: the API server answers %v, want Invalid", name, err)
		}
	}
}
