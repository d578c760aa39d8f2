package rules

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// MapperScopes answers Scopes from a RESTMapper, normally a discovery-backed
// one that learns new resources as they appear.
type MapperScopes struct {
	Mapper meta.RESTMapper
}

// IsNamespaced reports whether the API server serves gr, and whether it is namespaced.
func (m MapperScopes) IsNamespaced(gr schema.GroupResource) (bool, error) {
	gvk, err := m.Mapper.KindFor(gr.WithVersion(""))
	if err != nil {
		return false, fmt.Errorf("the API server does not serve it: %w", err)
	}
	mapping, err := m.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return false, fmt.Errorf("mapping %s: %w", gvk, err)
	}
	return mapping.Scope.Name() == meta.RESTScopeNameNamespace, nil
}
