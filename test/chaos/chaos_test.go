// Package chaos_test is the partition and chaos suite on a local fleet
// (package localfleet with Options.Relays: a fault-injecting TCP relay
// between each agent and the hub and between each pod's proxy and its API
// server). Each test injects one fault while the demo operator's pods keep
// reconciling changing ConfigMaps, and checks what the end-to-end tests
// check: no object is ever reconciled by two pods at once (the demo
// operator's overlap detector stays at 0), and every bucket is served again
// within a stated bound. Each logs the measured times and the reconcile
// counts, and one summary line starting with "chaos summary".
//
// make test runs the short part (TestAPIServerRestart,
// TestHubKilledMidHandover); make test-chaos sets CTRLMESH_CHAOS=full and
// runs every test.
package chaos_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/fleettest"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

func TestMain(m *testing.M) { fleettest.Main(m) }

// FullEnv, set to "full" (make test-chaos), runs the whole suite; without
// it only the short part runs.
const FullEnv = "CTRLMESH_CHAOS"

// full skips a test of the full suite unless FullEnv says to run it.
func full(t *testing.T) {
	t.Helper()
	if os.Getenv(FullEnv) != "full" {
		t.Skipf("in the full chaos suite only: make test-chaos (%s=full)", FullEnv)
	}
}

const (
	member1 = fleettest.Member1
	member2 = fleettest.Member2
)

// scenario is a fleet of two members with two demo operator pods each,
// sharded by one ShardingConfig that is Ready, and objects being touched.
type scenario struct {
	*fleettest.Fleet
	t       *testing.T
	ctx     context.Context
	sc      *ctrlmeshv1alpha1.ShardingConfig
	w       *fleettest.Waiter
	objects []fleettest.ClusterObjects
	// objectsCluster maps a pod's cluster to its objects' (see Finish).
	objectsCluster func(podCluster string) string
	touching       *fleettest.Toucher
	phases         []fleettest.Phase
	// healed is each fault's measured time to heal, for the summary.
	healed   []string
	finished bool
}

// startScenario starts the fleet with relays, in Fleet scope (the objects
// on the hub, range mode there) or PerCluster scope (the objects in each
// member, range mode there), and waits until the placement is Ready and
// every object is reconciled by its owner; then it starts touching.
func startScenario(t *testing.T, scope ctrlmeshv1alpha1.ShardingScope) *scenario {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	opts := localfleet.Options{Members: []string{member1, member2}, Relays: true}
	fleetScope := scope == ctrlmeshv1alpha1.ScopeFleet
	if fleetScope {
		opts.HubFeatureGates = []string{controlplane.FeatureShardedListAndWatch}
	} else {
		opts.MemberFeatureGates = []string{controlplane.FeatureShardedListAndWatch}
	}
	s := &scenario{Fleet: fleettest.StartFleet(t, ctx, opts), t: t, ctx: ctx}
	// A pod whose proxy stops serving it loses its leader election and its
	// operator exits; the kubelet would start it again.
	s.RestartOperators = true
	for _, m := range []string{member1, member2} {
		for i := range 2 {
			s.AddPod(m, fmt.Sprintf("%s-%d", m, i), fleetScope, nil)
		}
	}
	if fleetScope {
		s.objects = []fleettest.ClusterObjects{{Cluster: localfleet.HubName, Client: s.Hub.Client, Keys: fleettest.ManagedObjects(t, ctx, s.Hub.Client)}}
		s.objectsCluster = func(string) string { return localfleet.HubName }
	} else {
		for _, m := range []string{member1, member2} {
			c := s.Members[m].Client
			s.objects = append(s.objects, fleettest.ClusterObjects{Cluster: m, Client: c, Keys: fleettest.ManagedObjects(t, ctx, c)})
		}
		s.objectsCluster = func(cluster string) string { return cluster }
	}
	s.sc = fleettest.ShardingConfig(scope)
	env.Create(t, ctx, s.Hub.Client, s.sc)
	s.w = &fleettest.Waiter{F: s.Fleet, Key: client.ObjectKeyFromObject(s.sc)}
	// Ready may come before the second member's agent reported its pods.
	got := s.w.Ready("initial placement", time.Now(), 90*time.Second, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return fleettest.ServesIn(sc, member1) && fleettest.ServesIn(sc, member2)
	})
	s.CheckReconciledBy("initial placement", got, s.objects, s.domain)
	s.touching = fleettest.StartTouching(ctx, s.objects)
	// A test that failed on the way still checks and counts the records:
	// the overlaps are the suite's first measure.
	t.Cleanup(func() {
		if !s.finished {
			s.finish()
		}
	})
	s.phases = []fleettest.Phase{{Name: "steady", Start: time.Now()}}
	time.Sleep(2 * time.Second)
	// The probe's own reconciles take a while, fault or not: the baseline
	// of every time to heal.
	s.servedAgain("baseline", time.Now(), fleettest.ServedWithin, got)
	return s
}

