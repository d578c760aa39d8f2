package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// One API server serves every case of this package.
var cluster *env.Cluster

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cluster = fleet.Cluster("hub")
	code := m.Run()
	if err := fleet.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func validShardingConfig(name string) *ctrlmeshv1alpha1.ShardingConfig {
	return &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector:   metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "op-leader"},
			Webhook:    &ctrlmeshv1alpha1.WebhookConfig{CertDir: "/tmp/certs", Port: 9443},
			Limits: ctrlmeshv1alpha1.Limits{
				{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"}}}},
				{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{"apps"}, Resources: []string{"deployments"}}},
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}},
			},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"member1"}},
		},
	}
}

func TestShardingConfigValidation(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		mutate func(*ctrlmeshv1alpha1.ShardingConfig)
		// want is a part of the API server's message; "" means accepted.
		want string
	}{
		{name: "valid", mutate: func(*ctrlmeshv1alpha1.ShardingConfig) {}},
		{name: "valid with everything", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Scope = ctrlmeshv1alpha1.ScopeFleet
			sc.Spec.Clusters.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}
			sc.Spec.Sharding = ctrlmeshv1alpha1.ShardingLayout{Buckets: 64, Shards: ptr.To[int32](8), PodsPerShard: 2}
			sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
				Steps:    []ctrlmeshv1alpha1.CanaryStep{{Namespaces: []string{"team-a"}}, {Buckets: "0-3,63"}},
			}
		}},
		{name: "wildcard limit alone", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Limits = ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{"*"}, Resources: []string{"*"}}}}}
		}},

		{name: "empty pod selector", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Selector = metav1.LabelSelector{}
		}, want: "selector must not be empty: select the operator's pods by their labels"},
		{name: "no limits", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Limits = ctrlmeshv1alpha1.Limits{}
		}, want: "spec.limits: Invalid value: 0: spec.limits in body should have at least 1 items"},
		{name: "resource in two limits", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Limits[1].RelateResources[0] = ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{"apps", ""}, Resources: []string{"secrets"}}
		}, want: "a resource may be listed in only one limit"},
		{name: "wildcard group overlaps", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Limits[1].RelateResources[0] = ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{"*"}, Resources: []string{"configmaps"}}
		}, want: "a resource may be listed in only one limit"},
		{name: "wildcard resource overlaps", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Limits[1].RelateResources[0] = ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{""}, Resources: []string{"*"}}
		}, want: "a resource may be listed in only one limit"},
		{name: "identical limits", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Limits[1] = *sc.Spec.Limits[0].DeepCopy()
		}, want: "a resource may be listed in only one limit"},
		{name: "limit without resources", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Limits[0].RelateResources[0].Resources = nil
		}, want: "spec.limits[0].relateResources[0].resources: Required value"},
		{name: "no clusters", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Clusters = ctrlmeshv1alpha1.ClusterSelection{}
		}, want: "clusters must list cluster names or set a selector on ManagedCluster labels"},
		{name: "bad cluster name", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Clusters.Names = []string{"Member_1"}
		}, want: `spec.clusters.names[0]: Invalid value: "Member_1": spec.clusters.names[0] in body should match`},
		{name: "buckets not a power of two", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Sharding.Buckets = 48
		}, want: "spec.sharding.buckets: Invalid value: 48: sharding.buckets must be a power of two from 1 to 4096, such as 32"},
		{name: "too many buckets", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Sharding.Buckets = 8192
		}, want: "sharding.buckets must be a power of two from 1 to 4096"},
		{name: "more shards than buckets", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Sharding.Buckets = 4
			sc.Spec.Sharding.Shards = ptr.To[int32](5)
		}, want: "sharding.shards cannot exceed sharding.buckets: every shard needs at least one bucket"},
		{name: "zero pods per shard", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Sharding.PodsPerShard = -1
		}, want: "spec.sharding.podsPerShard: Invalid value: -1: spec.sharding.podsPerShard in body should be greater than or equal to 1"},
		{name: "unknown scope", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Scope = "Global"
		}, want: `spec.scope: Unsupported value: "Global": supported values: "PerCluster", "Fleet"`},
		{name: "each interception", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Interception = ctrlmeshv1alpha1.InterceptIptables
		}},
		{name: "unknown interception", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Interception = "iptables"
		}, want: `spec.interception: Unsupported value: "iptables": supported values: "Kubeconfig", "Environment", "Iptables"`},
		{name: "bad leader election name", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Controller.LeaderElectionName = "Op_Leader"
		}, want: `spec.controller.leaderElectionName: Invalid value: "Op_Leader"`},
		{name: "relative cert dir", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Webhook.CertDir = "certs"
		}, want: "webhook.certDir must be an absolute path"},
		{name: "webhook port out of range", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Webhook.Port = 70000
		}, want: "spec.webhook.port: Invalid value: 70000: spec.webhook.port in body should be less than or equal to 65535"},
		{name: "empty canary selector", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{Steps: []ctrlmeshv1alpha1.CanaryStep{{Buckets: "0"}}}
		}, want: "canary.selector must not be empty: it would make every operator pod a canary"},
		{name: "canary without steps", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}}}
		}, want: "spec.canary.steps: Required value"},
		{name: "empty canary step", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
				Steps:    []ctrlmeshv1alpha1.CanaryStep{{}},
			}
		}, want: "a canary step must name buckets or namespaces for the canary pods to serve"},
		{name: "canary bucket out of range", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
				Steps:    []ctrlmeshv1alpha1.CanaryStep{{Buckets: "0-3"}, {Buckets: "0-3,32"}},
			}
		}, want: "canary step buckets must be below sharding.buckets"},
		{name: "canary bucket range backwards", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
				Steps:    []ctrlmeshv1alpha1.CanaryStep{{Buckets: "7-3"}},
			}
		}, want: "canary step buckets: a range must run from low to high, such as 4-7"},
		{name: "canary buckets malformed", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
				Steps:    []ctrlmeshv1alpha1.CanaryStep{{Buckets: "0-3;5"}},
			}
		}, want: `spec.canary.steps[0].buckets: Invalid value: "0-3;5": spec.canary.steps[0].buckets in body should match`},
		{name: "canary namespace invalid", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
				Steps:    []ctrlmeshv1alpha1.CanaryStep{{Namespaces: []string{"Team A"}}},
			}
		}, want: `spec.canary.steps[0].namespaces[0]: Invalid value: "Team A"`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := validShardingConfig(fmt.Sprintf("case-%d", i))
			tt.mutate(sc)
			err := cluster.Client.Create(ctx, sc)
			checkVerdict(t, err, tt.want)
		})
	}
}

