package shardingconfig

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

func TestSelectedClusters(t *testing.T) {
	all := []state.Cluster{
		cluster("a", true, true, map[string]string{"env": "prod"}),
		cluster("b", true, false, map[string]string{"env": "dev"}),
		cluster("c", false, true, map[string]string{"env": "prod"}),
		cluster("d", true, true, nil),
		cluster("e", false, false, map[string]string{"env": "dev"}),
	}
	tests := []struct {
		name     string
		clusters ctrlmeshv1alpha1.ClusterSelection
		want     []string
	}{{
		name: "nothing",
	}, {
		name:     "by names",
		clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"d", "b"}},
		want:     []string{"b", "d"},
	}, {
		name:     "by names, unaccepted never",
		clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"a", "c", "e"}},
		want:     []string{"a"},
	}, {
		name:     "by names, unknown ones",
		clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"x"}},
	}, {
		name:     "by labels",
		clusters: ctrlmeshv1alpha1.ClusterSelection{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}},
		want:     []string{"a"},
	}, {
		name: "by label expressions, unaccepted never",
		clusters: ctrlmeshv1alpha1.ClusterSelection{Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod", "dev"}},
		}}},
		want: []string{"a", "b"},
	}, {
		name: "by labels, a cluster without any",
		clusters: ctrlmeshv1alpha1.ClusterSelection{Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "env", Operator: metav1.LabelSelectorOpDoesNotExist},
		}}},
		want: []string{"d"},
	}, {
		name: "by names or labels",
		clusters: ctrlmeshv1alpha1.ClusterSelection{
			Names:    []string{"d", "c"},
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": "dev"}},
		},
		want: []string{"b", "d"},
	}, {
		name:     "an empty selector selects every accepted cluster",
		clusters: ctrlmeshv1alpha1.ClusterSelection{Selector: &metav1.LabelSelector{}},
		want:     []string{"a", "b", "d"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := &ctrlmeshv1alpha1.ShardingConfig{Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Clusters: tt.clusters}}
			got, err := selectedClusters(sc, all)
			if err != nil {
				t.Fatalf("selectedClusters: %v", err)
			}
			var names []string
			for _, c := range got {
				if !c.Accepted {
					t.Errorf("cluster %s selected, but not accepted", c.Name)
				}
				names = append(names, c.Name)
			}
			if !reflect.DeepEqual(names, tt.want) {
				t.Errorf("selected %v, want %v", names, tt.want)
			}
		})
	}
}

func TestSelectedClustersBadSelector(t *testing.T) {
	sc := &ctrlmeshv1alpha1.ShardingConfig{Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Clusters: ctrlmeshv1alpha1.ClusterSelection{
		Names: []string{"a"},
		Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "env", Operator: "Near", Values: []string{"prod"}},
		}},
	}}}
	got, err := selectedClusters(sc, []state.Cluster{cluster("a", true, true, nil)})
	if err == nil {
		t.Fatalf("selectedClusters accepted a bad selector, selecting %v", got)
	}
	if want := `clusters.selector: "Near" is not a valid label selector operator`; err.Error() != want {
		t.Errorf("error\n got %s\nwant %s", err, want)
	}
	if got != nil {
		t.Errorf("selected %v with the error, want none", got)
	}
}