// domain is the placement domain of a cluster's objects.
func (s *scenario) domain(cluster string) string {
	if s.sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
		return "fleet"
	}
	return cluster
}

// fault starts a phase named what and returns its start.
func (s *scenario) fault(what string) time.Time {
	t0 := time.Now()
	s.phases = append(s.phases, fleettest.Phase{Name: what, Start: t0})
	s.Logf("fault: %s", what)
	return t0
}

// servedAgain probes every object and waits until each is reconciled by
// its owner in sc, within bound of since, and records the time as what's
// time to heal.
func (s *scenario) servedAgain(what string, since time.Time, bound time.Duration, sc *ctrlmeshv1alpha1.ShardingConfig) {
	s.t.Helper()
	s.Probe(s.objects, what)
	took := s.ReconciledSince(what, since, bound, sc, s.objects, s.objectsCluster)
	s.healed = append(s.healed, fmt.Sprintf("%s %.1fs (bound %s)", what, took.Seconds(), bound))
}

// finish stops the fleet, checks the records and logs the summary line.
func (s *scenario) finish() {
	s.t.Helper()
	s.finished = true
	restarts := s.OperatorRestarts()
	counts := s.Finish(s.touching, s.phases, s.objectsCluster)
	byPhase := make([]string, len(counts.ByPhase))
	for i, p := range counts.ByPhase {
		byPhase[i] = fmt.Sprintf("%s %d", p.Phase, p.Reconciles)
	}
	s.t.Logf("chaos summary: %s: healed: %s; reconciles %d (%s); operator restarts %v; overlaps %d", s.t.Name(),
		strings.Join(s.healed, ", "), counts.Reconciles, strings.Join(byPhase, ", "), restarts, counts.Overlaps)
}

// TestMemberCutOffFromHub cuts member2's agent off the hub (its relay drops
// every byte) in Fleet scope while member2's proxies keep their links to the
// hub's API server, where the objects live: the hub must give member2's
// buckets to member1's pods only once member2's pods surely stopped serving
// them. Then the link heals and member2 takes its share again.
func TestMemberCutOffFromHub(t *testing.T) {
	full(t)
	s := startScenario(t, ctrlmeshv1alpha1.ScopeFleet)

	t0 := s.fault("member2 cut off")
	if err := s.AgentHubRelay(member2).Cut(); err != nil {
		t.Fatal(err)
	}
	moved := s.w.Served("member2 cut off", t0, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !fleettest.ServesIn(sc, member2)
	})
	s.servedAgain("cut off", t0, fleettest.ServedWithin, moved)
	s.CheckReconciledBy("member2 cut off", moved, s.objects, s.domain)
	// The cut lasts a while longer: pods serving what they no longer own
	// would overlap with the new owners meanwhile.
	time.Sleep(10 * time.Second)

	t1 := s.fault("member2 reconnected")
	s.AgentHubRelay(member2).Heal()
	back := s.w.Ready("member2 reconnected", t1, fleettest.ReadyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return fleettest.ServesIn(sc, member2)
	})
	s.servedAgain("reconnected", t1, fleettest.ReadyWithin, back)
	s.CheckReconciledBy("member2 reconnected", back, s.objects, s.domain)
	s.finish()
}

