package shardingconfig

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

// readyPods are ready, non-canary candidate pods of one cluster.
func readyPods(cluster string, names ...string) []placement.Pod {
	var out []placement.Pod
	for _, id := range pods(cluster, names...) {
		out = append(out, placement.Pod{PodID: id, Ready: true})
	}
	return out
}

// refusing is a member whose agent reports the rules not applied.
func refusing(name, message string) *member {
	return &member{
		cluster: cluster(name, true, true, nil),
		report: &state.Report{Cluster: name, RulesApplied: &metav1.Condition{
			Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonInvalidRules, Message: message,
		}},
	}
}

// applying is a member whose agent reports the rules applied.
func applying(name string) *member {
	m := refusing(name, "rules of generation 3 applied")
	m.report.RulesApplied.Status, m.report.RulesApplied.Reason = metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonRulesValid
	return m
}

func TestDegraded(t *testing.T) {
	settled := func(clusters ...string) domainOutcome {
		var candidates []placement.Pod
		for _, c := range clusters {
			candidates = append(candidates, readyPods(c, "p0")...)
		}
		return domainOutcome{clusters: clusters, pods: candidates, step: placement.Step{Table: route.Table{
			Generation: 3, Shards: []route.Shard{tableShard(t, "0", "0-31", "", pods(clusters[0], "p0")...)},
		}}}
	}
	handingOver := func(clusters ...string) domainOutcome {
		d := settled(clusters...)
		d.step.Table.Generation = 4
		d.step.Table.Shards = []route.Shard{
			tableShard(t, "0", "0-7", "", pods(clusters[0], "p0")...),
			tableShard(t, "1", "16-31", "8-15", pods(clusters[0], "p1")...),
		}
		d.step.WaitingFor = pods(clusters[0], "p0", "p1")
		return d
	}
	namespaceHandingOver := func(clusters ...string) domainOutcome {
		d := settled(clusters...)
		canary := tableShard(t, "canary", "", "", pods(clusters[0], "z")...)
		canary.Canary, canary.PendingNamespaces = true, []string{"team-a"}
		d.step.Table.Shards = append(d.step.Table.Shards, canary)
		d.step.WaitingFor = pods(clusters[0], "p0")
		return d
	}
	withPods := func(d domainOutcome, candidates ...placement.Pod) domainOutcome {
		d.pods = candidates
		return d
	}
	with := func(ms map[string]*member, name string, m *member) map[string]*member {
		ms[name] = m
		return ms
	}
	tests := []struct {
		name        string
		out         *outcome
		wantReason  string
		wantMessage string
	}{{
		name:        "no clusters selected",
		out:         &outcome{members: map[string]*member{}},
		wantReason:  ctrlmeshv1alpha1.ReasonNoClusters,
		wantMessage: "no accepted member cluster matches spec.clusters",
	}, {
		name: "no clusters selected comes first",
		out: &outcome{members: map[string]*member{}, domains: []domainOutcome{
			withPods(settled("a")), handingOver("b"),
		}},
		wantReason:  ctrlmeshv1alpha1.ReasonNoClusters,
		wantMessage: "no accepted member cluster matches spec.clusters",
	}, {
		name: "a member refusing the rules is an invalid spec, before unavailable clusters",
		out: &outcome{
			members: with(with(members([]string{"a", "c"}, "a"), "d", refusing("d", "label mode cannot serve namespaces team-a")), "b", applying("b")),
			domains: []domainOutcome{withPods(settled("b")), handingOver("c")},
		},
		wantReason:  ctrlmeshv1alpha1.ReasonInvalidSpec,
		wantMessage: "cluster d refuses the rules: label mode cannot serve namespaces team-a",
	}, {
		name: "the first member refusing the rules by name",
		out: &outcome{
			members: with(with(members(nil), "z", refusing("z", "z's reason")), "m", refusing("m", "m's reason")),
			domains: []domainOutcome{settled("m", "z")},
		},
		wantReason:  ctrlmeshv1alpha1.ReasonInvalidSpec,
		wantMessage: "cluster m refuses the rules: m's reason",
	}, {
		name: "unavailable clusters, before domains without candidates",
		out: &outcome{
			members: with(members([]string{"a", "c", "d"}, "d", "a"), "b", applying("b")),
			domains: []domainOutcome{withPods(settled("b")), withPods(settled("c")), handingOver("c")},
		},
		wantReason:  ctrlmeshv1alpha1.ReasonClusterUnavailable,
		wantMessage: "clusters not usable keep their last rules and get no new ones (see each ManagedCluster's conditions): a, d",
	}, {
		name: "an unaccepted member is unavailable",
		out: &outcome{
			members: with(members([]string{"a"}), "b", &member{cluster: cluster("b", false, true, nil)}),
			domains: []domainOutcome{settled("a")},
		},
		wantReason:  ctrlmeshv1alpha1.ReasonClusterUnavailable,
		wantMessage: "clusters not usable keep their last rules and get no new ones (see each ManagedCluster's conditions): b (not accepted)",
	}, {
		name: "an unavailable member with its reason",
		out: &outcome{
			members: with(members([]string{"a"}), "b", &member{cluster: state.Cluster{Name: "b", Accepted: true, Reason: ctrlmeshv1alpha1.ReasonKarmadaClusterNotFound}}),
			domains: []domainOutcome{settled("a")},
		},
		wantReason:  ctrlmeshv1alpha1.ReasonClusterUnavailable,
		wantMessage: "clusters not usable keep their last rules and get no new ones (see each ManagedCluster's conditions): b (KarmadaClusterNotFound)",
	}, {
		name: "a domain without pods, before a pending handover",
		out: &outcome{
			members: members([]string{"a", "b", "c"}),
			domains: []domainOutcome{handingOver("a"), withPods(settled("b", "c"))},
		},
		wantReason:  ctrlmeshv1alpha1.ReasonNoCandidatePods,
		wantMessage: "no ready pod matches the selector in b, c",
	}, {
		name: "a domain with unready, canary and subset pods only",
		out: &outcome{
			members: members([]string{"a", "b"}),
			domains: []domainOutcome{settled("a"), withPods(settled("b"),
				placement.Pod{PodID: route.PodID{Cluster: "b", Name: "unready"}},
				placement.Pod{PodID: route.PodID{Cluster: "b", Name: "canary"}, Ready: true, Canary: true},
				placement.Pod{PodID: route.PodID{Cluster: "b", Name: "v2"}, Ready: true, Subset: "v2"},
			)},
		},
		wantReason:  ctrlmeshv1alpha1.ReasonNoCandidatePods,
		wantMessage: "no ready pod matches the selector in b",
	}, {
		name: "buckets handed over",
		out: &outcome{
			members: with(members([]string{"a"}), "b", applying("b")),
			domains: []domainOutcome{settled("a"), handingOver("b")},
		},
		wantReason:  ctrlmeshv1alpha1.ReasonHandoverPending,
		wantMessage: "buckets move in b once these proxies enforce generation 4: b/p0, b/p1",
	}, {
		name: "namespaces handed over in a fleet",
		out: &outcome{
			members: members([]string{"a", "b"}),
			domains: []domainOutcome{namespaceHandingOver("a", "b")},
		},
		wantReason:  ctrlmeshv1alpha1.ReasonHandoverPending,
		wantMessage: "buckets move in a, b once these proxies enforce generation 3: a/p0",
	}, {
		name: "a handover over 1000 members names ten of them and ten pods",
		out: func() *outcome {
			var names []string
			for i := range 1000 {
				names = append(names, fmt.Sprintf("m%04d", i))
			}
			d := handingOver(names...)
			d.step.WaitingFor = nil
			for _, name := range names {
				d.step.WaitingFor = append(d.step.WaitingFor, pods(name, "p0", "p1", "p2", "p3")...)
			}
			return &outcome{members: members(names), domains: []domainOutcome{d}}
		}(),
		wantReason: ctrlmeshv1alpha1.ReasonHandoverPending,
		wantMessage: "buckets move in m0000, m0001, m0002, m0003, m0004, m0005, m0006, m0007, m0008, m0009 and 990 more once these proxies enforce generation 4: " +
			"m0000/p0, m0000/p1, m0000/p2, m0000/p3, m0001/p0, m0001/p1, m0001/p2, m0001/p3, m0002/p0, m0002/p1 and 3990 more",
	}, {
		name: "nothing amiss",
		out: &outcome{
			members: with(members([]string{"a", "c"}), "b", applying("b")),
			domains: []domainOutcome{settled("a"), settled("b"), settled("c")},
		},
	}, {
		name: "nothing amiss in a fleet, the pods in one cluster",
		out: &outcome{
			members: members([]string{"a", "b"}),
			domains: []domainOutcome{withPods(settled("a", "b"), readyPods("b", "p0")...)},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := &ctrlmeshv1alpha1.ShardingConfig{}
			reason, message := degraded(sc, tt.out)
			if reason != tt.wantReason || message != tt.wantMessage {
				t.Fatalf("degraded: %q %q\nwant %q %q", reason, message, tt.wantReason, tt.wantMessage)
			}
			if reason == "" {
				return
			}
			// As writeStatus reports it.
			var status ctrlmeshv1alpha1.ShardingConfigStatus
			setConditions(&status, metav1.ConditionFalse, reason, message, 2)
			want := []metav1.Condition{
				{Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: message, ObservedGeneration: 2},
				{Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: reason, Message: message, ObservedGeneration: 2},
			}
			if got := conditionsWithoutTimes(status.Conditions); !reflect.DeepEqual(got, want) {
				t.Errorf("conditions\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// conditionsWithoutTimes drops the transition times meta.SetStatusCondition
// sets from the clock.
func conditionsWithoutTimes(in []metav1.Condition) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(in))
	for _, c := range in {
		c.LastTransitionTime = metav1.Time{}
		out = append(out, c)
	}
	return out
}

func TestSetConditions(t *testing.T) {
	const asExpected = "nothing keeps the ShardingConfig from being served"
	earlier := metav1.NewTime(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	before := []metav1.Condition{
		{Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonClusterUnavailable, Message: "old", ObservedGeneration: 1, LastTransitionTime: earlier},
		{Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonClusterUnavailable, Message: "old", ObservedGeneration: 1, LastTransitionTime: earlier},
	}
	tests := []struct {
		name    string
		before  []metav1.Condition
		ready   metav1.ConditionStatus
		reason  string
		message string
		want    []metav1.Condition
	}{{
		name:  "ready",
		ready: metav1.ConditionTrue, reason: ctrlmeshv1alpha1.ReasonAllShardsServing, message: "4 shards in 2 clusters serve every bucket",
		want: []metav1.Condition{
			{Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonAllShardsServing, Message: "4 shards in 2 clusters serve every bucket", ObservedGeneration: 3},
			{Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonAsExpected, Message: asExpected, ObservedGeneration: 3},
		},
	}, {
		name:  "shards starting are not degraded",
		ready: metav1.ConditionFalse, reason: ctrlmeshv1alpha1.ReasonShardsNotReady, message: "1 of 4 shards serve and are healthy",
		want: []metav1.Condition{
			{Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonShardsNotReady, Message: "1 of 4 shards serve and are healthy", ObservedGeneration: 3},
			{Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonAsExpected, Message: asExpected, ObservedGeneration: 3},
		},
	}, {
		name:  "an invalid spec",
		ready: metav1.ConditionFalse, reason: ctrlmeshv1alpha1.ReasonInvalidSpec, message: "sharding.buckets: bad",
		want: []metav1.Condition{
			{Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonInvalidSpec, Message: "sharding.buckets: bad", ObservedGeneration: 3},
			{Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonInvalidSpec, Message: "sharding.buckets: bad", ObservedGeneration: 3},
		},
	}, {
		name:   "degraded no more",
		before: before,
		ready:  metav1.ConditionTrue, reason: ctrlmeshv1alpha1.ReasonAllShardsServing, message: "2 shards in 1 clusters serve every bucket",
		want: []metav1.Condition{
			{Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonAllShardsServing, Message: "2 shards in 1 clusters serve every bucket", ObservedGeneration: 3},
			{Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonAsExpected, Message: asExpected, ObservedGeneration: 3},
		},
	}, {
		name:   "degraded for another reason",
		before: before,
		ready:  metav1.ConditionFalse, reason: ctrlmeshv1alpha1.ReasonHandoverPending, message: "buckets move",
		want: []metav1.Condition{
			{Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonHandoverPending, Message: "buckets move", ObservedGeneration: 3, LastTransitionTime: earlier},
			{Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonHandoverPending, Message: "buckets move", ObservedGeneration: 3, LastTransitionTime: earlier},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status := ctrlmeshv1alpha1.ShardingConfigStatus{Conditions: append([]metav1.Condition(nil), tt.before...)}
			setConditions(&status, tt.ready, tt.reason, tt.message, 3)
			got := status.Conditions
			for i, c := range got {
				if c.LastTransitionTime.IsZero() {
					t.Errorf("condition %s has no transition time", c.Type)
				}
				// A condition whose status changed moved on; the others
				// keep the time they had.
				if c.LastTransitionTime.Equal(&earlier) != !tt.want[i].LastTransitionTime.IsZero() {
					t.Errorf("condition %s changed at %v", c.Type, c.LastTransitionTime)
				}
			}
			want := conditionsWithoutTimes(tt.want)
			if got := conditionsWithoutTimes(got); !reflect.DeepEqual(got, want) {
				t.Errorf("conditions\n got %+v\nwant %+v", got, want)
			}
			if c := meta.FindStatusCondition(status.Conditions, ctrlmeshv1alpha1.ConditionReady); c == nil || c.Status != tt.ready {
				t.Errorf("Ready %+v, want %s", c, tt.ready)
			}
		})
	}
}

func TestAdvanceCanary(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: t0.Add(d)} }
	spec := func(minHealthySeconds int32) *ctrlmeshv1alpha1.CanarySpec {
		return &ctrlmeshv1alpha1.CanarySpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
			Steps: []ctrlmeshv1alpha1.CanaryStep{
				{Namespaces: []string{"team-a"}}, {Buckets: "0-3"}, {Buckets: "0-7"},
			},
			MinHealthySeconds: minHealthySeconds,
		}
	}
	shard := func(id string, canary bool, state ctrlmeshv1alpha1.ShardState, health ctrlmeshv1alpha1.ShardHealth) ctrlmeshv1alpha1.ShardPlacement {
		return ctrlmeshv1alpha1.ShardPlacement{Shard: id, Cluster: "a", Canary: canary, State: state, Health: health}
	}
	serving := shard("0", false, ctrlmeshv1alpha1.ShardServing, ctrlmeshv1alpha1.ShardHealthy)
	healthy := []ctrlmeshv1alpha1.ShardPlacement{serving, shard("canary", true, ctrlmeshv1alpha1.ShardServing, ctrlmeshv1alpha1.ShardHealthy)}
	tests := []struct {
		name        string
		canary      *ctrlmeshv1alpha1.CanarySpec
		placement   []ctrlmeshv1alpha1.ShardPlacement
		before      *ctrlmeshv1alpha1.CanaryStatus
		now         time.Duration
		want        *ctrlmeshv1alpha1.CanaryStatus
		wantRequeue time.Duration
		wantEvents  []string
	}{{
		name:      "no canary",
		placement: healthy,
		before:    &ctrlmeshv1alpha1.CanaryStatus{Step: 1, HealthySince: at(0)},
		now:       time.Hour,
	}, {
		name:      "the canary shard is not placed yet",
		canary:    spec(30),
		placement: []ctrlmeshv1alpha1.ShardPlacement{serving},
		want:      &ctrlmeshv1alpha1.CanaryStatus{},
	}, {
		name:      "becomes healthy",
		canary:    spec(30),
		placement: healthy,
		now:       5 * time.Second,
		want:      &ctrlmeshv1alpha1.CanaryStatus{HealthySince: at(5 * time.Second)},
		// minHealthySeconds from now.
		wantRequeue: 30 * time.Second,
	}, {
		name:        "healthy, not long enough",
		canary:      spec(30),
		placement:   healthy,
		before:      &ctrlmeshv1alpha1.CanaryStatus{Step: 1, HealthySince: at(0)},
		now:         10 * time.Second,
		want:        &ctrlmeshv1alpha1.CanaryStatus{Step: 1, HealthySince: at(0)},
		wantRequeue: 20 * time.Second,
	}, {
		name:      "healthy, not quite long enough: look again in a second at the least",
		canary:    spec(30),
		placement: healthy,
		before:    &ctrlmeshv1alpha1.CanaryStatus{Step: 1, HealthySince: at(0)},
		now:       29*time.Second + 700*time.Millisecond,
		want:      &ctrlmeshv1alpha1.CanaryStatus{Step: 1, HealthySince: at(0)},
		// 300ms are left.
		wantRequeue: time.Second,
	}, {
		name:       "healthy long enough: the next step",
		canary:     spec(30),
		placement:  healthy,
		before:     &ctrlmeshv1alpha1.CanaryStatus{Step: 0, HealthySince: at(0)},
		now:        30 * time.Second,
		want:       &ctrlmeshv1alpha1.CanaryStatus{Step: 1},
		wantEvents: []string{"Normal CanaryAdvanced The canary shard was healthy for 30s: step 2 of 3"},
	}, {
		name:       "healthy for longer: still one step",
		canary:     spec(30),
		placement:  healthy,
		before:     &ctrlmeshv1alpha1.CanaryStatus{Step: 1, HealthySince: at(0)},
		now:        time.Hour,
		want:       &ctrlmeshv1alpha1.CanaryStatus{Step: 2},
		wantEvents: []string{"Normal CanaryAdvanced The canary shard was healthy for 30s: step 3 of 3"},
	}, {
		name:       "no healthy period: the next step at once",
		canary:     spec(0),
		placement:  healthy,
		before:     &ctrlmeshv1alpha1.CanaryStatus{Step: 0},
		now:        time.Minute,
		want:       &ctrlmeshv1alpha1.CanaryStatus{Step: 1},
		wantEvents: []string{"Normal CanaryAdvanced The canary shard was healthy for 0s: step 2 of 3"},
	}, {
		name:      "the last step stays",
		canary:    spec(30),
		placement: healthy,
		before:    &ctrlmeshv1alpha1.CanaryStatus{Step: 2, HealthySince: at(0)},
		now:       time.Hour,
		want:      &ctrlmeshv1alpha1.CanaryStatus{Step: 2, HealthySince: at(0)},
	}, {
		name:      "the last step: healthy since now",
		canary:    spec(30),
		placement: healthy,
		before:    &ctrlmeshv1alpha1.CanaryStatus{Step: 2},
		now:       time.Hour,
		want:      &ctrlmeshv1alpha1.CanaryStatus{Step: 2, HealthySince: at(time.Hour)},
	}, {
		name:      "a step past the last stays",
		canary:    spec(30),
		placement: healthy,
		before:    &ctrlmeshv1alpha1.CanaryStatus{Step: 5, HealthySince: at(0)},
		now:       time.Hour,
		want:      &ctrlmeshv1alpha1.CanaryStatus{Step: 5, HealthySince: at(0)},
	}, {
		name:      "unhealthy: the healthy period starts over",
		canary:    spec(30),
		placement: []ctrlmeshv1alpha1.ShardPlacement{serving, shard("canary", true, ctrlmeshv1alpha1.ShardServing, ctrlmeshv1alpha1.ShardUnhealthy)},
		before:    &ctrlmeshv1alpha1.CanaryStatus{Step: 1, HealthySince: at(0)},
		now:       time.Hour,
		want:      &ctrlmeshv1alpha1.CanaryStatus{Step: 1},
	}, {
		name:      "health unknown",
		canary:    spec(30),
		placement: []ctrlmeshv1alpha1.ShardPlacement{serving, shard("canary", true, ctrlmeshv1alpha1.ShardServing, ctrlmeshv1alpha1.ShardHealthUnknown)},
		before:    &ctrlmeshv1alpha1.CanaryStatus{Step: 1, HealthySince: at(0)},
		now:       time.Hour,
		want:      &ctrlmeshv1alpha1.CanaryStatus{Step: 1},
	}, {
		name:      "healthy but pending",
		canary:    spec(30),
		placement: []ctrlmeshv1alpha1.ShardPlacement{serving, shard("canary", true, ctrlmeshv1alpha1.ShardPending, ctrlmeshv1alpha1.ShardHealthy)},
		before:    &ctrlmeshv1alpha1.CanaryStatus{Step: 1, HealthySince: at(0)},
		now:       time.Hour,
		want:      &ctrlmeshv1alpha1.CanaryStatus{Step: 1},
	}, {
		name:      "only a shard that is no canary is healthy",
		canary:    spec(30),
		placement: []ctrlmeshv1alpha1.ShardPlacement{serving, shard("canary", true, ctrlmeshv1alpha1.ShardDraining, ctrlmeshv1alpha1.ShardHealthy)},
		before:    &ctrlmeshv1alpha1.CanaryStatus{Step: 0, HealthySince: at(0)},
		now:       time.Hour,
		want:      &ctrlmeshv1alpha1.CanaryStatus{Step: 0},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recorder := record.NewFakeRecorder(10)
			r := &Reconciler{Recorder: recorder}
			sc := &ctrlmeshv1alpha1.ShardingConfig{Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Canary: tt.canary}}
			status := &ctrlmeshv1alpha1.ShardingConfigStatus{Placement: tt.placement, Canary: tt.before.DeepCopy()}
			requeue := r.advanceCanary(sc, status, canaryHealthy(tt.placement), t0.Add(tt.now))
			if requeue != tt.wantRequeue {
				t.Errorf("requeue after %v, want %v", requeue, tt.wantRequeue)
			}
			if !reflect.DeepEqual(status.Canary, tt.want) {
				t.Errorf("canary status %s, want %s", describeCanary(status.Canary), describeCanary(tt.want))
			}
			close(recorder.Events)
			var events []string
			for e := range recorder.Events {
				events = append(events, e)
			}
			if !reflect.DeepEqual(events, tt.wantEvents) {
				t.Errorf("events %q, want %q", events, tt.wantEvents)
			}
		})
	}
}

