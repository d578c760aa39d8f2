package shardingconfig

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"

	"github.com/ctrlmesh/ctrlmesh/hub/state"
)

// BenchmarkSharedPods is the part of overlaps that grows with the fleet:
// one config of 50 in one namespace, each with 4 pods in each of 100
// members, checking the 49 others' reported pods against its own — at
// every one of its reconciles. It measures one reconcile's scan.
func BenchmarkSharedPods(b *testing.B) {
	const configs, clusters, pods = 50, 100, 4
	s, err := state.New()
	if err != nil {
		b.Fatal(err)
	}
	name := func(c int) types.NamespacedName {
		return types.NamespacedName{Namespace: "operators", Name: fmt.Sprintf("op%04d", c)}
	}
	report := func(c, m int) *state.Report {
		r := &state.Report{}
		for i := range pods {
			r.Pods = append(r.Pods, state.Pod{Name: fmt.Sprintf("op%04d-%d", c, i), Address: fmt.Sprintf("10.0.%d.%d", m, i), Ready: true})
		}
		return r
	}
	// ReadBack keeps what it is given: one route serves every row.
	route := &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{RoutingGeneration: 1, RulesHash: "h1"}}
	for c := range configs {
		for m := range clusters {
			if _, err := s.ReadBack(name(c), fmt.Sprintf("m%04d", m), route, report(c, m), time.Unix(1000, 0)); err != nil {
				b.Fatal(err)
			}
		}
	}
	common, members := map[string]bool{}, map[string]*member{}
	for m := range clusters {
		cluster := fmt.Sprintf("m%04d", m)
		common[cluster] = true
		members[cluster] = &member{report: report(0, m)}
	}
	snap := s.Snapshot()
	b.ReportAllocs()
	for b.Loop() {
		for c := 1; c < configs; c++ {
			if shared := sharedPods(snap.ReportedPods(name(c)), common, members); len(shared) != 0 {
				b.Fatalf("config %d shares %v with config 0, which has pods of its own", c, shared)
			}
		}
	}
}