// TestMemberDeselected takes member2 out of spec.clusters in Fleet scope
// while its pods keep running: its buckets go to member1's pods, which must
// not start serving them before member2's pods stopped. member2's link to
// the hub is slow (what the hub sends arrives deselectionLag late), as a
// member's may be: the hub must not count on hearing from it soon.
func TestMemberDeselected(t *testing.T) {
	full(t)
	s := startScenario(t, ctrlmeshv1alpha1.ScopeFleet)
	if err := s.AgentHubRelay(member2).DelayResponses(deselectionLag); err != nil {
		t.Fatal(err)
	}

	t0 := s.fault("member2 deselected")
	var sc ctrlmeshv1alpha1.ShardingConfig
	if err := s.Hub.Client.Get(s.ctx, s.w.Key, &sc); err != nil {
		t.Fatal(err)
	}
	sc.Spec.Clusters.Names = []string{member1}
	if err := s.Hub.Client.Update(s.ctx, &sc); err != nil {
		t.Fatal(err)
	}
	// Every object changes again and again while the buckets move, so that
	// a moment in which member2's pods still serve what member1's already
	// serve shows as overlapping reconciles.
	for i := 0; time.Since(t0) < handoverStorm; i++ {
		s.Probe(s.objects, fmt.Sprintf("deselected-storm-%d", i))
	}
	moved := s.w.Ready("member2 deselected", t0, fleettest.ReadyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !fleettest.ServesIn(sc, member2)
	})
	s.servedAgain("deselected", t0, fleettest.ReadyWithin, moved)
	s.CheckReconciledBy("member2 deselected", moved, s.objects, s.domain)
	// member2's pods keep running a while: serving what they no longer own,
	// they would overlap with member1's.
	time.Sleep(10 * time.Second)
	s.finish()
}

// deselectionLag is how late member2's agent hears from the hub in
// TestMemberDeselected: well within its heartbeat lease (its renewals' writes
// are not delayed), so that member2 stays available.
const deselectionLag = 1500 * time.Millisecond

// handoverStorm is how long TestMemberDeselected keeps changing every
// object after the fault: longer than the hub takes to move the buckets
// and member2's proxies to give them up.
const handoverStorm = 4 * time.Second

// clockSkew is how far the agents' clocks are set off: member1's ahead,
// member2's behind.
const clockSkew = 60 * time.Second

// TestAgentClockSkew sets member1's agent clock 60 s ahead and member2's
// 60 s behind (the heartbeat's renewTime and the agent's judging of the
// shard leases both read it), then rebalances member1 (a pod added) and
// kills a pod in member2: the members stay available (the hub judges the
// heartbeat by when it saw it renewed), and both disruptions heal within
// the bounds of an unskewed fleet.
func TestAgentClockSkew(t *testing.T) {
	full(t)
	s := startScenario(t, ctrlmeshv1alpha1.ScopePerCluster)

	t0 := s.fault("clocks skewed")
	for member, skew := range map[string]time.Duration{member1: clockSkew, member2: -clockSkew} {
		if err := s.SkewAgentClock(member, skew); err != nil {
			t.Fatal(err)
		}
	}
	// Two heartbeat leases long: a member judged by its renewTime would be
	// lost (behind) by now.
	time.Sleep(10 * time.Second)
	steady := s.w.Ready("clocks skewed", t0, fleettest.ReadyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return fleettest.ServesIn(sc, member1) && fleettest.ServesIn(sc, member2)
	})
	s.servedAgain("skewed", t0, fleettest.ReadyWithin, steady)

	added := member1 + "-2"
	t1 := s.fault("rebalancing (skewed)")
	s.AddPod(member1, added, false, nil)
	rebalanced := s.w.Ready("rebalancing (skewed)", t1, fleettest.ReadyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return fleettest.Placed(sc, added)
	})
	s.servedAgain("rebalancing", t1, fleettest.ReadyWithin, rebalanced)

	victim := member2 + "-0"
	t2 := s.fault("pod kill (skewed)")
	s.Kill(victim)
	failedOver := s.w.Ready("pod kill (skewed)", t2, fleettest.FailoverBound, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !fleettest.Placed(sc, victim)
	})
	s.servedAgain("pod kill", t2, fleettest.ServedWithin, failedOver)
	s.CheckReconciledBy("the end", failedOver, s.objects, s.domain)
	s.finish()
}