func describeCanary(c *ctrlmeshv1alpha1.CanaryStatus) string {
	switch {
	case c == nil:
		return "none"
	case c.HealthySince == nil:
		return fmt.Sprintf("{step %d, not healthy}", c.Step)
	}
	return fmt.Sprintf("{step %d, healthy since %s}", c.Step, c.HealthySince.UTC().Format(time.RFC3339Nano))
}

// TestAdvanceCanaryOverTime drives one canary through its steps, as
// successive reconciles would.
func TestAdvanceCanaryOverTime(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	recorder := record.NewFakeRecorder(10)
	r := &Reconciler{Recorder: recorder}
	sc := &ctrlmeshv1alpha1.ShardingConfig{Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Canary: &ctrlmeshv1alpha1.CanarySpec{
		Steps:             []ctrlmeshv1alpha1.CanaryStep{{Buckets: "0"}, {Buckets: "0-1"}},
		MinHealthySeconds: 60,
	}}}
	canary := func(health ctrlmeshv1alpha1.ShardHealth) []ctrlmeshv1alpha1.ShardPlacement {
		return []ctrlmeshv1alpha1.ShardPlacement{{Shard: "canary", Canary: true, State: ctrlmeshv1alpha1.ShardServing, Health: health}}
	}
	status := &ctrlmeshv1alpha1.ShardingConfigStatus{}
	steps := []struct {
		at          time.Duration
		health      ctrlmeshv1alpha1.ShardHealth
		wantStep    int32
		wantSince   time.Duration // -1: none
		wantRequeue time.Duration
	}{
		{at: 0, health: ctrlmeshv1alpha1.ShardUnhealthy, wantStep: 0, wantSince: -1},
		{at: 10 * time.Second, health: ctrlmeshv1alpha1.ShardHealthy, wantStep: 0, wantSince: 10 * time.Second, wantRequeue: 60 * time.Second},
		{at: 40 * time.Second, health: ctrlmeshv1alpha1.ShardHealthy, wantStep: 0, wantSince: 10 * time.Second, wantRequeue: 30 * time.Second},
		{at: 50 * time.Second, health: ctrlmeshv1alpha1.ShardUnhealthy, wantStep: 0, wantSince: -1},
		{at: 55 * time.Second, health: ctrlmeshv1alpha1.ShardHealthy, wantStep: 0, wantSince: 55 * time.Second, wantRequeue: 60 * time.Second},
		{at: 115 * time.Second, health: ctrlmeshv1alpha1.ShardHealthy, wantStep: 1, wantSince: -1},
		{at: 116 * time.Second, health: ctrlmeshv1alpha1.ShardHealthy, wantStep: 1, wantSince: 116 * time.Second},
		{at: time.Hour, health: ctrlmeshv1alpha1.ShardHealthy, wantStep: 1, wantSince: 116 * time.Second},
	}
	for _, s := range steps {
		requeue := r.advanceCanary(sc, status, canaryHealthy(canary(s.health)), t0.Add(s.at))
		var since time.Duration = -1
		if status.Canary.HealthySince != nil {
			since = status.Canary.HealthySince.Sub(t0)
		}
		if status.Canary.Step != s.wantStep || since != s.wantSince || requeue != s.wantRequeue {
			t.Errorf("at %v: step %d, healthy since %v, requeue after %v; want step %d, since %v, requeue after %v",
				s.at, status.Canary.Step, since, requeue, s.wantStep, s.wantSince, s.wantRequeue)
		}
	}
	close(recorder.Events)
	var events []string
	for e := range recorder.Events {
		events = append(events, e)
	}
	if want := []string{"Normal CanaryAdvanced The canary shard was healthy for 60s: step 2 of 2"}; !reflect.DeepEqual(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
}

