// Package scheme builds the runtime.Scheme that ctrlmesh's binaries and tests
// use: the built-in Kubernetes types plus ctrlmesh, Karmada Work and OCM
// cluster APIs. It is a constructor, not a package-level registry, so every
// caller gets its own scheme.
package scheme

import (
	"fmt"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// New returns a scheme with every API ctrlmesh reads or writes.
func New() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, api := range []struct {
		name string
		add  func(*runtime.Scheme) error
	}{
		{"kubernetes", clientgoscheme.AddToScheme},
		{"ctrlmesh.io", ctrlmeshv1alpha1.AddToScheme},
		{"work.karmada.io", workv1alpha1.Install},
		{"cluster.open-cluster-management.io", clusterv1.Install},
	} {
		if err := api.add(s); err != nil {
			return nil, fmt.Errorf("adding the %s APIs to the scheme: %w", api.name, err)
		}
	}
	return s, nil
}