// apiServerDown is how long the proxies' connections are refused when
// dropped: shorter than the operators' renew deadline, so that a leader
// keeps its lease (a leader that loses it exits, and no kubelet restarts it
// here).
const apiServerDown = 4 * time.Second

// TestAPIServerRestart breaks member1's operator pods' watches twice: first
// their proxies' connections to the API server are dropped (every
// connection through their relays closed, new ones refused for
// apiServerDown), then member1's kube-apiserver itself is restarted (its
// etcd keeps the objects). The proxies and operators must resume their
// watches and every object be served again; no pod may serve what it does
// not own meanwhile.
func TestAPIServerRestart(t *testing.T) {
	s := startScenario(t, ctrlmeshv1alpha1.ScopePerCluster)

	t0 := s.fault("connections dropped")
	errs := make(chan error, 2)
	for i := range 2 {
		relay := s.Pod(fmt.Sprintf("%s-%d", member1, i)).UpstreamRelay()
		go func() { errs <- relay.Drop(apiServerDown) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	back := time.Now()
	sc := s.w.Ready("connections dropped", t0, fleettest.ReadyWithin, nil)
	s.servedAgain("connections dropped", back, fleettest.ServedWithin, sc)

	t1 := s.fault("API server restart")
	if err := s.Members[member1].RestartAPIServer(); err != nil {
		t.Fatal(err)
	}
	back = time.Now()
	s.Logf("member1's API server serves again after %.1fs", back.Sub(t1).Seconds())
	sc = s.w.Ready("API server restart", t1, fleettest.ReadyWithin, nil)
	s.servedAgain("API server restart", back, fleettest.ServedWithin, sc)
	s.CheckReconciledBy("API server restart", sc, s.objects, s.domain)
	s.finish()
}

// TestHubKilledMidHandover adds a pod to member1 and kills the hub while
// the resulting handover is under way (a shard of member1 not yet serving
// or Ready not yet True), then starts it again: the new hub must pick the
// handover up from the published routes and the members' reports, never
// granting a bucket before its old owner released it.
func TestHubKilledMidHandover(t *testing.T) {
	s := startScenario(t, ctrlmeshv1alpha1.ScopePerCluster)

	added := member1 + "-2"
	t0 := s.fault("hub killed mid-handover")
	s.AddPod(member1, added, false, nil)
	var during ctrlmeshv1alpha1.ShardingConfig
	env.Eventually(t, fleettest.ReadyWithin, "a handover under way", func() error {
		var sc ctrlmeshv1alpha1.ShardingConfig
		if err := s.Hub.Client.Get(s.ctx, s.w.Key, &sc); err != nil {
			return err
		}
		if handingOver(&sc) {
			during = sc
			return nil
		}
		if fleettest.Placed(&sc, added) {
			t.Fatalf("the handover to %s ended before the hub could be killed: %s", added, fleettest.Placement(&sc))
		}
		return fmt.Errorf("no handover yet: %s", fleettest.Placement(&sc))
	})
	killed := time.Now()
	s.Logf("handover under way after %.1fs (%d of %d shards ready: %s): killing the hub", killed.Sub(t0).Seconds(),
		during.Status.ReadyShards, during.Status.Shards, fleettest.Placement(&during))
	if err := s.StopHub(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := s.StartHub(s.ctx); err != nil {
		t.Fatal(err)
	}
	sc := s.w.Ready("hub restarted", killed, fleettest.ReadyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return fleettest.Placed(sc, added)
	})
	s.servedAgain("hub restarted", killed, fleettest.ReadyWithin, sc)
	s.CheckReconciledBy("hub restarted", sc, s.objects, s.domain)
	s.finish()
}

// handingOver tells whether member1's placement is between two states: a
// shard of it pending or draining, or not every shard ready.
func handingOver(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
	for _, p := range sc.Status.Placement {
		if p.Cluster == member1 && p.State != ctrlmeshv1alpha1.ShardServing {
			return true
		}
	}
	return sc.Status.ReadyShards != sc.Status.Shards
}
