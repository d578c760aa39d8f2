// Package rbacutil assembles and renders the RBAC that ctrlmesh's
// components ship: each component states the rules its parts need, and the
// rendered manifests in deploy/rbac are generated from them.
package rbacutil

import (
	"bytes"
	"fmt"
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// Merge merges the rules that name the same groups, resources and resource
// names, uniting their verbs, so that a role lists each resource once.
func Merge(in ...[]rbacv1.PolicyRule) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, r := range slices.Concat(in...) {
		i := slices.IndexFunc(out, func(o rbacv1.PolicyRule) bool {
			return slices.Equal(o.APIGroups, r.APIGroups) && slices.Equal(o.Resources, r.Resources) && slices.Equal(o.ResourceNames, r.ResourceNames)
		})
		if i < 0 {
			out = append(out, *r.DeepCopy())
			continue
		}
		for _, v := range r.Verbs {
			if !slices.Contains(out[i].Verbs, v) {
				out[i].Verbs = append(out[i].Verbs, v)
			}
		}
	}
	return out
}

// Render renders objects as multi-document YAML for kubectl apply, after
// header (comment lines).
func Render(header string, objects []client.Object) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(header)
	for _, obj := range objects {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return nil, fmt.Errorf("rendering %T %s: %w", obj, obj.GetName(), err)
		}
		b.WriteString("---\n")
		b.Write(data)
	}
	return b.Bytes(), nil
}
