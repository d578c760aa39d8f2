package v1alpha1_test

import (
	"context"
	"os"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// TestSubsetValidation runs the subsets' rules against the real API server.
func TestSubsetValidation(t *testing.T) {
	ctx := context.Background()
	v2 := func() ctrlmeshv1alpha1.Subset {
		return ctrlmeshv1alpha1.Subset{Name: "v2", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"version": "v2"}}, Buckets: "0-3", Namespaces: []string{"team-a"}}
	}
	tests := []struct {
		name    string
		subsets func() []ctrlmeshv1alpha1.Subset
		// want is a part of the API server's message; "" means accepted.
		want string
	}{
		{name: "one subset", subsets: func() []ctrlmeshv1alpha1.Subset { return []ctrlmeshv1alpha1.Subset{v2()} }},
		{name: "two subsets", subsets: func() []ctrlmeshv1alpha1.Subset {
			blue := ctrlmeshv1alpha1.Subset{Name: "blue", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "blue"}}, Namespaces: []string{"team-b"}}
			return []ctrlmeshv1alpha1.Subset{v2(), blue}
		}},
		{name: "namespace rules only", subsets: func() []ctrlmeshv1alpha1.Subset {
			s := v2()
			s.Buckets, s.Namespaces = "", nil
			s.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"stage": "canary"}}
			s.NamespaceRegex = "^canary-"
			return []ctrlmeshv1alpha1.Subset{s}
		}},
		{name: "invalid namespace regex", subsets: func() []ctrlmeshv1alpha1.Subset {
			s := v2()
			s.NamespaceRegex = "^canary-("
			return []ctrlmeshv1alpha1.Subset{s}
		}, want: "namespaceRegex must be a valid RE2 regular expression"},
		{name: "no rules", subsets: func() []ctrlmeshv1alpha1.Subset {
			s := v2()
			s.Buckets, s.Namespaces = "", nil
			return []ctrlmeshv1alpha1.Subset{s}
		}, want: "a subset must name buckets, namespaces, a namespaceSelector or a namespaceRegex for its pods to serve"},
		{name: "empty selector", subsets: func() []ctrlmeshv1alpha1.Subset {
			s := v2()
			s.Selector = metav1.LabelSelector{}
			return []ctrlmeshv1alpha1.Subset{s}
		}, want: "a subset's selector must not be empty"},
		{name: "named canary", subsets: func() []ctrlmeshv1alpha1.Subset {
			s := v2()
			s.Name = "canary"
			return []ctrlmeshv1alpha1.Subset{s}
		}, want: `subset name "canary" is the canary's`},
		{name: "numeric name", subsets: func() []ctrlmeshv1alpha1.Subset {
			s := v2()
			s.Name = "2"
			return []ctrlmeshv1alpha1.Subset{s}
		}, want: `spec.subsets[0].name: Invalid value: "2"`},
		{name: "bucket out of range", subsets: func() []ctrlmeshv1alpha1.Subset {
			s := v2()
			s.Buckets = "30-32"
			return []ctrlmeshv1alpha1.Subset{s}
		}, want: "subset buckets must be below sharding.buckets"},
		{name: "range backwards", subsets: func() []ctrlmeshv1alpha1.Subset {
			s := v2()
			s.Buckets = "7-3"
			return []ctrlmeshv1alpha1.Subset{s}
		}, want: "subset buckets: a range must run from low to high"},
		{name: "namespace in two subsets", subsets: func() []ctrlmeshv1alpha1.Subset {
			blue := ctrlmeshv1alpha1.Subset{Name: "blue", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "blue"}}, Namespaces: []string{"team-b", "team-a"}}
			return []ctrlmeshv1alpha1.Subset{v2(), blue}
		}, want: "a namespace may be named by only one subset"},
		{name: "name twice", subsets: func() []ctrlmeshv1alpha1.Subset { return []ctrlmeshv1alpha1.Subset{v2(), v2()} },
			want: `spec.subsets[1]: Duplicate value`},
	}
	tests = append(tests, struct {
		name    string
		subsets func() []ctrlmeshv1alpha1.Subset
		want    string
	}{name: "namespace rules in Fleet scope", subsets: func() []ctrlmeshv1alpha1.Subset {
		s := v2()
		s.NamespaceRegex = "^canary-"
		return []ctrlmeshv1alpha1.Subset{s}
	}, want: "in Fleet scope a subset names its namespaces by name"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := validShardingConfig("")
			sc.GenerateName = "subsets-"
			if tt.name == "namespace rules in Fleet scope" {
				sc.Spec.Scope = ctrlmeshv1alpha1.ScopeFleet
			}
			sc.Spec.Subsets = tt.subsets()
			checkVerdict(t, cluster.Client.Create(ctx, sc), tt.want)
		})
	}
}

// TestSubsetScenarioIsValid: the worked example in scenarios/subsets is
// accepted by the API server as written.
func TestSubsetScenarioIsValid(t *testing.T) {
	data, err := os.ReadFile("../../../scenarios/subsets/shardingconfig.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sc := &ctrlmeshv1alpha1.ShardingConfig{}
	if err := yaml.UnmarshalStrict(data, sc); err != nil {
		t.Fatal(err)
	}
	sc.Namespace, sc.Name = "default", "subsets-scenario"
	if err := cluster.Client.Create(context.Background(), sc); err != nil {
		t.Fatalf("the scenario's ShardingConfig is refused: %v", err)
	}
	if len(sc.Spec.Subsets) != 3 {
		t.Fatalf("the scenario has %d subsets, want 3", len(sc.Spec.Subsets))
	}
}
