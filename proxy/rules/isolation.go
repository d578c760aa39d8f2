package rules

import (
	"fmt"
	"regexp"
	"slices"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// NoNamespace stands in the ownership of a shard that isolation leaves no
// namespace: a valid label value and a name no namespace can have (a
// namespace is a DNS label, without "_"). Narrowed to it, a list is empty
// and a watch sends nothing, rather than the 503 of a pod in no shard — the
// operator's informers sync on an empty view.
const NoNamespace = "ctrlmesh_none"

// Isolation is a route's compiled namespace isolation: the namespaces whose
// labels match Selector and whose name matches Regex (each when set).
type Isolation struct {
	// Selector on the Namespaces' labels; labels.Everything() when unset.
	Selector labels.Selector
	// Regex the name must match; nil when unset.
	Regex *regexp.Regexp
}

// CompileIsolation compiles a route's isolation; nil for none.
func CompileIsolation(in *ctrlmeshv1alpha1.NamespaceIsolation) (*Isolation, error) {
	if in == nil {
		return nil, nil
	}
	if in.NamespaceSelector == nil && in.NamespaceRegex == "" {
		return nil, fmt.Errorf("isolation sets neither namespaceSelector nor namespaceRegex")
	}
	iso := &Isolation{Selector: labels.Everything()}
	if in.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(in.NamespaceSelector)
		if err != nil {
			return nil, fmt.Errorf("isolation.namespaceSelector: %w", err)
		}
		iso.Selector = sel
	}
	if in.NamespaceRegex != "" {
		re, err := regexp.Compile(in.NamespaceRegex)
		if err != nil {
			return nil, fmt.Errorf("isolation.namespaceRegex: %w", err)
		}
		iso.Regex = re
	}
	return iso, nil
}

// Admits reports whether a namespace of this name and these labels is inside.
func (i *Isolation) Admits(name string, nsLabels map[string]string) bool {
	return (i.Regex == nil || i.Regex.MatchString(name)) && i.Selector.Matches(labels.Set(nsLabels))
}

// String describes the isolation for messages.
func (i *Isolation) String() string {
	switch {
	case i.Regex == nil:
		return fmt.Sprintf("namespaces labeled %q", i.Selector.String())
	case i.Selector.Empty():
		return fmt.Sprintf("namespaces named like %q", i.Regex.String())
	}
	return fmt.Sprintf("namespaces labeled %q and named like %q", i.Selector.String(), i.Regex.String())
}

func (i *Isolation) equal(other *Isolation) bool {
	if i == nil || other == nil {
		return i == other
	}
	return i.Selector.String() == other.Selector.String() && (i.Regex == nil) == (other.Regex == nil) &&
		(i.Regex == nil || i.Regex.String() == other.Regex.String())
}

// Isolated is s under its isolation, with inside the namespaces the proxy
// confirmed inside (sorted or not; nil when it could confirm none): the
// shard's ownership shrinks to the namespaces it owns among them, so every
// narrowed list and watch, every fenced write and every selection change
// follows the Namespaces' labels by the same code as a bucket move. A
// snapshot without isolation is returned as it is.
func (s *Snapshot) Isolated(inside []string) *Snapshot {
	if s.Isolation == nil {
		return s
	}
	c := *s
	if !s.isolated {
		c.base, c.isolated = s.Ownership, true
	}
	c.inside = slices.Clone(inside)
	sort.Strings(c.inside)
	c.inside = slices.Compact(c.inside)
	if !c.base.IsEmpty() {
		var owned []string
		for _, ns := range c.inside {
			if c.base.Owns(ns) {
				owned = append(owned, ns)
			}
		}
		if len(owned) == 0 {
			owned = []string{NoNamespace}
		}
		empty, _ := c.base.Buckets.Space().NewSet()
		c.Ownership = sharding.NewOwnership(empty, owned, nil)
	}
	return &c
}

// Inside reports whether the pod may see and write namespace ns: always
// without isolation; with it, only a namespace confirmed inside.
func (s *Snapshot) Inside(ns string) bool {
	if s.Isolation == nil {
		return true
	}
	_, found := slices.BinarySearch(s.inside, ns)
	return found
}

// sameIsolation reports whether both (non-nil) snapshots isolate alike over
// the same namespaces.
func (s *Snapshot) sameIsolation(other *Snapshot) bool {
	return s.Isolation.equal(other.Isolation) && slices.Equal(s.inside, other.inside)
}