// TestNewsIn: what the hub writes at once, whatever the status rate, and
// what waits for it.
func TestNewsIn(t *testing.T) {
	base := func() *ctrlmeshv1alpha1.ShardingConfigStatus {
		return &ctrlmeshv1alpha1.ShardingConfigStatus{
			ObservedGeneration: 2, Shards: 4, ReadyShards: 1,
			Conditions: []metav1.Condition{
				{Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonShardsNotReady, Message: "1 of 4"},
				{Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonAsExpected},
			},
			Placement: []ctrlmeshv1alpha1.ShardPlacement{{Shard: "0", Cluster: "m1", State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy}},
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*ctrlmeshv1alpha1.ShardingConfigStatus)
		news   bool
	}{
		{"a shard's health", func(s *ctrlmeshv1alpha1.ShardingConfigStatus) {
			s.Placement[0].Health = ctrlmeshv1alpha1.ShardHealthUnknown
		}, false},
		{"the counts and Ready's message", func(s *ctrlmeshv1alpha1.ShardingConfigStatus) {
			s.ReadyShards, s.Conditions[0].Message = 2, "2 of 4"
		}, false},
		{"a new observed generation", func(s *ctrlmeshv1alpha1.ShardingConfigStatus) { s.ObservedGeneration = 3 }, true},
		{"Ready's status", func(s *ctrlmeshv1alpha1.ShardingConfigStatus) {
			s.Conditions[0].Status, s.Conditions[0].Reason = metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonAllShardsServing
		}, true},
		{"Degraded's reason", func(s *ctrlmeshv1alpha1.ShardingConfigStatus) {
			s.Conditions[1].Status, s.Conditions[1].Reason = metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterUnavailable
		}, true},
		{"the canary's step", func(s *ctrlmeshv1alpha1.ShardingConfigStatus) { s.Canary = &ctrlmeshv1alpha1.CanaryStatus{Step: 1} }, true},
		{"a condition dropped", func(s *ctrlmeshv1alpha1.ShardingConfigStatus) { s.Conditions = s.Conditions[:1] }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, next := base(), base()
			tc.change(next)
			if got := newsIn(before, next); got != tc.news {
				t.Errorf("newsIn = %v, want %v", got, tc.news)
			}
		})
	}
}

