package placement

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// simPod is an operator pod with its proxy, as the model sees it.
type simPod struct {
	id     route.PodID
	canary bool
	// subset is the subset the pod's labels name, "" for none: one the
	// rules may not name (yet, or any more).
	subset string
	ready  bool
	// alive is false once the pod's process is dead: it enforces nothing.
	alive bool
	// gone is the hub's verdict (lease and heartbeat expired); only dead pods
	// are declared gone.
	gone bool
	// loaded is the newest generation the proxy has read, acked the newest
	// it reports enforcing. In between the proxy may still serve the acked
	// generation's selection while it starts serving the loaded one, so the
	// model takes it as enforcing both.
	loaded, acked int64
	// born is the latest generation when the pod started: a proxy reads no
	// older rules than those.
	born int64
}

// model drives Compute and Handover the way the hub would, with simulated
// proxies that read and acknowledge published generations late and out of
// step with each other.
type model struct {
	t        *testing.T
	rng      *rand.Rand
	space    sharding.Space
	input    Input
	pods     []*simPod
	nsPool   []string
	history  map[int64]route.Table
	table    route.Table
	desired  Placement
	log      []string
	nextName int
	// published counts the generations published.
	published int
}

func newModel(t *testing.T, rng *rand.Rand) *model {
	space := sharding.MustSpace(1 << rng.Intn(6))
	m := &model{
		t:       t,
		rng:     rng,
		space:   space,
		input:   Input{Space: space, PodsPerShard: 1 + rng.Intn(2)},
		nsPool:  []string{"team-a", "team-b", "tenant-01", "payments"},
		history: map[int64]route.Table{0: {}},
	}
	if rng.Intn(3) == 0 {
		m.input.Shards = 1 + rng.Intn(3)
	}
	for range 1 + rng.Intn(4) {
		m.addPod()
	}
	m.reconcile("start")
	return m
}

func (m *model) addPod() {
	m.pods = append(m.pods, &simPod{
		id:     route.PodID{Cluster: fmt.Sprintf("c%d", m.rng.Intn(2)), Name: fmt.Sprintf("p%d", m.nextName)},
		canary: m.rng.Intn(4) == 0,
		subset: modelSubsets[m.rng.Intn(len(modelSubsets))],
		ready:  true,
		alive:  true,
		born:   m.table.Generation,
	})
	m.nextName++
}

// pick returns a random pod that satisfies ok, or nil.
func (m *model) pick(ok func(*simPod) bool) *simPod {
	var matching []*simPod
	for _, p := range m.pods {
		if ok(p) {
			matching = append(matching, p)
		}
	}
	if len(matching) == 0 {
		return nil
	}
	return matching[m.rng.Intn(len(matching))]
}

// event applies one random event and describes it.
func (m *model) event() string {
	switch m.rng.Intn(10) {
	case 0:
		m.addPod()
		return "add " + m.pods[len(m.pods)-1].id.String()
	case 1:
		if p := m.pick(func(p *simPod) bool { return p.alive }); p != nil {
			p.alive, p.ready = false, false
			return "kill " + p.id.String()
		}
	case 2:
		if p := m.pick(func(p *simPod) bool { return p.alive }); p != nil {
			p.ready = !p.ready
			return fmt.Sprintf("%s ready=%v", p.id, p.ready)
		}
	case 3:
		if p := m.pick(func(p *simPod) bool { return !p.alive && !p.gone }); p != nil {
			p.gone = true
			return "gone " + p.id.String()
		}
	case 4:
		return m.newGroupRules()
	case 5, 6, 7:
		if p := m.pick(func(p *simPod) bool { return p.alive && max(p.loaded, p.born) < m.table.Generation }); p != nil {
			from := max(p.loaded, p.born) + 1
			p.loaded = from + m.rng.Int63n(m.table.Generation-from+1)
			return fmt.Sprintf("%s loads %d", p.id, p.loaded)
		}
	default:
		if p := m.pick(func(p *simPod) bool { return p.alive && p.acked < p.loaded }); p != nil {
			p.acked = p.loaded
			return fmt.Sprintf("%s acks %d", p.id, p.acked)
		}
	}
	return "nothing"
}

