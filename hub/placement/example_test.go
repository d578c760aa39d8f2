package placement_test

import (
	"fmt"

	"github.com/ctrlmesh/ctrlmesh/hub/placement"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

func pod(name string, canary bool) placement.Pod {
	return placement.Pod{PodID: route.PodID{Cluster: "member-1", Name: name}, Ready: true, Canary: canary}
}

func printPlacement(p placement.Placement) {
	for _, s := range p.Shards {
		fmt.Printf("shard %s: pods %v, buckets %q, namespaces %v\n", s.ID, s.Pods, s.Buckets, s.Namespaces)
	}
}

// Three pods make three shards. When one dies and a spare stands by, the
// spare takes its place and no bucket moves.
func ExampleCompute() {
	in := placement.Input{
		Space:        sharding.MustSpace(32),
		Shards:       3,
		PodsPerShard: 1,
		Pods:         []placement.Pod{pod("op-a", false), pod("op-b", false), pod("op-c", false), pod("op-d", false)},
	}
	first, err := placement.Compute(in)
	if err != nil {
		panic(err)
	}
	printPlacement(first)

	in.Pods = []placement.Pod{pod("op-a", false), pod("op-c", false), pod("op-d", false)}
	in.Previous = first
	second, err := placement.Compute(in)
	if err != nil {
		panic(err)
	}
	printPlacement(second)
	// Output:
	// shard 0: pods [member-1/op-a], buckets "0-10", namespaces []
	// shard 1: pods [member-1/op-b], buckets "11-21", namespaces []
	// shard 2: pods [member-1/op-c], buckets "22-31", namespaces []
	// shard 0: pods [member-1/op-a], buckets "0-10", namespaces []
	// shard 1: pods [member-1/op-d], buckets "11-21", namespaces []
	// shard 2: pods [member-1/op-c], buckets "22-31", namespaces []
}

// The canary shard serves exactly the step in force; the other shards give
// its buckets up and exclude its namespaces.
func ExampleCompute_canary() {
	space := sharding.MustSpace(16)
	step, err := space.ParseSet("0-1")
	if err != nil {
		panic(err)
	}
	p, err := placement.Compute(placement.Input{
		Space:        space,
		PodsPerShard: 1,
		Pods:         []placement.Pod{pod("op-a", false), pod("op-b", false), pod("op-canary", true)},
		Canary:       &placement.CanaryStep{Buckets: step, Namespaces: []string{"team-a"}},
	})
	if err != nil {
		panic(err)
	}
	printPlacement(p)
	// Output:
	// shard 0: pods [member-1/op-a], buckets "2-8", namespaces []
	// shard 1: pods [member-1/op-b], buckets "9-15", namespaces []
	// shard canary: pods [member-1/op-canary], buckets "0-1", namespaces [team-a]
}

// A second pod joins: shard 0 first gives buckets 8-15 up, and shard 1 gets
// them only once both proxies enforce the generation without them.
func ExampleHandover() {
	space := sharding.MustSpace(16)
	opA, opB := pod("op-a", false), pod("op-b", false)
	alone, err := placement.Compute(placement.Input{Space: space, PodsPerShard: 1, Pods: []placement.Pod{opA}})
	if err != nil {
		panic(err)
	}
	published := route.Table{}
	publish := func(desired placement.Placement, acks ...placement.PodAck) {
		step, err := placement.Handover(desired, published, acks)
		if err != nil {
			panic(err)
		}
		published = step.Table
		fmt.Printf("generation %d (changed %v):", published.Generation, step.Changed)
		for _, s := range published.Shards {
			fmt.Printf(" shard %s serves %q, pending %q;", s.ID, s.Buckets, s.PendingBuckets)
		}
		fmt.Printf(" waiting for %v\n", step.WaitingFor)
	}
	publish(alone)

	pair, err := placement.Compute(placement.Input{Space: space, PodsPerShard: 1, Pods: []placement.Pod{opA, opB}, Previous: alone})
	if err != nil {
		panic(err)
	}
	publish(pair, placement.PodAck{Pod: opA.PodID, Acked: 1}, placement.PodAck{Pod: opB.PodID})
	publish(pair, placement.PodAck{Pod: opA.PodID, Acked: 2}, placement.PodAck{Pod: opB.PodID})
	publish(pair, placement.PodAck{Pod: opA.PodID, Acked: 2}, placement.PodAck{Pod: opB.PodID, Acked: 2})
	// Output:
	// generation 1 (changed true): shard 0 serves "0-15", pending ""; waiting for []
	// generation 2 (changed true): shard 0 serves "0-7", pending ""; shard 1 serves "", pending "8-15"; waiting for [member-1/op-a member-1/op-b]
	// generation 2 (changed false): shard 0 serves "0-7", pending ""; shard 1 serves "", pending "8-15"; waiting for [member-1/op-b]
	// generation 3 (changed true): shard 0 serves "0-7", pending ""; shard 1 serves "8-15", pending ""; waiting for []
}
