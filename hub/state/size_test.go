package state_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// BenchmarkModelBytes reports the live heap the working model holds per
// config and cluster (one Work's worth), filled as a hub fills it: each
// Work read back once, then published at two later generations, with a
// report of 4 pods and their leaders — the make bench-scale shape. The
// hub's memory grows with its Works; this is the model's share of it.
func BenchmarkModelBytes(b *testing.B) {
	const configs, clusters = 20, 100
	hash := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return hex.EncodeToString(sum[:])
	}
	for b.Loop() {
		before := env.LiveHeap()
		s, err := state.New()
		if err != nil {
			b.Fatal(err)
		}
		at := time.Unix(1000, 0)
		for c := range configs {
			config := types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", c), Name: fmt.Sprintf("operator-%d", c)}
			for m := range clusters {
				cluster := fmt.Sprintf("member-%04d", m)
				route := func(gen int64) *ctrlmeshv1alpha1.ShardRoute {
					r := &ctrlmeshv1alpha1.ShardRoute{
						TypeMeta:   metav1.TypeMeta{APIVersion: ctrlmeshv1alpha1.GroupVersion.String(), Kind: "ShardRoute"},
						ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: config.Name},
						Spec: ctrlmeshv1alpha1.ShardRouteSpec{Cluster: cluster, RoutingGeneration: gen, Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
							RulesHash: hash(fmt.Sprint(config, cluster, gen))},
					}
					for i := range 4 {
						r.Spec.Shards = append(r.Spec.Shards, ctrlmeshv1alpha1.RouteShard{ID: fmt.Sprint(i), Buckets: fmt.Sprintf("%d-%d", 8*i, 8*i+7),
							Pods: []ctrlmeshv1alpha1.RoutePod{{Name: fmt.Sprintf("%s-%d", config.Name, i), Address: fmt.Sprintf("10.%d.%d.%d", m/250, m%250, i)}}})
					}
					return r
				}
				report := &state.Report{RulesApplied: &metav1.Condition{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue,
					Reason: "Applied", Message: "every proxy applied the rules", LastTransitionTime: metav1.NewTime(at)}}
				for i := range 4 {
					pod := fmt.Sprintf("%s-%d", config.Name, i)
					report.Pods = append(report.Pods, state.Pod{Name: pod, Address: fmt.Sprintf("10.%d.%d.%d", m/250, m%250, i), Ready: true,
						AppliedRulesHash: hash(fmt.Sprint(config, cluster, 3))})
					report.Leaders = append(report.Leaders, state.Leader{Shard: fmt.Sprint(i), Pod: pod})
				}
				if _, err := s.ReadBack(config, cluster, route(1), report, at); err != nil {
					b.Fatal(err)
				}
				for gen := int64(2); gen <= 3; gen++ {
					if err := s.RecordPublish(config, cluster, route(gen), at); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
		after := env.LiveHeap()
		b.ReportMetric(float64(after-before)/(configs*clusters), "B/work")
		runtime.KeepAlive(s)
	}
}