// TestStatusWritesWait: a write waits until the last write's bytes have
// passed at the rate; a config never written, or forgotten, waits for
// nothing.
func TestStatusWritesWait(t *testing.T) {
	var s statusWrites
	key := types.NamespacedName{Namespace: "ops", Name: "op"}
	at := time.Date(2026, 11, 27, 22, 0, 0, 0, time.UTC)
	if got := s.wait(key, at, 1000); got != 0 {
		t.Errorf("never written: wait %s, want none", got)
	}
	written := &ctrlmeshv1alpha1.ShardingConfigStatus{ObservedGeneration: 1, Placement: []ctrlmeshv1alpha1.ShardPlacement{{Shard: "0"}}}
	if !s.newsSinceLast(key, written) {
		t.Error("never written: a status is no news")
	}
	s.wrote(key, at, 3000, 1000, written, writtenPlacement{})
	// What was written is no news, whatever an older cache holds; a
	// new generation is.
	if s.newsSinceLast(key, written) {
		t.Error("the status written is news again")
	}
	if !s.newsSinceLast(key, &ctrlmeshv1alpha1.ShardingConfigStatus{ObservedGeneration: 2}) {
		t.Error("a new generation is no news")
	}
	for _, tc := range []struct {
		after, want time.Duration
	}{{0, 3 * time.Second}, {time.Second, 2 * time.Second}, {3 * time.Second, 0}, {time.Minute, 0}} {
		if got := s.wait(key, at.Add(tc.after), 1000); got != tc.want {
			t.Errorf("%s after writing 3000 bytes at 1000 bytes/s: wait %s, want %s", tc.after, got, tc.want)
		}
	}
	s.forget(key)
	if got := s.wait(key, at, 1000); got != 0 {
		t.Errorf("forgotten: wait %s, want none", got)
	}
}

