package routestatus_test

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// TestSubsetNamespaces: the agent reports, per subset with namespace
// rules, the member's namespaces its selector and regex both match, and
// follows a namespace relabelled in and out.
func TestSubsetNamespaces(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	route := newRoute(ns, "h1", 1)
	route.Spec.Subsets = []ctrlmeshv1alpha1.RouteSubset{
		{Name: "v2", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"version": "v2"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"subset-test": "v2"}}, NamespaceRegex: "^sub-"},
		{Name: "plain", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "plain"}}},
	}
	create(t, route)
	for _, n := range []struct {
		name  string
		value string
	}{{"sub-a", "v2"}, {"sub-b", "v2"}, {"other-c", "v2"}, {"sub-d", "v1"}} {
		create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{"subset-test": n.value}}})
	}
	reported := func(r *ctrlmeshv1alpha1.ShardRoute) string {
		return fmt.Sprint(r.Status.Subsets)
	}
	waitFor(t, route, "the v2 subset's namespaces", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return len(r.Status.Subsets) == 1 && r.Status.Subsets[0].Name == "v2" && slices.Equal(r.Status.Subsets[0].Namespaces, []string{"sub-a", "sub-b"})
	})
	var moved corev1.Namespace
	if err := admin.Get(ctx, client.ObjectKey{Name: "sub-d"}, &moved); err != nil {
		t.Fatal(err)
	}
	moved.Labels["subset-test"] = "v2"
	if err := admin.Update(ctx, &moved); err != nil {
		t.Fatal(err)
	}
	waitFor(t, route, "a namespace relabelled in", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return len(r.Status.Subsets) == 1 && slices.Equal(r.Status.Subsets[0].Namespaces, []string{"sub-a", "sub-b", "sub-d"})
	})
	if err := admin.Get(ctx, client.ObjectKey{Name: "sub-a"}, &moved); err != nil {
		t.Fatal(err)
	}
	moved.Labels["subset-test"] = "none"
	if err := admin.Update(ctx, &moved); err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, route, "a namespace relabelled out", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return len(r.Status.Subsets) == 1 && slices.Equal(r.Status.Subsets[0].Namespaces, []string{"sub-b", "sub-d"})
	})
	t.Logf("reported %s", reported(got))
}
