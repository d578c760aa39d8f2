package shardingconfig_test

import (
	"context"
	"errors"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestSlowConfigHoldsUpNoOther: a ShardingConfig whose Works take long to
// write (a reconcile waits on the API server for each of its members'
// Works) does not keep another ShardingConfig from being published. With
// one worker, 100 configs over 100 members queued behind each other for
// half an hour (make bench-scale).
func TestSlowConfigHoldsUpNoOther(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	slowNS, fastNS := unique("slow-ops"), unique("fast-ops")
	release := make(chan struct{})
	defer close(release)
	_, stopHub := startHubWriting(t, func(c client.Client) client.Client {
		return &heldWrites{Client: c, release: release, hold: func(w *workv1alpha1.Work) bool {
			return w.Labels[ctrlmeshv1alpha1.WorkConfigNamespaceLabel] == slowNS
		}}
	})
	defer stopHub()
	member := unique("workers-member")
	joinCluster(t, ctx, member)
	for _, ns := range []string{slowNS, fastNS} {
		env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	slow := configOver(slowNS, ctrlmeshv1alpha1.ScopePerCluster, member)
	env.Create(t, ctx, hub.Client, slow)
	env.Eventually(t, 30*time.Second, "the slow config's reconcile under way", func() error {
		var sc ctrlmeshv1alpha1.ShardingConfig
		if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(slow), &sc); err != nil {
			return err
		}
		if len(sc.Finalizers) == 0 {
			return errors.New("no finalizer yet")
		}
		return nil
	})
	fast := configOver(fastNS, ctrlmeshv1alpha1.ScopePerCluster, member)
	env.Create(t, ctx, hub.Client, fast)
	env.Eventually(t, time.Minute, "the other config's Work published while the slow one's waits", func() error {
		_, err := workOf(t, ctx, fast, member)
		return err
	})
	if _, err := workOf(t, ctx, slow, member); err == nil {
		t.Fatal("the slow config's Work was written: the test did not hold its reconcile")
	}
}

// TestSlowMemberHoldsUpNoOther: a member whose Work takes long to write
// does not keep the config's other members from getting theirs: in
// PerCluster scope each member is placed and published on its own
// (DomainWorkers at once). One at a time, 100 configs over 100 members took
// 18.7 min to Ready (make bench-scale).
func TestSlowMemberHoldsUpNoOther(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The held member sorts first: the members are placed in name order.
	held, other := unique("a-held-member"), unique("b-other-member")
	release := make(chan struct{})
	defer close(release)
	_, stopHub := startHubWriting(t, func(c client.Client) client.Client {
		return &heldWrites{Client: c, release: release, hold: func(w *workv1alpha1.Work) bool {
			return w.Namespace == routework.WorkKey(held, "any", "any").Namespace
		}}
	})
	defer stopHub()
	joinCluster(t, ctx, held)
	joinCluster(t, ctx, other)
	ns := unique("members-ops")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	sc := configOver(ns, ctrlmeshv1alpha1.ScopePerCluster, held, other)
	env.Create(t, ctx, hub.Client, sc)
	env.Eventually(t, time.Minute, "the other member's Work published while the held one's waits", func() error {
		_, err := workOf(t, ctx, sc, other)
		return err
	})
	if _, err := workOf(t, ctx, sc, held); err == nil {
		t.Fatal("the held member's Work was written: the test did not hold it")
	}
}

// heldWrites holds the creation of the Works hold picks until release is
// closed.
type heldWrites struct {
	client.Client
	release <-chan struct{}
	hold    func(*workv1alpha1.Work) bool
}

func (h *heldWrites) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if w, ok := obj.(*workv1alpha1.Work); ok && h.hold(w) {
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.Client.Create(ctx, obj, opts...)
}
