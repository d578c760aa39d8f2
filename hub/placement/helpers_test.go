package placement

import (
	"fmt"
	"math/rand"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// makePods makes ready, non-canary pods of one cluster.
func makePods(cluster string, names ...string) []Pod {
	out := make([]Pod, 0, len(names))
	for _, n := range names {
		out = append(out, Pod{PodID: route.PodID{Cluster: cluster, Name: n}, Ready: true})
	}
	return out
}

func numberedPods(cluster string, n int) []Pod {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("p%02d", i)
	}
	return makePods(cluster, names...)
}

func mustSet(t testing.TB, space sharding.Space, text string) sharding.Set {
	t.Helper()
	set, err := space.ParseSet(text)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func mustCompute(t testing.TB, in Input) Placement {
	t.Helper()
	p, err := Compute(in)
	if err != nil {
		t.Fatalf("Compute: %v", err)
	}
	return p
}

// describe prints a placement one shard a line, for failure messages.
func describe(p Placement) string {
	var sb strings.Builder
	for _, s := range p.Shards {
		fmt.Fprintf(&sb, "  %s@%s pods=%v buckets=%q ns=%v canary=%v subset=%q\n", s.ID, s.Cluster, s.Pods, s.Buckets, s.Namespaces, s.Canary, s.Subset)
	}
	return sb.String()
}

// bucketOwners maps every bucket to the shard that holds it ("" for none).
func bucketOwners(p Placement) []string {
	out := make([]string, p.Space.Buckets())
	for _, s := range p.Shards {
		for _, b := range s.Buckets.Buckets() {
			out[b] = s.ID
		}
	}
	return out
}

// shardIDPattern is RouteShard.ID's pattern.
var shardIDPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// checkPlacement asserts what every placement Compute returns must satisfy.
func checkPlacement(t *testing.T, in Input, p Placement) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s\nplacement:\n%s", fmt.Sprintf(format, args...), describe(p))
	}
	// The group of every pod: the canary's, its subset's, "" for the
	// numbered shards, or "-" for a subset the input does not name.
	groups := map[string]Subset{}
	for _, g := range in.groups() {
		groups[g.Name] = g
	}
	groupOf := func(pod Pod) string {
		switch {
		case pod.Canary:
			return CanaryShardID
		case pod.Subset == "":
			return ""
		case slices.ContainsFunc(in.Subsets, func(s Subset) bool { return s.Name == pod.Subset }):
			return pod.Subset
		}
		return "-"
	}
	pods := map[route.PodID]Pod{}
	readyRegular := 0
	readyIn := map[string][]route.PodID{}
	for _, pod := range in.Pods {
		pods[pod.PodID] = pod
		if pod.Ready {
			g := groupOf(pod)
			if g == "" {
				readyRegular++
			}
			readyIn[g] = append(readyIn[g], pod.PodID)
		}
	}
	active := map[string]bool{}
	free := in.Space.Buckets()
	for name, g := range groups {
		// A group with ready pods and something to serve has a shard.
		if len(readyIn[name]) > 0 && (!g.Buckets.IsEmpty() || len(g.Namespaces) > 0) {
			active[name] = true
			free -= g.Buckets.Len()
		}
	}
	holder := make([]int, in.Space.Buckets())
	seenPod := map[route.PodID]string{}
	seenGroup := map[string]bool{}
	var sizes []int
	regularShards := 0
	for i, s := range p.Shards {
		if i > 0 && route.CompareShardIDs(p.Shards[i-1].ID, s.ID) >= 0 {
			fail("shards not sorted by ID")
		}
		if !shardIDPattern.MatchString(s.ID) || len(s.ID) > 50 {
			fail("shard ID %q is not a short DNS label", s.ID)
		}
		if len(s.Pods) == 0 {
			fail("shard %s has no pods", s.ID)
		}
		group := s.Subset
		if s.Canary {
			group = CanaryShardID
		}
		for _, id := range s.Pods {
			pod, ok := pods[id]
			if !ok || !pod.Ready || groupOf(pod) != group {
				fail("shard %s (group %q) has pod %s, which is %+v", s.ID, group, id, pod)
			}
			if other, dup := seenPod[id]; dup {
				fail("pod %s in shards %s and %s", id, other, s.ID)
			}
			seenPod[id] = s.ID
		}
		if !slices.IsSortedFunc(s.Pods, route.ComparePodIDs) {
			fail("shard %s pods not sorted", s.ID)
		}
		for _, b := range s.Buckets.Buckets() {
			holder[b]++
		}
		if group != "" {
			g, ok := groups[group]
			if s.ID != group || !ok || !active[group] || seenGroup[group] || (s.Canary && s.Subset != "") {
				fail("unexpected shard %s of group %q", s.ID, group)
			}
			seenGroup[group] = true
			if !s.Buckets.Equal(g.Buckets) || !slices.Equal(s.Namespaces, sortedUnique(g.Namespaces)) {
				fail("shard %s serves %q %v, its rules say %q %v", s.ID, s.Buckets, s.Namespaces, g.Buckets, g.Namespaces)
			}
			if !slices.Equal(s.Pods, slices.SortedFunc(slices.Values(readyIn[group]), route.ComparePodIDs)) {
				fail("shard %s has pods %v, want every ready pod of its group %v", s.ID, s.Pods, readyIn[group])
			}
			continue
		}
		regularShards++
		if len(s.Namespaces) > 0 {
			fail("numbered shard %s lists namespaces", s.ID)
		}
		for name := range active {
			if !s.Buckets.Intersection(groups[name].Buckets).IsEmpty() {
				fail("shard %s keeps buckets of group %s", s.ID, name)
			}
		}
		want := min(in.PodsPerShard, readyRegular)
		if len(s.Pods) != want {
			fail("shard %s has %d pods, want %d", s.ID, len(s.Pods), want)
		}
		sizes = append(sizes, s.Buckets.Len())
	}
	for name := range active {
		if !seenGroup[name] {
			fail("group %s has ready pods but no shard", name)
		}
	}
	for b, n := range holder {
		if n > 1 || (readyRegular > 0 && n == 0) {
			fail("bucket %d held by %d shards", b, n)
		}
	}
	if len(sizes) > 0 && slices.Max(sizes)-slices.Min(sizes) > 1 {
		fail("unbalanced: sizes %v", sizes)
	}
	// Shard count: podsPerShard pods each, capped by fixed count and buckets.
	wantShards := 0
	if readyRegular > 0 {
		wantShards = max(1, readyRegular/in.PodsPerShard)
		if in.Shards > 0 {
			wantShards = min(wantShards, in.Shards)
		}
		wantShards = min(wantShards, free)
	}
	if regularShards != wantShards {
		fail("%d numbered shards, want %d", regularShards, wantShards)
	}
}

