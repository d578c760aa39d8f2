package printers

import (
	"bytes"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

var since = metav1.NewTime(time.Date(2026, 11, 27, 5, 30, 12, 0, time.UTC))

// TestShardingConfigSubsets prints the subsets table: a subset served in
// one cluster, one served in two, one no shard serves yet.
func TestShardingConfigSubsets(t *testing.T) {
	for _, tc := range []struct {
		name    string
		subsets []ctrlmeshv1alpha1.Subset
		placed  []ctrlmeshv1alpha1.ShardPlacement
		want    string
	}{{
		name: "no subsets, no table",
		placed: []ctrlmeshv1alpha1.ShardPlacement{{Shard: "0", Cluster: "member1", Pods: []string{"p-0"}, Buckets: "0-31",
			State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy}},
		want: `ShardingConfig ops/op: generation 1, observed 1; 1 clusters, 1 shards, 1 ready
SHARD  CLUSTER  PODS  LEADER  BUCKETS  NAMESPACES  CANARY  STATE    HEALTH
0      member1  p-0   -       0-31     -           -       Serving  Healthy
`,
	}, {
		name: "served, served in two clusters, not served",
		subsets: []ctrlmeshv1alpha1.Subset{
			{Name: "v2", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"version": "v2"}}, Buckets: "0-3", Namespaces: []string{"team-a"}},
			{Name: "gold", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}},
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}, NamespaceRegex: "^gold-"},
			{Name: "v3", Selector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "version", Operator: metav1.LabelSelectorOpIn, Values: []string{"v3"}}}},
				Namespaces: []string{"team-b"}},
		},
		placed: []ctrlmeshv1alpha1.ShardPlacement{
			{Shard: "0", Cluster: "member1", Pods: []string{"p-0"}, Buckets: "4-31", State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
			{Shard: "v2", Cluster: "member1", Subset: "v2", Pods: []string{"p-v2"}, Buckets: "0-3", Namespaces: []string{"team-a"},
				State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
			{Shard: "gold", Cluster: "member1", Subset: "gold", Pods: []string{"p-gold"}, Namespaces: []string{"gold-1", "gold-2"},
				State: ctrlmeshv1alpha1.ShardPending, Health: ctrlmeshv1alpha1.ShardHealthy},
			{Shard: "gold", Cluster: "member2", Subset: "gold", Pods: []string{"q-gold-0", "q-gold-1"},
				State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
		},
		want: `ShardingConfig ops/op: generation 1, observed 1; 1 clusters, 4 shards, 1 ready
SHARD  CLUSTER  PODS               LEADER  BUCKETS  NAMESPACES     CANARY  STATE    HEALTH
0      member1  p-0                -       4-31     -              -       Serving  Healthy
v2     member1  p-v2               -       0-3      team-a         -       Serving  Healthy
gold   member1  p-gold             -       -        gold-1,gold-2  -       Pending  Healthy
gold   member2  q-gold-0,q-gold-1  -       -        -              -       Serving  Healthy
SUBSET  SELECTOR         RULES                                               CLUSTER  PODS               BUCKETS  NAMESPACES     STATE
v2      version=v2       buckets 0-3; namespaces team-a                      member1  p-v2               0-3      team-a         Serving
gold    tier=gold        namespaceSelector tier=gold; namespaceRegex ^gold-  member1  p-gold             -        gold-1,gold-2  Pending
gold    tier=gold        namespaceSelector tier=gold; namespaceRegex ^gold-  member2  q-gold-0,q-gold-1  -        -              Serving
v3      version in (v3)  namespaces team-b                                   -        -                  -        -              -
`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			sc := &ctrlmeshv1alpha1.ShardingConfig{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "op", Generation: 1},
				Spec:       ctrlmeshv1alpha1.ShardingConfigSpec{Subsets: tc.subsets},
				Status: ctrlmeshv1alpha1.ShardingConfigStatus{ObservedGeneration: 1, Clusters: 1, Shards: int32(len(tc.placed)), ReadyShards: 1,
					Placement: tc.placed},
			}
			var out bytes.Buffer
			if err := ShardingConfig(&out, sc); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("printed\n%s\nwant\n%s", out.String(), tc.want)
			}
		})
	}
}

