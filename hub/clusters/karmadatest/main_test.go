// Package karmadatest tests the hub's clusters controller against a real
// Karmada control plane: Karmada's own Cluster objects, served by
// karmada-aggregated-apiserver and kept by karmada-controller-manager and
// karmada-agent, decide whether a member is usable. The package holds tests
// only; it is apart from hub/clusters, whose tests run on a plain hub.
package karmadatest_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The Karmada control plane, which is the hub, and its members: member1
// joined in push mode (a Cluster as karmadactl join writes it), member2 in
// pull mode (karmada-agent registers it).
var (
	fleet            *env.Fleet
	karmada          *env.Cluster
	member1, member2 *env.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "karmada", Karmada: true}, {Name: "member1"}, {Name: "member2"}}},
		func(ctx context.Context, f *env.Fleet) (func(), error) {
			fleet, karmada, member1, member2 = f, f.Cluster("karmada"), f.Cluster("member1"), f.Cluster("member2")
			if err := controlplane.JoinPush(ctx, karmada, member1); err != nil {
				return nil, err
			}
			if err := controlplane.JoinPull(ctx, karmada, member2); err != nil {
				return nil, err
			}
			// Both Clusters Ready before any test: the tests judge by them.
			ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			for _, name := range []string{member1.Name, member2.Name} {
				for {
					var c clusterv1alpha1.Cluster
					err := karmada.Client.Get(ctx, client.ObjectKey{Name: name}, &c)
					if err == nil && meta.IsStatusConditionTrue(c.Status.Conditions, clusterv1alpha1.ClusterConditionReady) {
						break
					}
					if ctx.Err() != nil {
						return nil, fmt.Errorf("karmada's Cluster %s not Ready: %v (%+v)", name, err, c.Status.Conditions)
					}
					time.Sleep(200 * time.Millisecond)
				}
			}
			return nil, nil
		}))
}

// kubeSystemUID is a cluster's ID, as Karmada and the agent read it.
func kubeSystemUID(t *testing.T, ctx context.Context, c *env.Cluster) string {
	t.Helper()
	var ns corev1.Namespace
	if err := c.Client.Get(ctx, client.ObjectKey{Name: metav1.NamespaceSystem}, &ns); err != nil {
		t.Fatal(err)
	}
	return string(ns.UID)
}