func TestShardingConfigDefaults(t *testing.T) {
	ctx := context.Background()
	sc := validShardingConfig("defaults")
	sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
		Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
		Steps:    []ctrlmeshv1alpha1.CanaryStep{{Buckets: "31"}},
	}
	if err := cluster.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	var got ctrlmeshv1alpha1.ShardingConfig
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Scope != ctrlmeshv1alpha1.ScopePerCluster || got.Spec.Sharding.Buckets != 32 ||
		got.Spec.Sharding.PodsPerShard != 1 || got.Spec.Sharding.Shards != nil || got.Spec.Canary.MinHealthySeconds != 30 {
		t.Errorf("defaults: scope %q, sharding %+v, canary minHealthySeconds %d", got.Spec.Scope, got.Spec.Sharding, got.Spec.Canary.MinHealthySeconds)
	}

	// An update that breaks a rule is refused and the stored object stays.
	broken := got.DeepCopy()
	broken.Spec.Sharding.Buckets = 12
	checkVerdict(t, cluster.Client.Update(ctx, broken), "sharding.buckets must be a power of two")
	var after ctrlmeshv1alpha1.ShardingConfig
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(sc), &after); err != nil {
		t.Fatal(err)
	}
	if after.Spec.Sharding.Buckets != 32 || after.ResourceVersion != got.ResourceVersion {
		t.Errorf("a refused update changed the object: buckets %d, resourceVersion %s -> %s", after.Spec.Sharding.Buckets, got.ResourceVersion, after.ResourceVersion)
	}
}

// TestShardingConfigImmutableFields: the scope and the bucket count cannot
// change once set (every bucket would change its meaning while pods serve
// it), while the rest of the spec can.
func TestShardingConfigImmutableFields(t *testing.T) {
	ctx := context.Background()
	sc := validShardingConfig("immutable")
	if err := cluster.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(*ctrlmeshv1alpha1.ShardingConfig)
		want   string
	}{
		{name: "more pods per shard", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Sharding.PodsPerShard = 2
		}},
		{name: "buckets", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Sharding.Buckets = 64
		}, want: "sharding.buckets cannot change: every bucket would change its meaning while pods serve it; delete the ShardingConfig and create it again with the new count"},
		{name: "buckets by dropping sharding", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Sharding = ctrlmeshv1alpha1.ShardingLayout{Buckets: 16}
		}, want: "sharding.buckets cannot change"},
		{name: "scope", mutate: func(sc *ctrlmeshv1alpha1.ShardingConfig) {
			sc.Spec.Scope = ctrlmeshv1alpha1.ScopeFleet
		}, want: "scope cannot change: the pods would switch between per-cluster and fleet-wide buckets while serving them; delete the ShardingConfig and create it again with the new scope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var current ctrlmeshv1alpha1.ShardingConfig
			if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(sc), &current); err != nil {
				t.Fatal(err)
			}
			tt.mutate(&current)
			checkVerdict(t, cluster.Client.Update(ctx, &current), tt.want)
		})
	}
}