// TestPolicies prints the traffic policies: none; a CircuitBreaker with a
// breaker open in one cluster and all closed in the other, not yet
// enforced everywhere; one no cluster reports; a FaultInjection.
func TestPolicies(t *testing.T) {
	enforced := func(status metav1.ConditionStatus, reason, message string) []metav1.Condition {
		return []metav1.Condition{{Type: ctrlmeshv1alpha1.ConditionEnforced, Status: status, Reason: reason, Message: message}}
	}
	meta := func(name string, generation int64) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "ops", Name: name, Generation: generation}
	}
	withBreaker := ctrlmeshv1alpha1.CircuitBreakerSpec{Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "writes"}}}
	for _, tc := range []struct {
		name     string
		breakers []ctrlmeshv1alpha1.CircuitBreaker
		faults   []ctrlmeshv1alpha1.FaultInjection
		want     string
	}{{
		name: "none",
		want: "no traffic policies\n",
	}, {
		name: "a breaker open in one cluster, a generation pending",
		breakers: []ctrlmeshv1alpha1.CircuitBreaker{{ObjectMeta: meta("guard", 2), Spec: withBreaker, Status: ctrlmeshv1alpha1.PolicyStatus{
			ObservedGeneration: 2,
			Conditions:         enforced(metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonPolicyPending, "not every proxy enforces generation 2 yet in: member2 (1 of 2 proxies)"),
			Clusters: []ctrlmeshv1alpha1.PolicyClusterStatus{
				{Cluster: "member1", Proxies: 2, Enforcing: 2, Breakers: []ctrlmeshv1alpha1.ClusterBreakerStatus{
					{Name: "reads", State: ctrlmeshv1alpha1.BreakerHalfOpen, Pods: []string{"p-1"}, LastTransitionTime: since},
					{Name: "writes", State: ctrlmeshv1alpha1.BreakerOpen, Pods: []string{"p-0", "p-1"}, LastTransitionTime: since},
				}},
				{Cluster: "member2", Proxies: 2, Enforcing: 1},
			},
		}}},
		want: `CircuitBreaker ops/guard: generation 2, observed 2
Enforced=False (PolicyPending) not every proxy enforces generation 2 yet in: member2 (1 of 2 proxies)
CLUSTER  ENFORCING  BREAKER  STATE     PODS     SINCE
member1  2/2        reads    HalfOpen  p-1      2026-11-27T05:30:12Z
member1  2/2        writes   Open      p-0,p-1  2026-11-27T05:30:12Z
member2  1/2        all      Closed    -        -
`,
	}, {
		name: "unreported, and a FaultInjection enforced",
		breakers: []ctrlmeshv1alpha1.CircuitBreaker{{ObjectMeta: meta("limits", 1), Status: ctrlmeshv1alpha1.PolicyStatus{
			Conditions: enforced(metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonShardingConfigNotFound, "ShardingConfig ops/op does not exist"),
		}}},
		faults: []ctrlmeshv1alpha1.FaultInjection{{ObjectMeta: meta("chaos", 3), Status: ctrlmeshv1alpha1.PolicyStatus{
			ObservedGeneration: 3,
			Conditions:         enforced(metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonPolicyEnforced, "every proxy in 2 member clusters enforces generation 3"),
			Clusters:           []ctrlmeshv1alpha1.PolicyClusterStatus{{Cluster: "member1", Proxies: 2, Enforcing: 2}, {Cluster: "member2", Proxies: 3, Enforcing: 3}},
		}}},
		want: `CircuitBreaker ops/limits: generation 1, observed 0
Enforced=False (ShardingConfigNotFound) ShardingConfig ops/op does not exist
no member cluster reports it
FaultInjection ops/chaos: generation 3, observed 3
Enforced=True (PolicyEnforced) every proxy in 2 member clusters enforces generation 3
CLUSTER  ENFORCING
member1  2/2
member2  3/3
`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := Policies(&out, tc.breakers, tc.faults); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("printed\n%s\nwant\n%s", out.String(), tc.want)
			}
		})
	}
}