// shuffled returns the input with every list in another order.
func shuffled(rng *rand.Rand, in Input) Input {
	out := in
	out.Pods = slices.Clone(in.Pods)
	rng.Shuffle(len(out.Pods), func(i, j int) { out.Pods[i], out.Pods[j] = out.Pods[j], out.Pods[i] })
	out.Previous.Shards = nil
	for _, s := range in.Previous.Shards {
		s.Pods = slices.Clone(s.Pods)
		rng.Shuffle(len(s.Pods), func(i, j int) { s.Pods[i], s.Pods[j] = s.Pods[j], s.Pods[i] })
		out.Previous.Shards = append(out.Previous.Shards, s)
	}
	rng.Shuffle(len(out.Previous.Shards), func(i, j int) {
		out.Previous.Shards[i], out.Previous.Shards[j] = out.Previous.Shards[j], out.Previous.Shards[i]
	})
	if in.Canary != nil {
		step := *in.Canary
		step.Namespaces = slices.Clone(step.Namespaces)
		rng.Shuffle(len(step.Namespaces), func(i, j int) {
			step.Namespaces[i], step.Namespaces[j] = step.Namespaces[j], step.Namespaces[i]
		})
		out.Canary = &step
	}
	return out
}

// randomSet is a random subset of the space's buckets, each bucket with
// probability p.
func randomSet(rng *rand.Rand, space sharding.Space, p float64) sharding.Set {
	var buckets []int
	for b := range space.Buckets() {
		if rng.Float64() < p {
			buckets = append(buckets, b)
		}
	}
	return setOf(space, buckets)
}
