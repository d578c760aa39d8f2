package placement

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// Pod is a candidate pod as its cluster's agent reports it. An unready pod
// is treated as gone: it leaves its shard.
type Pod struct {
	route.PodID
	Ready  bool
	Canary bool
	// Subset is the subset the pod's labels put it in, "" for none. A
	// canary pod is the canary's whatever its subset.
	Subset string
}

// Subset is what one subset's pods serve. Buckets must be a set of the
// input's space, empty for namespaces only.
type Subset struct {
	Name       string
	Buckets    sharding.Set
	Namespaces []string
}

// CanaryStep is what the canary serves in the step in force. Buckets must be
// a set of the input's space, empty for a step of namespaces only.
type CanaryStep struct {
	Buckets    sharding.Set
	Namespaces []string
}

// Input is everything Compute decides from.
type Input struct {
	Space sharding.Space
	// Shards fixes the number of non-canary shards; 0 makes one shard of
	// every PodsPerShard ready non-canary pods. Either way the count is
	// capped by the pods (and buckets) there are: the caller compares
	// against the placement to report Degraded.
	Shards int
	// PodsPerShard is how many pods serve a shard: one leader and hot
	// standbys. At least 1.
	PodsPerShard int
	// Pods are the candidate pods, in any order.
	Pods []Pod
	// Canary is the canary step in force; nil when there is no canary.
	Canary *CanaryStep
	// Subsets, each served by its own pods; they name disjoint buckets and
	// namespaces, disjoint from the canary step's too.
	Subsets []Subset
	// Previous is the last placement, whose shard IDs, pods and buckets are
	// kept where possible. The zero Placement means there is none.
	Previous Placement
}

// Compute returns the desired placement. Every bucket belongs to exactly one
// shard when any ready pod outside the canary and the subsets exists; sizes
// of those (numbered) shards differ by at most one; a bucket moves only when
// a shard appears, is dissolved, or the canary or a subset takes or returns
// it, and then only as few as balance needs. The canary and each subset
// with a ready pod and something to serve form one shard each, of all
// their ready pods, serving exactly what the step or the subset names; the canary is a subset named
// CanaryShardID whose rules are the step in force. The same input in any
// order gives the same placement.
func Compute(in Input) (Placement, error) {
	if err := in.validate(); err != nil {
		return Placement{}, err
	}
	regular, grouped := readyPods(in.Pods, in.Subsets)

	free := in.Space.AllBuckets()
	var active []Subset
	for _, g := range in.groups() {
		// A group with nothing to serve forms no shard: its pods stand by.
		// (A namespace rule may match no namespace in a member; the route
		// lists no shard that serves nothing, so such a shard would never
		// be read back as published, and every reconcile would publish it
		// again.)
		if len(grouped[g.Name]) > 0 && (!g.Buckets.IsEmpty() || len(g.Namespaces) > 0) {
			active = append(active, g)
			free = free.Difference(g.Buckets)
		}
	}
	count := shardCount(in, len(regular), free.Len())
	shards := keepShards(in.Previous, regular, free, count, in.PodsPerShard)
	spares := newSparePool(regular, shards)
	for _, s := range shards {
		s.pods = append(s.pods, spares.take(s.cluster, in.PodsPerShard-len(s.pods))...)
	}
	for len(shards) < count {
		cluster := spares.largestCluster()
		shards = append(shards, &forming{
			id:   freeShardID(shards),
			pods: spares.take(cluster, in.PodsPerShard),
		})
	}
	assignBuckets(shards, free)

	out := Placement{Space: in.Space}
	for _, s := range shards {
		slices.SortFunc(s.pods, route.ComparePodIDs)
		out.Shards = append(out.Shards, Shard{
			ID:      s.id,
			Cluster: majorityCluster(s.pods, s.cluster),
			Pods:    s.pods,
			Buckets: setOf(in.Space, s.buckets),
		})
	}
	for _, g := range active {
		previous, _ := in.Previous.Shard(g.Name)
		shard := Shard{
			ID:         g.Name,
			Cluster:    majorityCluster(grouped[g.Name], previous.Cluster),
			Pods:       grouped[g.Name],
			Buckets:    g.Buckets,
			Namespaces: sortedUnique(g.Namespaces),
			Subset:     g.Name,
		}
		if g.Name == CanaryShardID {
			shard.Canary, shard.Subset = true, ""
		}
		out.Shards = append(out.Shards, shard)
	}
	slices.SortFunc(out.Shards, func(a, b Shard) int { return route.CompareShardIDs(a.ID, b.ID) })
	return out, nil
}

// groups are the subsets, then the canary as the subset CanaryShardID.
func (in Input) groups() []Subset {
	groups := slices.Clone(in.Subsets)
	if in.Canary != nil {
		groups = append(groups, Subset{Name: CanaryShardID, Buckets: in.Canary.Buckets, Namespaces: in.Canary.Namespaces})
	}
	return groups
}

