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
	// Previous is the last placement, whose shard IDs, pods and buckets are
	// kept where possible. The zero Placement means there is none.
	Previous Placement
}

// Compute returns the desired placement. Every bucket belongs to exactly one
// shard when any ready non-canary pod exists; sizes of non-canary shards
// differ by at most one; a bucket moves only when a shard appears, is
// dissolved, or the canary takes or returns it, and then only as few as
// balance needs. The same input in any order gives the same placement.
func Compute(in Input) (Placement, error) {
	if err := in.validate(); err != nil {
		return Placement{}, err
	}
	regular, canaryPods := readyPods(in.Pods)
	canaryOn := in.Canary != nil && len(canaryPods) > 0

	free := in.Space.AllBuckets()
	if canaryOn {
		free = free.Difference(in.Canary.Buckets)
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
	if canaryOn {
		previous, _ := in.Previous.Shard(CanaryShardID)
		out.Shards = append(out.Shards, Shard{
			ID:         CanaryShardID,
			Cluster:    majorityCluster(canaryPods, previous.Cluster),
			Pods:       canaryPods,
			Buckets:    in.Canary.Buckets,
			Namespaces: sortedUnique(in.Canary.Namespaces),
			Canary:     true,
		})
	}
	slices.SortFunc(out.Shards, func(a, b Shard) int { return route.CompareShardIDs(a.ID, b.ID) })
	return out, nil
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

// readyPods splits the ready pods into regular and canary ones, each sorted.
func readyPods(pods []Pod) (regular, canary []route.PodID) {
	for _, p := range pods {
		switch {
		case !p.Ready:
		case p.Canary:
			canary = append(canary, p.PodID)
		default:
			regular = append(regular, p.PodID)
		}
	}
	slices.SortFunc(regular, route.ComparePodIDs)
	slices.SortFunc(canary, route.ComparePodIDs)
	return regular, canary
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
		if s.Canary {
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