// TestShardingConfigNameLength: a name the hub cannot write into its Works'
// labels is refused at admission, not retried by the hub forever.
func TestShardingConfigNameLength(t *testing.T) {
	ctx := context.Background()
	checkVerdict(t, cluster.Client.Create(ctx, validShardingConfig(strings.Repeat("a", 63))), "")
	checkVerdict(t, cluster.Client.Create(ctx, validShardingConfig(strings.Repeat("b", 64))),
		"metadata.name may have at most 63 characters: the hub labels the ShardingConfig's Works with its name, and label values have at most 63")
}

func validShardRoute(name string) *ctrlmeshv1alpha1.ShardRoute {
	sc := validShardingConfig(name)
	return &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster:           "member1",
			RoutingGeneration: 3,
			RulesHash:         "9f2c",
			Scope:             ctrlmeshv1alpha1.ScopePerCluster,
			Buckets:           32,
			Selector:          sc.Spec.Selector,
			Controller:        sc.Spec.Controller,
			Webhook:           sc.Spec.Webhook,
			Limits:            sc.Spec.Limits,
			Shards: []ctrlmeshv1alpha1.RouteShard{
				{ID: "0", Buckets: "0-15", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-0", Address: "10.0.0.1"}}},
				{ID: "1", Buckets: "16-29", PendingBuckets: "30-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-1"}, {Name: "op-2"}}},
				{ID: "canary", Namespaces: []string{"team-a"}, Canary: true, Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-canary"}}},
			},
		},
	}
}

func TestShardRouteValidation(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		mutate func(*ctrlmeshv1alpha1.ShardRoute)
		want   string
	}{
		{name: "valid", mutate: func(*ctrlmeshv1alpha1.ShardRoute) {}},
		{name: "buckets not a power of two", mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.Buckets = 30
		}, want: "buckets must be a power of two from 1 to 4096"},
		{name: "shard with nothing to serve", mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.Shards[0].Buckets = ""
		}, want: "a shard must be given buckets, pending buckets, namespaces or pending namespaces"},
		{name: "malformed buckets", mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.Shards[0].Buckets = "0..15"
		}, want: `spec.shards[0].buckets: Invalid value: "0..15"`},
		{name: "shard id not a DNS label", mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.Shards[0].ID = "Shard 0"
		}, want: `spec.shards[0].id: Invalid value: "Shard 0"`},
		{name: "duplicate shard id", mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.Shards[1].ID = "0"
		}, want: `spec.shards[1]: Duplicate value: {"id":"0"}`},
		{name: "duplicate pod", mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.Shards[1].Pods[1].Name = "op-1"
		}, want: `spec.shards[1].pods[1]: Duplicate value`},
		{name: "routing generation zero", mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.RoutingGeneration = 0
		}, want: "spec.routingGeneration: Invalid value: 0: spec.routingGeneration in body should be greater than or equal to 1"},
		{name: "resource in two limits", mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
			r.Spec.Limits = append(r.Spec.Limits, *r.Spec.Limits[0].DeepCopy())
		}, want: "a resource may be listed in only one limit"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := validShardRoute(fmt.Sprintf("route-%d", i))
			tt.mutate(r)
			checkVerdict(t, cluster.Client.Create(ctx, r), tt.want)
		})
	}
}

func TestShardRouteStatusIsASubresource(t *testing.T) {
	ctx := context.Background()
	r := validShardRoute("status")
	if err := cluster.Client.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	r.Status.ObservedRoutingGeneration = 3
	r.Status.Pods = []ctrlmeshv1alpha1.PodRouteStatus{{Name: "op-0", Ready: true, Shard: "0", AppliedRulesHash: "9f2c"}}
	r.Status.Conditions = []metav1.Condition{{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue, Reason: "Applied", Message: "rules of generation 3 applied", LastTransitionTime: metav1.Now()}}
	// A write to the main resource does not touch status.
	if err := cluster.Client.Update(ctx, r.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	var got ctrlmeshv1alpha1.ShardRoute
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(r), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Pods) != 0 {
		t.Fatalf("status written through the main resource: %+v", got.Status)
	}
	got.Status = r.Status
	if err := cluster.Client.Status().Update(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(r), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.ObservedRoutingGeneration != 3 || got.Status.Pods[0].AppliedRulesHash != "9f2c" {
		t.Errorf("status after the status update: %+v", got.Status)
	}
}

func checkVerdict(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("rejected a valid object: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("accepted; want a rejection saying %q", want)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error is not Invalid: %v", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("rejection message\n  %s\ndoes not contain\n  %s", err, want)
	}
	// CEL's own runtime errors mean a rule ran on input it cannot read; users
	// must see the rule's message instead.
	for _, internal := range []string{"type conversion error", "no such key", "no such overload"} {
		if strings.Contains(err.Error(), internal) {
			t.Fatalf("rejection message leaks a CEL error (%q): %s", internal, err)
		}
	}
	t.Logf("rejected: %s", err)
}