// validateGroups checks that the subsets and the canary step name
// disjoint buckets and namespaces under distinct names, none of which a
// numbered shard could have.
func (in Input) validateGroups() error {
	owner := map[string]string{}
	bucketOwner := make([]string, in.Space.Buckets())
	describe := func(name string) string {
		if name == CanaryShardID {
			return "the canary step"
		}
		return fmt.Sprintf("subset %q", name)
	}
	for _, g := range in.groups() {
		if g.Name == "" || g.Name[0] >= '0' && g.Name[0] <= '9' {
			return fmt.Errorf("subset name %q: it must start with a letter, since the other shards are numbered", g.Name)
		}
		if _, dup := owner["name "+g.Name]; dup {
			return fmt.Errorf("subset name %q is used twice", g.Name)
		}
		owner["name "+g.Name] = g.Name
		if err := checkSpace(in.Space, g.Buckets, describe(g.Name)+" buckets"); err != nil {
			return err
		}
		for _, b := range g.Buckets.Buckets() {
			if other := bucketOwner[b]; other != "" {
				return fmt.Errorf("%s and %s both name bucket %d: a bucket is served by one shard; give it to one of them", describe(other), describe(g.Name), b)
			}
			bucketOwner[b] = g.Name
		}
		for _, ns := range sortedUnique(g.Namespaces) {
			if other, ok := owner["namespace "+ns]; ok {
				return fmt.Errorf("%s and %s both name namespace %q: a namespace is served by one shard; give it to one of them", describe(other), describe(g.Name), ns)
			}
			owner["namespace "+ns] = g.Name
		}
	}
	return nil
}

func (in Input) validate() error {
	if in.Space.Buckets() == 0 {
		return errors.New("input has no bucket space")
	}
	if in.PodsPerShard < 1 {
		return fmt.Errorf("podsPerShard must be at least 1, got %d", in.PodsPerShard)
	}
	if in.Shards < 0 {
		return fmt.Errorf("shards must not be negative, got %d", in.Shards)
	}
	if in.Canary != nil {
		if err := checkSpace(in.Space, in.Canary.Buckets, "canary step buckets"); err != nil {
			return err
		}
	}
	if err := in.validateGroups(); err != nil {
		return err
	}
	seen := map[route.PodID]bool{}
	for _, p := range in.Pods {
		if seen[p.PodID] {
			return fmt.Errorf("pod %s is listed twice", p.PodID)
		}
		seen[p.PodID] = true
	}
	if len(in.Previous.Shards) > 0 && in.Previous.Space != in.Space {
		return fmt.Errorf("previous placement has %d buckets, input %d: a new bucket count needs a fresh placement", in.Previous.Space.Buckets(), in.Space.Buckets())
	}
	for _, s := range in.Previous.Shards {
		if err := checkSpace(in.Space, s.Buckets, fmt.Sprintf("previous shard %q buckets", s.ID)); err != nil {
			return err
		}
	}
	return nil
}

// readyPods splits the ready pods into regular ones and those of each
// group (the canary's under CanaryShardID, each subset's under its name),
// each sorted. A pod whose subset the input does not name (the spec
// changed since its agent reported) serves nothing until it is reported
// again, as a canary pod without a canary does: moving it into a numbered
// shard and out again would move buckets twice.
func readyPods(pods []Pod, subsets []Subset) (regular []route.PodID, grouped map[string][]route.PodID) {
	grouped = map[string][]route.PodID{}
	for _, p := range pods {
		switch {
		case !p.Ready:
		case p.Canary:
			grouped[CanaryShardID] = append(grouped[CanaryShardID], p.PodID)
		case p.Subset != "":
			if slices.ContainsFunc(subsets, func(s Subset) bool { return s.Name == p.Subset }) {
				grouped[p.Subset] = append(grouped[p.Subset], p.PodID)
			}
		default:
			regular = append(regular, p.PodID)
		}
	}
	slices.SortFunc(regular, route.ComparePodIDs)
	for _, g := range grouped {
		slices.SortFunc(g, route.ComparePodIDs)
	}
	return regular, grouped
}

// shardCount is how many non-canary shards the pods and buckets allow: every
// shard gets podsPerShard pods (a lone shard may have fewer, so that one
// ready pod still serves) and at least one bucket.
func shardCount(in Input, readyRegular, freeBuckets int) int {
	if readyRegular == 0 {
		return 0
	}
	count := max(1, readyRegular/in.PodsPerShard)
	if in.Shards > 0 {
		count = min(count, in.Shards)
	}
	return min(count, freeBuckets)
}

// forming is a shard being built.
type forming struct {
	id string
	// cluster is the shard's previous cluster, where spares are taken
	// first; empty for a new shard.
	cluster string
	pods    []route.PodID
	// buckets, ascending: kept from the previous placement, then assigned.
	buckets []int
}

