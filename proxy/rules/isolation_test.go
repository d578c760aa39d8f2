package rules

import (
	"fmt"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

func isolated(t *testing.T, pod string) *Snapshot {
	t.Helper()
	snap, err := Compile(testRoute(func(r *ctrlmeshv1alpha1.ShardRoute) {
		r.Spec.Isolation = &ctrlmeshv1alpha1.NamespaceIsolation{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}}, NamespaceRegex: "^team-"}
	}), pod, ModeLabel, served)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestIsolated: isolation shrinks a shard's ownership to the namespaces
// it owns among those inside, exactly (so that label mode can state it),
// leaves a shard with none owning only NoNamespace, and re-isolating starts
// from the shard's own ownership, so that a namespace let back in returns.
func TestIsolated(t *testing.T) {
	space := sharding.MustSpace(32)
	// Namespaces of op-0's shard (buckets 0-15) and of shard 1 (16-29).
	var mine, theirs []string
	for i := range 200 {
		ns := fmt.Sprintf("team-%d", i)
		if b := space.Bucket(ns); b < 16 && ns != "team-a" {
			mine = append(mine, ns)
		} else if b >= 16 && b < 30 {
			theirs = append(theirs, ns)
		}
	}
	snap := isolated(t, "op-0")
	inside := append(slices.Clone(mine[:3]), theirs[0], "team-a")
	got := snap.Isolated(inside)
	empty, _ := space.NewSet()
	if want := sharding.NewOwnership(empty, mine[:3], nil); !got.Ownership.Equal(want) {
		t.Errorf("isolated ownership %s, want %s", got.Ownership, want)
	}
	if _, err := got.Ownership.LabelRequirements(); err != nil {
		t.Errorf("an isolated ownership cannot be stated in label mode: %v", err)
	}
	for _, ns := range []string{mine[0], theirs[0], "team-a"} {
		if !got.Inside(ns) {
			t.Errorf("%s is not inside", ns)
		}
	}
	if got.Inside(mine[4]) || got.Owns(mine[4]) || got.Owns(theirs[0]) || got.Owns("team-a") {
		t.Error("a namespace outside, or another shard's, is owned")
	}
	none := snap.Isolated(nil)
	if !none.Serving() || !slices.Equal(none.Ownership.Included, []string{NoNamespace}) || none.Owns(mine[0]) {
		t.Errorf("nothing inside: ownership %s, want only %s", none.Ownership, NoNamespace)
	}
	back := none.Isolated(mine[:1])
	if !back.Owns(mine[0]) {
		t.Errorf("re-isolated over %s, the shard does not own it again: %s", mine[0], back.Ownership)
	}
	if got.SameSelection(snap.Isolated(inside[:2])) {
		t.Error("other namespaces inside, yet the same selection")
	}
	// A namespace inside that the shard does not own changes no sharded
	// selection, but it does change the unsharded one, which follows every
	// namespace inside.
	other := snap.Isolated(append(slices.Clone(inside), theirs[1]))
	if !got.SameSelectionOf(other, schema.GroupResource{Resource: "configmaps"}) {
		t.Error("the sharded selection changed with a namespace of another shard")
	}
	if got.SameSelectionOf(other, schema.GroupResource{Resource: "pods"}) {
		t.Error("the unsharded selection did not change with the namespaces inside")
	}
	if unisolated := isolatedFree(t); !unisolated.Isolated([]string{"x"}).Inside("anything") {
		t.Error("a snapshot without isolation refuses a namespace")
	}
}

func isolatedFree(t *testing.T) *Snapshot {
	t.Helper()
	snap, err := Compile(testRoute(nil), "op-0", ModeRange, served)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestIsolationAdmits: the selector and the regex both must match.
func TestIsolationAdmits(t *testing.T) {
	iso, err := CompileIsolation(&ctrlmeshv1alpha1.NamespaceIsolation{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}}, NamespaceRegex: "^team-"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{"team-x", map[string]string{"tenant": "a"}, true},
		{"team-x", map[string]string{"tenant": "b"}, false},
		{"other", map[string]string{"tenant": "a"}, false},
		{"my-team-x", map[string]string{"tenant": "a"}, false},
	} {
		if got := iso.Admits(tt.name, tt.labels); got != tt.want {
			t.Errorf("Admits(%s, %v) = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
	if _, err := CompileIsolation(&ctrlmeshv1alpha1.NamespaceIsolation{NamespaceRegex: "(("}); err == nil {
		t.Error("an invalid regex compiled")
	}
}