func TestDomains(t *testing.T) {
	tests := []struct {
		name    string
		scope   ctrlmeshv1alpha1.ShardingScope
		members map[string]*member
		want    [][]string
	}{{
		name:    "per cluster: one domain per usable cluster",
		scope:   ctrlmeshv1alpha1.ScopePerCluster,
		members: members([]string{"c", "a", "b", "d"}, "b"),
		want:    [][]string{{"a"}, {"c"}, {"d"}},
	}, {
		name:    "per cluster by default",
		members: members([]string{"b", "a"}),
		want:    [][]string{{"a"}, {"b"}},
	}, {
		name:    "per cluster: none usable",
		scope:   ctrlmeshv1alpha1.ScopePerCluster,
		members: members([]string{"a", "b"}, "a", "b"),
	}, {
		name:  "per cluster: an unaccepted cluster is not usable",
		scope: ctrlmeshv1alpha1.ScopePerCluster,
		members: map[string]*member{
			"a": {cluster: cluster("a", false, true, nil)},
			"b": {cluster: cluster("b", true, true, nil)},
		},
		want: [][]string{{"b"}},
	}, {
		name:    "per cluster: no members",
		scope:   ctrlmeshv1alpha1.ScopePerCluster,
		members: map[string]*member{},
	}, {
		name:    "fleet: one domain of the usable clusters",
		scope:   ctrlmeshv1alpha1.ScopeFleet,
		members: members([]string{"c", "a", "b", "d"}, "b"),
		want:    [][]string{{"a", "c", "d"}},
	}, {
		name:  "fleet: an unaccepted cluster is not usable",
		scope: ctrlmeshv1alpha1.ScopeFleet,
		members: map[string]*member{
			"a": {cluster: cluster("a", false, true, nil)},
			"b": {cluster: cluster("b", true, true, nil)},
		},
		want: [][]string{{"b"}},
	}, {
		name:    "fleet: none usable",
		scope:   ctrlmeshv1alpha1.ScopeFleet,
		members: members([]string{"a", "b"}, "a", "b"),
	}, {
		name:    "fleet: no members",
		scope:   ctrlmeshv1alpha1.ScopeFleet,
		members: map[string]*member{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := &ctrlmeshv1alpha1.ShardingConfig{Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Scope: tt.scope}}
			got := domains(sc, tt.members)
			if len(tt.want) == 0 {
				if len(got) != 0 {
					t.Errorf("domains %v, want none", got)
				}
				return
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("domains %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCanaryStep(t *testing.T) {
	steps := []ctrlmeshv1alpha1.CanaryStep{
		{Namespaces: []string{"team-a"}},
		{Buckets: "0-3", Namespaces: []string{"team-a", "team-b"}},
		{Buckets: "0-7"},
	}
	withSteps := func(steps ...ctrlmeshv1alpha1.CanaryStep) *ctrlmeshv1alpha1.CanarySpec {
		return &ctrlmeshv1alpha1.CanarySpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}}, Steps: steps, MinHealthySeconds: 30,
		}
	}
	tests := []struct {
		name           string
		canary         *ctrlmeshv1alpha1.CanarySpec
		step           int32
		wantNil        bool
		wantBuckets    string
		wantNamespaces []string
	}{{
		name:    "no canary",
		wantNil: true,
	}, {
		name:    "no steps",
		canary:  withSteps(),
		step:    1,
		wantNil: true,
	}, {
		name:           "the first step: namespaces only",
		canary:         withSteps(steps...),
		wantNamespaces: []string{"team-a"},
	}, {
		name:           "the step in force",
		canary:         withSteps(steps...),
		step:           1,
		wantBuckets:    "0-3",
		wantNamespaces: []string{"team-a", "team-b"},
	}, {
		name:        "the last step",
		canary:      withSteps(steps...),
		step:        2,
		wantBuckets: "0-7",
	}, {
		name:        "a step past the end is the last",
		canary:      withSteps(steps...),
		step:        7,
		wantBuckets: "0-7",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := &ctrlmeshv1alpha1.ShardingConfig{Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Canary: tt.canary}}
			got, err := canaryStep(sc, scheme32, tt.step)
			if err != nil {
				t.Fatalf("canaryStep: %v", err)
			}
			if tt.wantNil {
				if got != nil {
					t.Errorf("canary step %+v, want none", got)
				}
				return
			}
			if got == nil {
				t.Fatal("no canary step")
			}
			if got.Buckets.Space() != scheme32 {
				t.Errorf("buckets of a space of %d, want 32", got.Buckets.Space().Buckets())
			}
			if s := got.Buckets.String(); s != tt.wantBuckets {
				t.Errorf("buckets %q, want %q", s, tt.wantBuckets)
			}
			if !reflect.DeepEqual(got.Namespaces, tt.wantNamespaces) {
				t.Errorf("namespaces %v, want %v", got.Namespaces, tt.wantNamespaces)
			}
			// The step is a copy of the spec's.
			if len(got.Namespaces) > 0 {
				got.Namespaces[0] = "changed"
				if spec := tt.canary.Steps[min(int(tt.step), len(tt.canary.Steps)-1)]; spec.Namespaces[0] == "changed" {
					t.Error("the canary step shares the spec's namespaces")
				}
			}
		})
	}
}

func TestCanaryStepBadBuckets(t *testing.T) {
	sc := &ctrlmeshv1alpha1.ShardingConfig{Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Canary: &ctrlmeshv1alpha1.CanarySpec{
		Steps: []ctrlmeshv1alpha1.CanaryStep{{Buckets: "0-3"}, {Buckets: "0-40"}},
	}}}
	got, err := canaryStep(sc, scheme32, 1)
	if err == nil {
		t.Fatalf("canaryStep accepted bucket 40 of 32, giving %+v", got)
	}
	if want := `canary step 1 buckets: bucket set "0-40": bucket 40 is out of range: with 32 buckets they are numbered 0 to 31`; err.Error() != want {
		t.Errorf("error\n got %s\nwant %s", err, want)
	}
	if got != nil {
		t.Errorf("canary step %+v with the error, want none", got)
	}
}