// keepShards picks which previous non-canary shards live on, at most count:
// those that keep the most pods, then the most buckets (dissolving a small
// shard moves few buckets), then the lowest IDs. Each keeps its ready pods
// (at most podsPerShard) and its buckets outside the canary.
func keepShards(previous Placement, regular []route.PodID, free sharding.Set, count, podsPerShard int) []*forming {
	ready := map[route.PodID]bool{}
	for _, p := range regular {
		ready[p] = true
	}
	prev := slices.Clone(previous.Shards)
	slices.SortFunc(prev, func(a, b Shard) int { return route.CompareShardIDs(a.ID, b.ID) })
	claimed := make([]bool, free.Space().Buckets())
	var candidates []*forming
	for _, s := range prev {
		if s.grouped() {
			continue
		}
		f := &forming{id: s.ID, cluster: s.Cluster}
		for _, p := range slices.SortedFunc(slices.Values(s.Pods), route.ComparePodIDs) {
			if ready[p] && len(f.pods) < podsPerShard {
				f.pods = append(f.pods, p)
				// A pod serves one shard, even if a previous placement
				// (not made here) listed it twice.
				delete(ready, p)
			}
		}
		for _, b := range s.Buckets.Buckets() {
			if free.Has(b) && !claimed[b] {
				f.buckets = append(f.buckets, b)
				claimed[b] = true
			}
		}
		candidates = append(candidates, f)
	}
	slices.SortStableFunc(candidates, func(a, b *forming) int {
		return cmp.Or(cmp.Compare(len(b.pods), len(a.pods)), cmp.Compare(len(b.buckets), len(a.buckets)))
	})
	return candidates[:min(count, len(candidates))]
}

// sparePool holds the ready non-canary pods no shard has yet, by cluster.
type sparePool struct {
	byCluster map[string][]route.PodID
}

func newSparePool(regular []route.PodID, shards []*forming) *sparePool {
	taken := map[route.PodID]bool{}
	for _, s := range shards {
		for _, p := range s.pods {
			taken[p] = true
		}
	}
	pool := &sparePool{byCluster: map[string][]route.PodID{}}
	for _, p := range regular {
		if !taken[p] {
			pool.byCluster[p.Cluster] = append(pool.byCluster[p.Cluster], p)
		}
	}
	return pool
}

// largestCluster is the cluster with the most spares (the first by name on a
// tie): the one most likely to fill a new shard alone.
func (sp *sparePool) largestCluster() string {
	best := ""
	for c, pods := range sp.byCluster {
		if n, bestN := len(pods), len(sp.byCluster[best]); n > bestN || (n == bestN && c < best) {
			best = c
		}
	}
	return best
}

// take removes up to n spares, from cluster first so that a shard's pods
// stay in one cluster when they can, then from the largest clusters.
func (sp *sparePool) take(cluster string, n int) []route.PodID {
	var out []route.PodID
	for len(out) < n {
		from := cluster
		if len(sp.byCluster[from]) == 0 {
			from = sp.largestCluster()
		}
		pods := sp.byCluster[from]
		if len(pods) == 0 {
			break
		}
		out = append(out, pods[0])
		if len(pods) == 1 {
			delete(sp.byCluster, from)
		} else {
			sp.byCluster[from] = pods[1:]
		}
	}
	return out
}

// freeShardID is the lowest number no shard uses, so IDs stay short.
func freeShardID(shards []*forming) string {
	used := map[string]bool{}
	for _, s := range shards {
		used[s.id] = true
	}
	for i := 0; ; i++ {
		if id := strconv.Itoa(i); !used[id] {
			return id
		}
	}
}

// assignBuckets gives every free bucket to a shard so that sizes differ by at
// most one. The shards that hold the most keep the larger quotas, so a shard
// gives buckets up only when it holds more than its quota, and takes only
// when it holds fewer: adding a shard moves buckets only into it, dissolving
// one moves only its buckets.
func assignBuckets(shards []*forming, free sharding.Set) {
	if len(shards) == 0 {
		return
	}
	byHoldings := slices.Clone(shards)
	slices.SortStableFunc(byHoldings, func(a, b *forming) int {
		return cmp.Or(cmp.Compare(len(b.buckets), len(a.buckets)), route.CompareShardIDs(a.id, b.id))
	})
	quota := map[*forming]int{}
	base, extra := free.Len()/len(shards), free.Len()%len(shards)
	held := make([]bool, free.Space().Buckets())
	for i, s := range byHoldings {
		quota[s] = base
		if i < extra {
			quota[s]++
		}
		// Keep the lowest buckets: ranges stay compact.
		s.buckets = s.buckets[:min(len(s.buckets), quota[s])]
		for _, b := range s.buckets {
			held[b] = true
		}
	}
	var pool []int
	for _, b := range free.Buckets() {
		if !held[b] {
			pool = append(pool, b)
		}
	}
	for _, s := range byHoldings {
		n := quota[s] - len(s.buckets)
		s.buckets = append(s.buckets, pool[:n]...)
		pool = pool[n:]
		slices.Sort(s.buckets)
	}
}

// majorityCluster is the cluster most of the pods run in; prefer (the
// shard's previous cluster) wins a tie, so the record does not flap.
func majorityCluster(pods []route.PodID, prefer string) string {
	counts := map[string]int{}
	for _, p := range pods {
		counts[p.Cluster]++
	}
	best := prefer
	for c, n := range counts {
		if n > counts[best] || (n == counts[best] && best != prefer && c < best) {
			best = c
		}
	}
	return best
}
