// Package v1alpha1 holds the ctrlmesh.io/v1alpha1 API: ShardingConfig, which
// users write on the hub, and ShardRoute, the per-cluster rules object the hub
// sends to each member cluster inside a Karmada Work.
//
// +kubebuilder:object:generate=true
// +groupName=ctrlmesh.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of this package.
var GroupVersion = schema.GroupVersion{Group: "ctrlmesh.io", Version: "v1alpha1"}

// ShardRouteGVK is the group, version and kind of ShardRoute, the one
// manifest of the Karmada Works the hub writes.
var ShardRouteGVK = GroupVersion.WithKind("ShardRoute")

// AddToScheme registers the types of this package with a scheme. It is an
// explicit function, not an init() side effect, so that every binary states
// which APIs it speaks.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&ShardingConfig{}, &ShardingConfigList{},
		&ShardRoute{}, &ShardRouteList{},
		&CircuitBreaker{}, &CircuitBreakerList{},
		&FaultInjection{}, &FaultInjectionList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