// TestLeft: a cluster leaving a Fleet-scope config is done — its Work may
// go — once the rules published to it give its pods no shard and every
// proxy of it enforces them, or once its heartbeat lapsed; never while what
// its proxies enforce is unknown.
func TestLeft(t *testing.T) {
	published := func(generation int64, podsInShard bool) *state.Published {
		r := &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{RoutingGeneration: generation, RulesHash: "h" + string(rune('0'+generation)),
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: "0-7"}}}}
		if podsInShard {
			r.Spec.Shards[0].Pods = []ctrlmeshv1alpha1.RoutePod{{Name: "op-0"}}
		}
		return &state.Published{Revision: state.Revision{Generation: generation, RulesHash: r.Spec.RulesHash},
			History: []state.Revision{{Generation: generation, RulesHash: r.Spec.RulesHash}, {Generation: generation - 1, RulesHash: "h" + string(rune('0'+generation-1))}},
			Route:   r}
	}
	report := func(hashes ...string) *state.Report {
		out := &state.Report{}
		for i, h := range hashes {
			out.Pods = append(out.Pods, state.Pod{Name: "op-" + string(rune('0'+i)), AppliedRulesHash: h})
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		member member
		want   bool
	}{
		{"its pods still in a shard", member{published: published(3, true), report: report("h3")}, false},
		{"no shard, its proxy enforces that", member{published: published(3, false), report: report("h3")}, true},
		{"no shard, its proxy still on the rules before", member{published: published(3, false), report: report("h2")}, false},
		{"no shard, a pod without a proxy", member{published: published(3, false), report: report("h3", "")}, true},
		{"no shard, no report", member{published: published(3, false)}, false},
		{"heartbeat lapsed", member{cluster: state.Cluster{HeartbeatLapsed: true}, published: published(3, true)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.member.leaving = true
			if got := tc.member.left(); got != tc.want {
				t.Errorf("left() = %t, want %t", got, tc.want)
			}
		})
	}
}

// TestOutlived: a member outside the domain whose heartbeat has not lapsed
// (Karmada's Cluster not Ready: nothing applies its Work, and its report
// stays as it was) counts, route.LapseBound after the hub knew its Work to
// carry a generation, as enforcing that generation; the reconcile is asked
// for again when a newer one will be outlived. Usable or lapsed members,
// and members without rules, get nothing of it.
func TestOutlived(t *testing.T) {
	const validity = 5 * time.Second
	bound := route.LapseBound(validity)
	revoked := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // generation 3 published then
	published := &state.Published{Revision: state.Revision{Generation: 3, RulesHash: "h3", Since: revoked},
		History: []state.Revision{{Generation: 3, RulesHash: "h3", Since: revoked}, {Generation: 2, RulesHash: "h2", Since: revoked.Add(-time.Minute)}},
		Route:   &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{RoutingGeneration: 3, RulesHash: "h3"}}}
	notReady := state.Cluster{Name: "c2", Accepted: true, Reason: ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady}
	for _, tc := range []struct {
		name        string
		member      member
		now         time.Time
		wantAtLeast int64
		wantNext    time.Time
	}{
		{"unusable, just revoked: the rules before are outlived", member{cluster: notReady, published: published}, revoked.Add(time.Second), 2, revoked.Add(bound)},
		{"unusable, one instant short of the bound", member{cluster: notReady, published: published}, revoked.Add(bound - time.Nanosecond), 2, revoked.Add(bound)},
		{"unusable, the revocation outlived", member{cluster: notReady, published: published}, revoked.Add(bound), 3, time.Time{}},
		{"leaving", member{cluster: cluster("c2", true, true, nil), published: published, leaving: true}, revoked.Add(bound), 3, time.Time{}},
		{"usable: its proxies acknowledge", member{cluster: cluster("c2", true, true, nil), published: published}, revoked.Add(time.Hour), 0, time.Time{}},
		{"heartbeat lapsed: its pods are gone", member{cluster: state.Cluster{Name: "c2", Accepted: true, HeartbeatLapsed: true}, published: published}, revoked.Add(time.Hour), 0, time.Time{}},
		{"nothing published", member{cluster: notReady}, revoked.Add(time.Hour), 0, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := tc.member.outlived(tc.now, validity)
			if tc.member.enforcesAtLeast != tc.wantAtLeast || !next.Equal(tc.wantNext) {
				t.Errorf("outlived: enforcesAtLeast %d, next %v; want %d, %v", tc.member.enforcesAtLeast, next, tc.wantAtLeast, tc.wantNext)
			}
		})
	}
}

