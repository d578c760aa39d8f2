package shardingconfig_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestPoliciesRideInTheWork: a CircuitBreaker naming a ShardingConfig
// lands in the ShardRoute of its Work with its generation; an update of
// it publishes a new generation of the rules with a new hash; deleted, it
// leaves the Work.
func TestPoliciesRideInTheWork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, stopHub := startHub(t)
	defer stopHub()
	member := unique("policies-member")
	joinCluster(t, ctx, member)
	namespace := unique("policies-ops")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	sc := configOver(namespace, ctrlmeshv1alpha1.ScopePerCluster, member)
	env.Create(t, ctx, hub.Client, sc)
	cb := &ctrlmeshv1alpha1.CircuitBreaker{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "guard"}, Spec: ctrlmeshv1alpha1.CircuitBreakerSpec{
		ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: sc.Name},
		Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "cm", FailureRatioPercent: ptr.To[int32](50),
			Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}}}}},
	}}
	env.Create(t, ctx, hub.Client, cb)
	carried := func(want int64) (*ctrlmeshv1alpha1.ShardRoute, error) {
		work, err := workOf(t, ctx, sc, member)
		if err != nil {
			return nil, err
		}
		route, err := routework.Decode(work)
		if err != nil {
			return nil, err
		}
		var got int64
		if p := route.Spec.Policies; p != nil && len(p.CircuitBreakers) == 1 && p.CircuitBreakers[0].Name == "guard" {
			got = p.CircuitBreakers[0].Generation
		}
		if got != want {
			return route, fmt.Errorf("the Work carries CircuitBreaker guard at generation %d, want %d (policies %+v)", got, want, route.Spec.Policies)
		}
		return route, nil
	}
	var first *ctrlmeshv1alpha1.ShardRoute
	env.Eventually(t, 30*time.Second, "the CircuitBreaker in the Work", func() (err error) {
		first, err = carried(1)
		return err
	})
	if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(cb), cb); err != nil {
		t.Fatal(err)
	}
	cb.Spec.Breakers[0].OpenSeconds = 90
	if err := hub.Client.Update(ctx, cb); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the updated CircuitBreaker in the Work", func() error {
		route, err := carried(2)
		if err != nil {
			return err
		}
		if route.Spec.RulesHash == first.Spec.RulesHash || route.Spec.RoutingGeneration <= first.Spec.RoutingGeneration {
			return fmt.Errorf("generation %d hash %s after generation %d hash %s", route.Spec.RoutingGeneration, route.Spec.RulesHash, first.Spec.RoutingGeneration, first.Spec.RulesHash)
		}
		return nil
	})
	if err := hub.Client.Delete(ctx, cb); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the deleted CircuitBreaker out of the Work", func() error {
		_, err := carried(0)
		return err
	})
}