// TestStatusWritesShareTheRate: the status rate is the hub's. Configs
// whose detail waits take turns at it, one after the other, each as long
// as its last write; a write in its turn takes nothing more from the rate,
// news written at once takes its bytes, and a turn that passed unused is
// dropped. Spaced by each config's own bytes, 30 configs of one namespace
// wrote 3.6 times the statuses and were Ready 1.23x later (make
// bench-scale -namespace).
func TestStatusWritesShareTheRate(t *testing.T) {
	const rate = 1000 // bytes a second
	var s statusWrites
	a, b, c := types.NamespacedName{Namespace: "ops", Name: "a"}, types.NamespacedName{Namespace: "ops", Name: "b"}, types.NamespacedName{Namespace: "ops", Name: "c"}
	t0 := time.Date(2026, 11, 28, 11, 0, 0, 0, time.UTC)
	at := func(seconds float64) time.Time { return t0.Add(time.Duration(seconds * float64(time.Second))) }
	status := &ctrlmeshv1alpha1.ShardingConfigStatus{ObservedGeneration: 1}
	for _, step := range []struct {
		name   string
		config types.NamespacedName
		at     float64
		// wrote is the bytes written at at; else wait is asked, and
		// want is how long.
		wrote int
		want  time.Duration
	}{
		{"a writes news", a, 0, 1000, 0},
		{"b writes news", b, 0, 1000, 0},
		{"a's detail waits for the rate both writes took", a, 0.5, 0, 1500 * time.Millisecond},
		{"b's detail waits for its turn after a's", b, 0.5, 0, 2500 * time.Millisecond},
		{"a keeps its turn", a, 1, 0, time.Second},
		{"a writes in its turn", a, 2, 1000, 0},
		{"c, never written, waits for nothing", c, 2.1, 0, 0},
		{"c writes news, after b's turn", c, 2.1, 500, 0},
		{"b's turn has come", b, 3, 0, 0},
		{"b writes in its turn", b, 3, 1000, 0},
		{"a's next detail waits for c's bytes too", a, 3.5, 0, time.Second},
		{"a's turn passed unused: a waits for nothing", a, 6, 0, 0},
		{"a writes outside any turn", a, 6, 1000, 0},
		{"b's detail waits for a's bytes", b, 6, 0, time.Second},
	} {
		if step.wrote > 0 {
			s.wrote(step.config, at(step.at), step.wrote, rate, status, writtenPlacement{})
			continue
		}
		if got := s.wait(step.config, at(step.at), rate); got != step.want {
			t.Errorf("%s: %s waits %s at %.1f s, want %s", step.name, step.config.Name, got, step.at, step.want)
		}
	}
}