// TestAcksOfOutlivedRules: c2's Cluster is not Ready and its report stale
// (its pod acknowledges generation 2); generation 3 revoked its buckets,
// pending for c1's shard, whose pod enforces 3. The grant waits for c2's
// pod until c2 has outlived generation 3, then goes through.
func TestAcksOfOutlivedRules(t *testing.T) {
	revoked := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	history := []state.Revision{{Generation: 3, RulesHash: "h3", Since: revoked}, {Generation: 2, RulesHash: "h2", Since: revoked.Add(-time.Minute)}}
	shard := tableShard(t, "0", "0-15", "16-31", pods("c1", "a-0")...)
	shard.Cluster = "c1"
	published := route.Table{Generation: 3, Shards: []route.Shard{shard}}
	desired := placement.Placement{Space: scheme32, Shards: []placement.Shard{{ID: "0", Cluster: "c1", Pods: pods("c1", "a-0"), Buckets: mustSet(t, "0-31")}}}
	for _, tc := range []struct {
		name      string
		after     time.Duration
		wantGrant bool
	}{
		{"before the bound", route.LapseBound(5*time.Second) - time.Millisecond, false},
		{"at the bound", route.LapseBound(5 * time.Second), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := map[string]*member{
				"c1": {cluster: cluster("c1", true, true, nil), published: &state.Published{Revision: history[0], History: history},
					report: &state.Report{Pods: []state.Pod{{Name: "a-0", Ready: true, AppliedRulesHash: "h3"}}}},
				"c2": {cluster: state.Cluster{Name: "c2", Accepted: true, Reason: ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady},
					published: &state.Published{Revision: history[0], History: history},
					report:    &state.Report{Pods: []state.Pod{{Name: "b-0", Ready: true, AppliedRulesHash: "h2"}}, Leaders: []state.Leader{{Shard: "1", Pod: "b-0"}}}},
			}
			ms["c2"].outlived(revoked.Add(tc.after), 5*time.Second)
			step, err := placement.Handover(desired, published, acks(published, []string{"c1", "c2"}, ms))
			if err != nil {
				t.Fatal(err)
			}
			granted := step.Changed && step.Table.Shards[0].Buckets.String() == "0-31" && step.Table.Shards[0].PendingBuckets.Len() == 0
			if granted != tc.wantGrant || (!tc.wantGrant && step.Changed) {
				t.Errorf("granted %t, want %t: step %+v", granted, tc.wantGrant, step)
			}
		})
	}
}

// TestSubsetRules: the subsets' rules, in the spec's order, their bucket
// strings parsed in the config's space; a bad string is named by subset.
func TestSubsetRules(t *testing.T) {
	sc := &ctrlmeshv1alpha1.ShardingConfig{Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Subsets: []ctrlmeshv1alpha1.Subset{
		{Name: "v2", Buckets: "0-3", Namespaces: []string{"team-a"}},
		{Name: "blue", Namespaces: []string{"team-b"}},
	}}}
	got, err := subsetRules(sc, scheme32)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "v2" || got[0].Buckets.String() != "0-3" || !slices.Equal(got[0].Namespaces, []string{"team-a"}) ||
		got[1].Name != "blue" || !got[1].Buckets.IsEmpty() || got[1].Buckets.Space() != scheme32 {
		t.Fatalf("subset rules %+v", got)
	}
	sc.Spec.Subsets[0].Namespaces[0] = "changed"
	if got[0].Namespaces[0] == "changed" {
		t.Error("the rules share the spec's namespaces")
	}
	sc.Spec.Subsets[1].Buckets = "40"
	if _, err := subsetRules(sc, scheme32); err == nil || !strings.HasPrefix(err.Error(), `subset "blue" buckets: `) {
		t.Errorf("bucket 40 of 32: %v, want an error naming subset blue", err)
	}
}

// TestResolvedSubsets: the namespaces a member's agent found for each
// subset's namespace rules are added to it, except those named by name
// elsewhere or found for an earlier subset; more than a shard can serve is
// an invalid spec naming the subset.
func TestResolvedSubsets(t *testing.T) {
	none, _ := scheme32.NewSet()
	subsets := []placement.Subset{
		{Name: "v2", Buckets: none, Namespaces: []string{"team-a"}},
		{Name: "blue", Buckets: none},
	}
	canary := &placement.CanaryStep{Buckets: none, Namespaces: []string{"team-c"}}
	got, err := resolvedSubsets(subsets, canary, map[string][]string{
		"v2":   {"canary-1", "team-c"},
		"blue": {"canary-1", "canary-2", "team-a"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got[0].Namespaces, []string{"team-a", "canary-1"}) || !slices.Equal(got[1].Namespaces, []string{"canary-2"}) {
		t.Fatalf("resolved %+v", got)
	}
	if !slices.Equal(subsets[0].Namespaces, []string{"team-a"}) {
		t.Error("the spec's subsets were changed")
	}
	var many []string
	for i := range maxShardNamespaces + 1 {
		many = append(many, "ns-"+strconv.Itoa(i))
	}
	if _, err := resolvedSubsets(subsets, nil, map[string][]string{"blue": many}); err == nil || !strings.Contains(err.Error(), `subset "blue" would serve 65 namespaces, at most 64`) {
		t.Errorf("65 namespaces: %v", err)
	}
}