// modelSubsets are the subsets a pod's labels may name ("" none): "gone"
// is never in the rules, as after a subset was removed from the spec.
var modelSubsets = []string{"", "", "v2", "blue", "gone"}

// newGroupRules draws new rules for the canary and the subsets v2 and
// blue, each on or off: every bucket and namespace of the pool goes to
// at most one of them, as validation demands.
func (m *model) newGroupRules() string {
	names := []string{CanaryShardID, "v2", "blue"}
	on := map[string]bool{}
	for _, n := range names {
		on[n] = m.rng.Intn(3) > 0
	}
	buckets := map[string][]int{}
	namespaces := map[string][]string{}
	for b := range m.space.Buckets() {
		if n := names[m.rng.Intn(len(names))]; on[n] && m.rng.Intn(4) == 0 {
			buckets[n] = append(buckets[n], b)
		}
	}
	for _, ns := range m.nsPool {
		if n := names[m.rng.Intn(len(names))]; on[n] && m.rng.Intn(2) == 0 {
			namespaces[n] = append(namespaces[n], ns)
		}
	}
	m.input.Canary, m.input.Subsets = nil, nil
	var described []string
	for _, n := range names {
		if !on[n] {
			continue
		}
		set := setOf(m.space, buckets[n])
		if n == CanaryShardID {
			m.input.Canary = &CanaryStep{Buckets: set, Namespaces: namespaces[n]}
		} else {
			m.input.Subsets = append(m.input.Subsets, Subset{Name: n, Buckets: set, Namespaces: namespaces[n]})
		}
		described = append(described, fmt.Sprintf("%s %q %v", n, set, namespaces[n]))
	}
	return "rules: " + strings.Join(described, "; ")
}

// reconcile is one pass of the hub: Compute, then Handover, publishing what
// changed.
func (m *model) reconcile(cause string) Step {
	m.t.Helper()
	m.input.Pods = nil
	var acks []PodAck
	for _, p := range m.pods {
		if p.gone {
			// Half the gone pods are reported as such, half left out:
			// both must let grants through once the rules drop them.
			if p.id.Name[len(p.id.Name)-1]%2 == 0 {
				acks = append(acks, PodAck{Pod: p.id, Acked: p.acked, Gone: true})
			}
			continue
		}
		m.input.Pods = append(m.input.Pods, Pod{PodID: p.id, Ready: p.ready, Canary: p.canary, Subset: p.subset})
		acks = append(acks, PodAck{Pod: p.id, Acked: p.acked})
	}
	desired, err := Compute(m.input)
	if err != nil {
		m.fail("Compute: %v", err)
	}
	checkPlacement(m.t, m.input, desired)
	m.input.Previous, m.desired = desired, desired
	step, err := Handover(desired, m.table, acks)
	if err != nil {
		m.fail("Handover: %v", err)
	}
	if step.Changed {
		m.table = step.Table
		m.history[m.table.Generation] = m.table
		m.published++
	}
	m.log = append(m.log, fmt.Sprintf("%s -> %s", cause, describeTable(m.table)))
	if again, err := Handover(desired, m.table, acks); err != nil || again.Changed {
		m.fail("Handover is not idempotent: %v, again %s", err, describeTable(again.Table))
	}
	return step
}

// owners lists, for every bucket and every namespace of the pool, the shards
// whose live pods serve it under the rules they enforce, read exactly as the
// proxy reads them (sharding.Ownership).
func (m *model) enforcedOwners() map[string]map[string][]string {
	served := map[string]map[string][]string{} // token → shard → pods
	note := func(token, shard string, pod route.PodID) {
		if served[token] == nil {
			served[token] = map[string][]string{}
		}
		served[token][shard] = append(served[token][shard], pod.String())
	}
	for _, p := range m.pods {
		if !p.alive {
			continue
		}
		for _, gen := range []int64{p.acked, p.loaded} {
			table := m.history[gen]
			var mine *route.Shard
			var othersNamespaces []string
			for i, s := range table.Shards {
				if slices.Contains(s.Pods, p.id) {
					mine = &table.Shards[i]
				} else {
					othersNamespaces = append(othersNamespaces, s.Namespaces...)
				}
			}
			if mine == nil {
				continue
			}
			own := sharding.NewOwnership(mine.Buckets, mine.Namespaces, othersNamespaces)
			// A bucket stands for its namespaces that no shard lists.
			for _, b := range mine.Buckets.Buckets() {
				note(fmt.Sprintf("bucket %d", b), mine.ID, p.id)
			}
			for _, ns := range m.nsPool {
				if own.Owns(ns) {
					note("namespace "+ns, mine.ID, p.id)
				}
			}
		}
	}
	return served
}

