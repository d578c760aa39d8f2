package fleettest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// Run is the user's steps on a fleet, and the disruptions after them,
// which the end-to-end tests share: a ShardingConfig applied and its
// placement observed, then phases (a pod kill, a canary's steps, a hub
// restart, …) while the writer keeps the objects changing, each followed
// by the checks that every bucket is served and, where the test asks,
// that every object is reconciled by the pod the hub's status names;
// Finish checks that no object was reconciled by two pods at once.
type Run struct {
	F *Fleet
	// W waits for the ShardingConfig.
	W *Waiter
	// Objects are the managed objects, by the cluster they live in.
	Objects []ClusterObjects
	// Domain maps the cluster of objects to its placement domain: itself
	// in PerCluster scope, "fleet" in Fleet scope.
	Domain func(cluster string) string
	// Phases are the stretches of the run so far.
	Phases   []Phase
	touching *Toucher
}

// PerCluster is Run.Domain in PerCluster scope.
func PerCluster(cluster string) string { return cluster }

// FleetWide is Run.Domain in Fleet scope.
func FleetWide(string) string { return "fleet" }

// Canary gives sc a canary of pods labeled track=canary (AddCanary) that
// moves through steps, each healthy for 2 s before the next.
func Canary(sc *ctrlmeshv1alpha1.ShardingConfig, steps []ctrlmeshv1alpha1.CanaryStep) {
	sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
		Selector:          metav1.LabelSelector{MatchLabels: canaryLabels},
		Steps:             steps,
		MinHealthySeconds: 2,
	}
}

var canaryLabels = map[string]string{"track": "canary"}

// The canary steps of the tests: in range mode a namespace, then buckets
// and the namespace; label mode cannot state a canary ownership of buckets
// and a namespace besides.
var (
	RangeModeCanary = []ctrlmeshv1alpha1.CanaryStep{
		{Namespaces: []string{CanaryNamespace}},
		{Buckets: "0-3", Namespaces: []string{CanaryNamespace}},
	}
	LabelModeCanary = []ctrlmeshv1alpha1.CanaryStep{
		{Namespaces: []string{CanaryNamespace}},
		{Buckets: "0-3"},
	}
)

// Apply creates sc on the hub (user step 3) and waits, within, until it is
// Ready with every bucket served and matches (nil: any); it checks that
// every object is reconciled by its owner (user step 4), then starts the
// writer and a first phase, "steady", of 2 s.
func (f *Fleet) Apply(sc *ctrlmeshv1alpha1.ShardingConfig, objects []ClusterObjects, domain func(string) string, within time.Duration,
	matches func(*ctrlmeshv1alpha1.ShardingConfig) bool) (*Run, *ctrlmeshv1alpha1.ShardingConfig) {
	f.t.Helper()
	env.Create(f.t, f.ctx, f.Hub.Client, sc)
	r := &Run{F: f, W: &Waiter{F: f, Key: client.ObjectKeyFromObject(sc)}, Objects: objects, Domain: domain}
	got := r.W.Ready("initial placement", time.Now(), within, matches)
	f.CheckReconciledBy("initial placement", got, objects, domain)
	r.touching = StartTouching(f.ctx, objects)
	f.t.Cleanup(func() { r.touching.Stop() })
	r.Begin("steady")
	time.Sleep(2 * time.Second)
	return r, got
}

// Begin starts a phase and returns its start.
func (r *Run) Begin(name string) time.Time {
	t0 := time.Now()
	r.Phases = append(r.Phases, Phase{Name: name, Start: t0})
	return t0
}

// Rebalance adds a pod in cluster and waits until it is placed.
func (r *Run) Rebalance(cluster, pod string) *ctrlmeshv1alpha1.ShardingConfig {
	r.F.t.Helper()
	t0 := r.Begin("rebalancing")
	r.F.AddPod(cluster, pod, false, nil)
	return r.W.Ready("rebalancing (pod added)", t0, ReadyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return Placed(sc, pod)
	})
}

// PodKill kills a pod and waits until its buckets are served by others
// within the failover bound, then checks who reconciles the objects.
func (r *Run) PodKill(victim string) *ctrlmeshv1alpha1.ShardingConfig {
	r.F.t.Helper()
	t0 := r.Begin("pod kill")
	r.F.Kill(victim)
	healed := r.W.Ready("pod kill", t0, FailoverBound, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !Placed(sc, victim)
	})
	r.F.CheckReconciledBy("pod kill", healed, r.Objects, r.Domain)
	return healed
}

