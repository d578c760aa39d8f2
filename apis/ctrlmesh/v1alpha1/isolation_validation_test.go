package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// TestIsolationValidation runs the isolation rules against the real API
// server: the messages are what a user reads.
func TestIsolationValidation(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name      string
		isolation *ctrlmeshv1alpha1.NamespaceIsolation
		// want is a part of the API server's message; "" means accepted.
		want string
	}{
		{name: "selector", isolation: &ctrlmeshv1alpha1.NamespaceIsolation{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}}}},
		{name: "regex", isolation: &ctrlmeshv1alpha1.NamespaceIsolation{NamespaceRegex: "^team-a-"}},
		{name: "both", isolation: &ctrlmeshv1alpha1.NamespaceIsolation{
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "ns-type", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"system"}}}},
			NamespaceRegex:    "^canary.*"}},
		{name: "empty", isolation: &ctrlmeshv1alpha1.NamespaceIsolation{},
			want: "isolation must set namespaceSelector (labels of the Namespaces the operator may use) or namespaceRegex"},
		{name: "invalid regex", isolation: &ctrlmeshv1alpha1.NamespaceIsolation{NamespaceRegex: "^team-(a"},
			want: "namespaceRegex must be a valid RE2 regular expression"},
		{name: "regex too long", isolation: &ctrlmeshv1alpha1.NamespaceIsolation{NamespaceRegex: fmt.Sprintf("%0300d", 0)},
			want: "spec.isolation.namespaceRegex: Too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := validShardingConfig("")
			sc.GenerateName = "isolation-"
			sc.Spec.Isolation = tt.isolation
			err := cluster.Client.Create(ctx, sc)
			checkVerdict(t, err, tt.want)
		})
	}
}

// TestIsolationScenarioIsValid: the worked example in scenarios/isolation
// is accepted by the API server as written.
func TestIsolationScenarioIsValid(t *testing.T) {
	data, err := os.ReadFile("../../../scenarios/isolation/shardingconfig.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sc := &ctrlmeshv1alpha1.ShardingConfig{}
	if err := yaml.UnmarshalStrict(data, sc); err != nil {
		t.Fatal(err)
	}
	sc.Namespace = "default"
	if err := cluster.Client.Create(context.Background(), sc); err != nil {
		t.Fatalf("the scenario's ShardingConfig is refused: %v", err)
	}
	if sc.Spec.Isolation == nil || sc.Spec.Isolation.NamespaceRegex == "" || sc.Spec.Isolation.NamespaceSelector == nil {
		t.Fatalf("the scenario lost its isolation: %+v", sc.Spec.Isolation)
	}
}