// checkOneOwner asserts that no bucket or namespace is served by the live
// pods of two shards.
func (m *model) checkOneOwner() {
	m.t.Helper()
	for token, shards := range m.enforcedOwners() {
		if len(shards) > 1 {
			m.fail("%s is served by two shards: %v", token, shards)
		}
	}
}

// converge stops the events: dead pods are declared gone and every proxy
// reads and acknowledges the latest rules, until the hub publishes nothing
// new. It returns the rounds that took.
func (m *model) converge() int {
	m.t.Helper()
	for _, p := range m.pods {
		if !p.alive {
			p.gone = true
		}
	}
	for round := 1; ; round++ {
		for _, p := range m.pods {
			if p.alive {
				p.loaded, p.acked = m.table.Generation, m.table.Generation
			}
		}
		m.checkOneOwner()
		if !m.reconcile(fmt.Sprintf("converge round %d", round)).Changed {
			return round
		}
		m.checkOneOwner()
		if round > 5 {
			m.fail("no convergence after %d rounds", round)
		}
	}
}

// checkConverged asserts the published table is the desired placement and
// that the live pods serve every bucket, each by one shard.
func (m *model) checkConverged() {
	m.t.Helper()
	if m.table.HasPending() {
		m.fail("still pending after convergence")
	}
	want := route.Table{Generation: m.table.Generation}
	for _, s := range m.desired.Shards {
		want.Shards = append(want.Shards, route.Shard{ID: s.ID, Cluster: s.Cluster, Canary: s.Canary, Subset: s.Subset, Pods: s.Pods,
			Buckets: s.Buckets, PendingBuckets: setOf(m.space, nil), Namespaces: s.Namespaces})
	}
	if !slices.EqualFunc(want.Shards, m.table.Shards, route.Shard.Equal) {
		m.fail("converged table %s, desired %s", describeTable(m.table), describeTable(want))
	}
	served := m.enforcedOwners()
	hasRegular := slices.ContainsFunc(m.desired.Shards, func(s Shard) bool { return !s.grouped() })
	for b := range m.space.Buckets() {
		if _, ok := served[fmt.Sprintf("bucket %d", b)]; hasRegular && !ok {
			m.fail("bucket %d is served by no live pod after convergence", b)
		}
	}
	for _, group := range m.desired.Shards {
		for _, ns := range group.Namespaces {
			if shards := served["namespace "+ns]; len(shards) != 1 || shards[group.ID] == nil {
				m.fail("namespace %s of shard %s served by %v", ns, group.ID, shards)
			}
		}
	}
}

func (m *model) fail(format string, args ...any) {
	m.t.Helper()
	tail := m.log[max(0, len(m.log)-15):]
	m.t.Fatalf("%s\ndesired:\n%slast events:\n  %s", fmt.Sprintf(format, args...), describe(m.desired), strings.Join(tail, "\n  "))
}

// TestHandoverModel checks revoke-before-grant against random histories:
// pods appear, die, flip readiness and are declared gone, the canary step
// and the subsets' rules change (subsets appear and go, pods of a subset the
// rules do not name wait),
// proxies read and acknowledge generations late. After every event no bucket
// or namespace has two owners among what live pods enforce; once events stop
// and acknowledgements flow, the rules converge to the desired placement with
// every bucket served.
func TestHandoverModel(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	events, published, maxRounds := 0, 0, 0
	for range 300 {
		m := newModel(t, rng)
		for range 80 {
			m.reconcile(m.event())
			m.checkOneOwner()
			events++
		}
		maxRounds = max(maxRounds, m.converge())
		m.checkConverged()
		published += m.published
	}
	t.Logf("%d events, %d generations published; convergence took at most %d rounds", events, published, maxRounds)
}