// TestCacheTransformDropsPlacement: a ShardingConfig through the hub's
// cache transform keeps all it had but its managedFields and its status's
// placement, which the hub does not read from its cache.
func TestCacheTransformDropsPlacement(t *testing.T) {
	sc := &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "a", ResourceVersion: "7",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "ctrlmesh-hub", Operation: metav1.ManagedFieldsOperationUpdate}}},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"m1"}}},
		Status: ctrlmeshv1alpha1.ShardingConfigStatus{ObservedGeneration: 3, Shards: 1, Canary: &ctrlmeshv1alpha1.CanaryStatus{Step: 1},
			Conditions: []metav1.Condition{{Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonAllShardsServing}},
			Placement: []ctrlmeshv1alpha1.ShardPlacement{{Shard: "0", Cluster: "m1", Pods: []string{"op-0"}, Buckets: "0-31",
				State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy}}},
	}
	want := sc.DeepCopy()
	want.ManagedFields, want.Status.Placement = nil, nil
	kept, err := CacheTransform(sc)
	if err != nil {
		t.Fatal(err)
	}
	if got := kept.(*ctrlmeshv1alpha1.ShardingConfig); !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("through the transform:\n%+v\nwant\n%+v", got, want)
	}
}

// TestBoundMessage: a message past metav1.Condition's 32768 bytes is cut
// at a rune's start and says so; a shorter one is kept whole.
func TestBoundMessage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		message string
	}{
		{"short", "cluster m1 refuses the rules: label mode cannot serve namespaces team-a"},
		{"ASCII past the bound", strings.Repeat("a", 40000)},
		{"runes across the cut", strings.Repeat("ü", 20000)},
		{"exactly the bound", strings.Repeat("b", maxMessageBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := boundMessage(tc.message)
			switch {
			case len(got) > maxMessageBytes:
				t.Errorf("%d bytes, past %d", len(got), maxMessageBytes)
			case !utf8.ValidString(got):
				t.Error("cut inside a rune")
			case len(tc.message) <= maxMessageBytes && got != tc.message:
				t.Errorf("a message within the bound changed: %d bytes to %d", len(tc.message), len(got))
			case len(tc.message) > maxMessageBytes && (!strings.HasSuffix(got, " …") || !strings.HasPrefix(tc.message, strings.TrimSuffix(got, " …"))):
				t.Errorf("a cut message does not end in \" …\" after the message's start: ...%q", got[len(got)-20:])
			}
		})
	}
}

