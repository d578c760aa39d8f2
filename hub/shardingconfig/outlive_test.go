package shardingconfig_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestMemberOutsideOutlivesItsRules: in Fleet scope, a member outside the
// domain that takes no new rules while its heartbeat has not lapsed — here
// one deselected while nothing applies its Work (its agent's report stays
// as it was, its heartbeat lasts 10 minutes); on Karmada, one whose Cluster
// is not Ready while its agent heartbeats (test/e2e
// TestKarmadaFleetScope) — never acknowledges the revocation of its pod's
// buckets, which the hub publishes to it first. The hub grants them to the
// other member's pod once no proxy of the member can still serve the rules
// before: route.LapseBound of the rules validity after it published the
// revocation, never sooner, and not only once the heartbeat lapses.
func TestMemberOutsideOutlivesItsRules(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The shortest the ShardRoute CRD allows: route.LapseBound = 7.5 s.
	const validity = 5 * time.Second
	startHubWith(t, validity)
	c1, c2 := unique("outlive-a"), unique("outlive-b")
	joinCluster(t, ctx, c1)
	joinCluster(t, ctx, c2)
	namespace := unique("outlive-ops")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	sc := configOver(namespace, ctrlmeshv1alpha1.ScopeFleet, c1, c2)
	env.Create(t, ctx, hub.Client, sc)

	// Each member's agent, simulated: it reports its pod ready, its proxy
	// enforcing whatever the Work carries, until stopped.
	pods := map[string]string{c1: "a-0", c2: "b-0"}
	config := client.ObjectKeyFromObject(sc)
	stopAgent := map[string]func(){}
	for c, pod := range pods {
		agentCtx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for agentCtx.Err() == nil {
				// Errors (a conflict, no Work yet) are retried.
				_ = reportCurrent(agentCtx, config, c, pod)
				select {
				case <-agentCtx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
		stopAgent[c] = func() { stop(); wg.Wait() }
		t.Cleanup(stopAgent[c])
	}
	routeOf := func(cluster string) (*ctrlmeshv1alpha1.ShardRoute, error) {
		work, err := workOf(t, ctx, sc, cluster)
		if err != nil {
			return nil, err
		}
		return routework.Decode(work)
	}
	// shardOf is the shard listing pod in the route, if any.
	shardOf := func(r *ctrlmeshv1alpha1.ShardRoute, pod string) (ctrlmeshv1alpha1.RouteShard, bool) {
		i := slices.IndexFunc(r.Spec.Shards, func(s ctrlmeshv1alpha1.RouteShard) bool {
			return slices.ContainsFunc(s.Pods, func(p ctrlmeshv1alpha1.RoutePod) bool { return p.Name == pod })
		})
		if i < 0 {
			return ctrlmeshv1alpha1.RouteShard{}, false
		}
		return r.Spec.Shards[i], true
	}
	env.Eventually(t, time.Minute, "a shard serving in each member, nothing pending", func() error {
		for c, pod := range pods {
			r, err := routeOf(c)
			if err != nil {
				return err
			}
			if s, ok := shardOf(r, pod); !ok || s.Buckets == "" || s.PendingBuckets != "" {
				return fmt.Errorf("%s: the shard of %s is %+v (listed: %t)", c, pod, s, ok)
			}
		}
		return nil
	})

	// c2 takes no new rules any more (its agent reports nothing new; its
	// heartbeat stays fresh for 10 minutes) and is deselected.
	stopAgent[c2]()
	patch := client.MergeFrom(sc.DeepCopy())
	sc.Spec.Clusters.Names = []string{c1}
	if err := hub.Client.Patch(ctx, sc, patch); err != nil {
		t.Fatal(err)
	}
	var revokedAt time.Time
	env.Eventually(t, 30*time.Second, "the buckets of b-0 revoked in the Work of "+c2, func() error {
		r, err := routeOf(c2)
		if err != nil {
			return err
		}
		if s, ok := shardOf(r, "b-0"); ok {
			return fmt.Errorf("b-0 is in shard %+v", s)
		}
		revokedAt = time.Now()
		return nil
	})
	bound := route.LapseBound(validity)
	var grantedAt time.Time
	env.Eventually(t, bound+30*time.Second, "every bucket granted to a-0 in "+c1, func() error {
		r, err := routeOf(c1)
		if err != nil {
			return err
		}
		if s, ok := shardOf(r, "a-0"); !ok || s.Buckets != "0-31" || s.PendingBuckets != "" {
			return fmt.Errorf("the shard of a-0 is %+v (listed: %t)", s, ok)
		}
		grantedAt = time.Now()
		return nil
	})
	// The revocation was seen within 100 ms of its write, give or take a
	// request: a grant sooner than the bound after it would be one while
	// b-0's proxy may still serve the rules before.
	if waited := grantedAt.Sub(revokedAt); waited < bound-time.Second {
		t.Errorf("the buckets were granted %.1fs after the revocation, before the bound of %v", waited.Seconds(), bound)
	}
	t.Logf("the buckets of %s's pod granted %.1fs after its revocation was seen (bound %v)", c2, grantedAt.Sub(revokedAt).Seconds(), bound)
}

// reportCurrent reports, as the agent of cluster does, pod's proxy
// enforcing the rules the cluster's Work carries, unless it reported that.
func reportCurrent(ctx context.Context, config client.ObjectKey, cluster, pod string) error {
	work := &workv1alpha1.Work{}
	if err := hub.Client.Get(ctx, routework.WorkKey(cluster, config.Namespace, config.Name), work); err != nil {
		return err
	}
	r, err := routework.Decode(work)
	if err != nil {
		return err
	}
	status, err := routework.ReadStatus(work)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(status.Route.Pods, func(p ctrlmeshv1alpha1.PodRouteStatus) bool {
		return p.Name == pod && p.AppliedRulesHash == r.Spec.RulesHash
	}) {
		return nil
	}
	return writeReport(ctx, work, pod)
}
