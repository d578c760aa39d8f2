package rules

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// MapperScopes answers Scopes from a RESTMapper, normally a discovery-backed
// one that learns new resources as they appear. Answers are cached: a
// resource's scope never changes, and the proxy asks on every request.
// Failures are not cached, so a resource that appears later is found.
type MapperScopes struct {
	mapper meta.RESTMapper
	mu     sync.RWMutex
	known  map[schema.GroupResource]bool
}

// NewMapperScopes returns Scopes backed by mapper.
func NewMapperScopes(mapper meta.RESTMapper) *MapperScopes {
	return &MapperScopes{mapper: mapper, known: map[schema.GroupResource]bool{}}
}

// IsNamespaced reports whether the API server serves gr, and whether it is namespaced.
func (m *MapperScopes) IsNamespaced(gr schema.GroupResource) (bool, error) {
	m.mu.RLock()
	namespaced, ok := m.known[gr]
	m.mu.RUnlock()
	if ok {
		return namespaced, nil
	}
	gvk, err := m.mapper.KindFor(gr.WithVersion(""))
	if err != nil {
		return false, fmt.Errorf("the API server does not serve it: %w", err)
	}
	mapping, err := m.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return false, fmt.Errorf("mapping %s: %w", gvk, err)
	}
	namespaced = mapping.Scope.Name() == meta.RESTScopeNameNamespace
	m.mu.Lock()
	m.known[gr] = namespaced
	m.mu.Unlock()
	return namespaced, nil
}
