package clusters_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/clusters"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestKarmadaOwnsExecutionNamespaces runs the controller on a real Karmada
// control plane, as an admin who could create any namespace: an accepted
// member Karmada does not know gets no execution namespace from the hub,
// only, once its agent heartbeats, its Available condition saying to join it
// to Karmada; once Karmada has a
// Cluster of that name, Karmada's cluster controller makes karmada-es-<name>
// and the hub never wrote it.
func TestKarmadaOwnsExecutionNamespaces(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kfleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "karmada", Karmada: true}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := kfleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	karmada := kfleet.Cluster("karmada")

	// The controller's writes carry this field manager.
	const manager = "ctrlmesh-hub-under-test"
	cfg := rest.CopyConfig(karmada.Config)
	cfg.UserAgent = manager
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: kfleet.Scheme, Logger: logr.Discard(), Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	store, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := (&clusters.Reconciler{Store: store, Options: clusters.Options{AutoAccept: true, RulesValidity: testRulesValidity}}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	// Stopped before the fleet (deferred, so it runs before kfleet.Stop).
	_, stopMgr := env.StartManager(t, mgr)
	defer stopMgr()

	const name = "edge-1"
	executionSpace := executionNamespace(name)
	if err := karmada.Client.Create(ctx, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	// The controller writes the conditions after it saw to the namespace:
	// once HubAccepted is True, it has passed there with the cluster
	// accepted.
	env.Eventually(t, time.Minute, "the cluster accepted", func() error {
		var mc clusterv1.ManagedCluster
		if err := karmada.Client.Get(ctx, client.ObjectKey{Name: name}, &mc); err != nil {
			return err
		}
		for _, c := range mc.Status.Conditions {
			if c.Type == hubAccepted && c.Status == metav1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", mc.Status.Conditions)
	})
	err = karmada.Client.Get(ctx, client.ObjectKey{Name: executionSpace}, &corev1.Namespace{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("namespace %s of a member Karmada does not know: %v, want NotFound (Karmada owns it)", executionSpace, err)
	}
	// The member's agent heartbeats in its cluster namespace (the hub
	// admin's on Karmada): Karmada's part is all that is missing.
	env.Create(t, ctx, karmada.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ctrlmeshv1alpha1.ClusterNamespace(name)}})
	hb := &membership.Heartbeat{Hub: karmada.Client, ClusterName: name, Identity: "agent-0", LeaseDuration: 10 * time.Minute}
	if err := hb.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, time.Minute, "Available False with "+ctrlmeshv1alpha1.ReasonKarmadaClusterNotFound, func() error {
		var mc clusterv1.ManagedCluster
		if err := karmada.Client.Get(ctx, client.ObjectKey{Name: name}, &mc); err != nil {
			return err
		}
		for _, c := range mc.Status.Conditions {
			if c.Type == clusterv1.ManagedClusterConditionAvailable && c.Status == metav1.ConditionFalse && c.Reason == ctrlmeshv1alpha1.ReasonKarmadaClusterNotFound {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", mc.Status.Conditions)
	})

	// The member joins Karmada (pull mode needs no member credentials in
	// Karmada): Karmada's cluster controller makes the namespace.
	if err := karmada.Client.Create(ctx, &clusterv1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: clusterv1alpha1.ClusterSpec{SyncMode: clusterv1alpha1.Pull, APIEndpoint: "https://127.0.0.1:6443"}}); err != nil {
		t.Fatal(err)
	}
	var ns corev1.Namespace
	env.Eventually(t, 2*time.Minute, "Karmada's execution namespace "+executionSpace, func() error {
		return karmada.Client.Get(ctx, client.ObjectKey{Name: executionSpace}, &ns)
	})
	var managers []string
	for _, f := range ns.ManagedFields {
		managers = append(managers, f.Manager)
	}
	if slices.Contains(managers, manager) || len(managers) == 0 {
		t.Errorf("namespace %s written by %v; want Karmada's writes only", executionSpace, managers)
	}
	t.Logf("namespace %s written by %v", executionSpace, managers)
	if err := karmada.Karmada.Err(); err != nil {
		t.Error(err)
	}
}