// CanarySteps adds a canary pod in cluster (the ShardingConfig has a
// Canary) and waits for each of its steps, the canary pod serving each
// step's buckets and namespaces, then checks who reconciles the objects.
func (r *Run) CanarySteps(cluster, pod string, steps []ctrlmeshv1alpha1.CanaryStep) *ctrlmeshv1alpha1.ShardingConfig {
	r.F.t.Helper()
	t0 := r.Begin("canary")
	r.F.AddPod(cluster, pod, false, canaryLabels)
	var promoted *ctrlmeshv1alpha1.ShardingConfig
	for step := range int32(len(steps)) {
		want := steps[step]
		promoted = r.W.Ready(fmt.Sprintf("canary step %d", step+1), t0, ReadyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
			if sc.Status.Canary == nil || sc.Status.Canary.Step < step {
				return false
			}
			// A short step may be over before a poll sees it.
			return sc.Status.Canary.Step > step || slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
				return p.Canary && p.Buckets == want.Buckets && slices.Equal(p.Namespaces, want.Namespaces)
			})
		})
	}
	r.F.CheckReconciledBy("canary promoted", promoted, r.Objects, r.Domain)
	return promoted
}

// HubRestart stops the hub for 2 s and starts it again: the pods keep
// serving meanwhile, and the restarted hub keeps the placement it had
// (want's).
func (r *Run) HubRestart(want *ctrlmeshv1alpha1.ShardingConfig) *ctrlmeshv1alpha1.ShardingConfig {
	r.F.t.Helper()
	t0 := r.Begin("hub restart")
	if err := r.F.StopHub(); err != nil {
		r.F.t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := r.F.StartHub(r.F.ctx); err != nil {
		r.F.t.Fatal(err)
	}
	got := r.W.Ready("hub restart", t0, ReadyWithin, nil)
	if Placement(got) != Placement(want) {
		r.F.t.Errorf("the placement changed over the hub restart:\n%s\nto\n%s", Placement(want), Placement(got))
	}
	return got
}

// AgentRestart stops a member's agent for 2 s and starts it again; the
// placement stays want's.
func (r *Run) AgentRestart(member string, want *ctrlmeshv1alpha1.ShardingConfig) *ctrlmeshv1alpha1.ShardingConfig {
	r.F.t.Helper()
	t0 := r.Begin("agent restart")
	if err := r.F.StopAgent(member); err != nil {
		r.F.t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := r.F.StartAgent(member); err != nil {
		r.F.t.Fatal(err)
	}
	got := r.W.Ready("agent restart", t0, ReadyWithin, nil)
	if Placement(got) != Placement(want) {
		r.F.t.Errorf("the placement changed over the agent restart:\n%s\nto\n%s", Placement(want), Placement(got))
	}
	return got
}

// CutOff runs cut, which keeps member from holding its buckets (its agent
// stopped, say) and returns from when the hub may act on it; it waits
// until the member serves nothing and every bucket is served by others,
// ServedWithin from then, and checks who reconciles the objects.
func (r *Run) CutOff(what, member string, cut func() time.Time) *ctrlmeshv1alpha1.ShardingConfig {
	r.F.t.Helper()
	r.Begin(what)
	since := cut()
	moved := r.W.Served(what, since, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !ServesIn(sc, member)
	})
	r.F.CheckReconciledBy(what, moved, r.Objects, r.Domain)
	return moved
}

// StopTouching stops the writer: what the run does next (deleting the
// ShardingConfig, say) leaves objects unreconciled on purpose.
func (r *Run) StopTouching() { r.touching.Stop() }

// Finish ends the run (Fleet.Finish) and returns the records' counts.
func (r *Run) Finish() Records {
	r.F.t.Helper()
	return r.F.Finish(r.touching, r.Phases, r.Domain)
}

// MemberObjects starts two pods of the demo operator in each member,
// <member>-0 and <member>-1, makes the managed objects in each member and
// returns them: a PerCluster ShardingConfig's fleet.
func (f *Fleet) MemberObjects(t *testing.T, ctx context.Context) []ClusterObjects {
	t.Helper()
	var objects []ClusterObjects
	for _, m := range []string{Member1, Member2} {
		for i := range 2 {
			f.AddPod(m, fmt.Sprintf("%s-%d", m, i), false, nil)
		}
		c := f.Members[m].Client
		objects = append(objects, ClusterObjects{Cluster: m, Client: c, Keys: ManagedObjects(t, ctx, c)})
	}
	return objects
}

// FleetScope starts, in each member, pods of the demo operator whose
// objects live on the hub (the hub's API server must run range mode), two
// per member, makes the managed objects on the hub, and applies a
// Fleet-scope ShardingConfig over both members: its placement spreads over
// both. The fleet starts an operator that exited again, as a kubelet would:
// an operator whose proxy stops serving loses its leader election and
// exits.
func (f *Fleet) FleetScope(t *testing.T, ctx context.Context) *Run {
	t.Helper()
	f.RestartOperators = true
	for _, m := range []string{Member1, Member2} {
		for i := range 2 {
			f.AddPod(m, fmt.Sprintf("%s-%d", m, i), true, nil)
		}
	}
	objects := []ClusterObjects{{Cluster: localfleet.HubName, Client: f.Hub.Client, Keys: ManagedObjects(t, ctx, f.Hub.Client)}}
	// Ready may come before the second member's agent reported its pods;
	// the placement then spreads over both.
	r, _ := f.Apply(ShardingConfig(ctrlmeshv1alpha1.ScopeFleet), objects, FleetWide, 90*time.Second, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return ServesIn(sc, Member1) && ServesIn(sc, Member2)
	})
	return r
}
