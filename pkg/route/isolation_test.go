package route

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// TestBuildCarriesIsolation: the ShardingConfig's isolation reaches every
// member's ShardRoute as written, and is covered by the rules hash, so a
// proxy reports which isolation it enforces.
func TestBuildCarriesIsolation(t *testing.T) {
	base := buildCases()[0]
	config := base.config.DeepCopy()
	config.Spec.Isolation = &ctrlmeshv1alpha1.NamespaceIsolation{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}},
		NamespaceRegex:    "^team-",
	}
	isolated, err := Build(config, base.cluster, base.table(t), testAddresses, FleetValidity)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(isolated.Spec.Isolation, config.Spec.Isolation) {
		t.Fatalf("route isolation %+v, want the config's %+v", isolated.Spec.Isolation, config.Spec.Isolation)
	}
	plain, err := Build(base.config, base.cluster, base.table(t), testAddresses, FleetValidity)
	if err != nil {
		t.Fatal(err)
	}
	if plain.Spec.Isolation != nil {
		t.Fatalf("a config without isolation built a route with %+v", plain.Spec.Isolation)
	}
	if plain.Spec.RulesHash == isolated.Spec.RulesHash {
		t.Fatal("isolation leaves the rules hash as it was")
	}
	changed := isolated.Spec.DeepCopy()
	changed.Isolation.NamespaceSelector.MatchLabels["tenant"] = "b"
	if RulesHash(changed) == isolated.Spec.RulesHash {
		t.Fatal("changing the isolation selector leaves the rules hash as it was")
	}
}
