// Package policies holds the traffic-policy examples of the README and
// docs/design.md; the test keeps them valid against the CRDs.
package policies

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestExamplesAreValid creates each example on a real API server with the
// ctrlmesh CRDs: the examples the docs show are ones users can apply.
func TestExamplesAreValid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	c := fleet.Cluster("hub").Client
	for file, obj := range map[string]client.Object{
		"circuitbreaker.yaml": &ctrlmeshv1alpha1.CircuitBreaker{},
		"faultinjection.yaml": &ctrlmeshv1alpha1.FaultInjection{},
		// External hosts, through the proxy's forward proxy.
		"external-circuitbreaker.yaml": &ctrlmeshv1alpha1.CircuitBreaker{},
		"external-faultinjection.yaml": &ctrlmeshv1alpha1.FaultInjection{},
	} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(data, obj); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: obj.GetNamespace()}}
		if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if err := c.Create(ctx, obj); err != nil {
			t.Errorf("%s: %v", file, fmt.Errorf("the API server refuses it: %w", err))
		}
	}
}