// TestDigestPlacement: a placement's digest tells every field of every
// shard apart, and nil lists from empty ones not, as the API server
// returns either as none.
func TestDigestPlacement(t *testing.T) {
	base := func() []ctrlmeshv1alpha1.ShardPlacement {
		return []ctrlmeshv1alpha1.ShardPlacement{
			{Shard: "0", Cluster: "m1", Pods: []string{"op-0"}, Leader: "op-0", Buckets: "0-15", State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
			{Shard: "1", Cluster: "m1", Pods: []string{"op-1"}, Buckets: "16-31", Namespaces: []string{"team-a"}, Subset: "s", State: ctrlmeshv1alpha1.ShardPending, Health: ctrlmeshv1alpha1.ShardHealthUnknown},
		}
	}
	for _, tt := range []struct {
		name   string
		same   bool
		change func([]ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement
	}{
		{"unchanged", true, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement { return p }},
		{"empty namespaces for none", true, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[0].Namespaces = []string{}
			return p
		}},
		{"shard", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[0].Shard = "2"
			return p
		}},
		{"cluster", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[1].Cluster = "m2"
			return p
		}},
		{"a pod more", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[0].Pods = append(p[0].Pods, "op-2")
			return p
		}},
		{"a pod moved to the next shard", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[0].Pods, p[1].Pods = nil, []string{"op-0", "op-1"}
			return p
		}},
		{"a pod's name split from the leader's", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[0].Pods, p[0].Leader = []string{"op-0op-0"}, ""
			return p
		}},
		{"leader", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[1].Leader = "op-1"
			return p
		}},
		{"buckets", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[0].Buckets = "0-14"
			return p
		}},
		{"namespaces", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[1].Namespaces = nil
			return p
		}},
		{"canary", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[1].Canary = true
			return p
		}},
		{"subset", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[1].Subset = "t"
			return p
		}},
		{"state", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[1].State = ctrlmeshv1alpha1.ShardServing
			return p
		}},
		{"health", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement {
			p[0].Health = ctrlmeshv1alpha1.ShardUnhealthy
			return p
		}},
		{"a shard less", false, func(p []ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement { return p[:1] }},
		{"none", false, func([]ctrlmeshv1alpha1.ShardPlacement) []ctrlmeshv1alpha1.ShardPlacement { return nil }},
	} {
		if same := digestPlacement(tt.change(base())) == digestPlacement(base()); same != tt.same {
			t.Errorf("%s: the digest is the same: %t, want %t", tt.name, same, tt.same)
		}
	}
	if digestPlacement(nil) != digestPlacement([]ctrlmeshv1alpha1.ShardPlacement{}) {
		t.Error("no placement: nil and empty differ")
	}
}

