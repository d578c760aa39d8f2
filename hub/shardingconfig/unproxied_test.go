package shardingconfig

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

// TestPodsWithoutProxy: a ready pod whose proxy has not reported is no
// candidate at once, and after the grace is named in Degraded and told about
// once by an Event; a pod whose proxy reports leaves the list.
func TestPodsWithoutProxy(t *testing.T) {
	members := map[string]*member{"member1": {
		cluster: cluster("member1", true, true, nil),
		report: &state.Report{Cluster: "member1", Pods: []state.Pod{
			{Name: "op-0", Ready: true, AppliedRulesHash: "h1"},
			{Name: "op-1", Ready: true},
			{Name: "op-2"}, // not ready: not counted either way
		}},
	}}
	if got := candidates("member1", members["member1"].report.Pods); got[1].Ready || !got[0].Ready {
		t.Fatalf("candidates %+v: want op-0 ready and op-1, without a proxy report, not", got)
	}
	op1 := route.PodID{Cluster: "member1", Name: "op-1"}
	config := types.NamespacedName{Namespace: "ops", Name: "op"}
	t0 := time.Unix(1000, 0)
	var u unproxiedPods
	for _, step := range []struct {
		at                    time.Time
		wantOverdue, wantTold []route.PodID
		wantNext              time.Time
	}{
		{t0, nil, nil, t0.Add(proxyReportGrace)},
		{t0.Add(proxyReportGrace - time.Second), nil, nil, t0.Add(proxyReportGrace)},
		{t0.Add(proxyReportGrace), []route.PodID{op1}, []route.PodID{op1}, time.Time{}},
		{t0.Add(2 * proxyReportGrace), []route.PodID{op1}, nil, time.Time{}},
	} {
		overdue, told, next := u.observe(config, readyWithoutProxy(members), step.at)
		if !slices.Equal(overdue, step.wantOverdue) || !slices.Equal(told, step.wantTold) || !next.Equal(step.wantNext) {
			t.Errorf("at %s: overdue %v told %v next %v; want %v %v %v", step.at.Sub(t0), overdue, told, next, step.wantOverdue, step.wantTold, step.wantNext)
		}
	}
	out := &outcome{members: members, unproxied: []route.PodID{op1}}
	if reason, message := degraded(nil, out); reason != ctrlmeshv1alpha1.ReasonPodsWithoutProxy || message == "" {
		t.Errorf("degraded = %s %q, want %s naming the pod", reason, message, ctrlmeshv1alpha1.ReasonPodsWithoutProxy)
	}
	// The proxy reports: the pod is forgotten.
	members["member1"].report.Pods[1].AppliedRulesHash = "h1"
	if overdue, _, next := u.observe(config, readyWithoutProxy(members), t0.Add(3*proxyReportGrace)); overdue != nil || !next.IsZero() {
		t.Errorf("after the report: overdue %v next %v, want none", overdue, next)
	}
}