// TestWithPlacement: the placement goes into a status patch whole, next to
// what the patch had, and none as null, which removes it.
func TestWithPlacement(t *testing.T) {
	placement := []ctrlmeshv1alpha1.ShardPlacement{{Shard: "0", Cluster: "m1", State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy}}
	tests := []struct {
		name      string
		patch     string
		placement []ctrlmeshv1alpha1.ShardPlacement
		want      string
	}{
		{"only the placement changed", `{}`, placement, `{"status":{"placement":[{"shard":"0","cluster":"m1","state":"Serving","health":"Healthy"}]}}`},
		{"beside the status", `{"status":{"shards":1}}`, placement, `{"status":{"placement":[{"shard":"0","cluster":"m1","state":"Serving","health":"Healthy"}],"shards":1}}`},
		{"beside the metadata", `{"metadata":{"resourceVersion":"7"}}`, placement, `{"metadata":{"resourceVersion":"7"},"status":{"placement":[{"shard":"0","cluster":"m1","state":"Serving","health":"Healthy"}]}}`},
		{"none", `{"status":{"shards":null}}`, nil, `{"status":{"placement":null,"shards":null}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := withPlacement([]byte(tt.patch), tt.placement)
			if err != nil || string(got) != tt.want {
				t.Errorf("withPlacement(%s) = %s, %v; want %s", tt.patch, got, err, tt.want)
			}
		})
	}
	if _, err := withPlacement([]byte(`{"status":`), placement); err == nil {
		t.Error("a patch cut short: no error")
	}
}

// BenchmarkDigestPlacement digests the placement of a config over 1000
// members of 4 pods, as each reconcile of it does.
func BenchmarkDigestPlacement(b *testing.B) {
	var placement []ctrlmeshv1alpha1.ShardPlacement
	for m := range 1000 {
		for i := range 4 {
			placement = append(placement, ctrlmeshv1alpha1.ShardPlacement{Shard: fmt.Sprint(i), Cluster: fmt.Sprintf("m%04d", m), Pods: []string{fmt.Sprintf("op-%d", i)},
				Leader: fmt.Sprintf("op-%d", i), Buckets: fmt.Sprintf("%d-%d", 8*i, 8*i+7), State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy})
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		digestPlacement(placement)
	}
}
