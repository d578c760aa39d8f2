package labeler_test

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// TestRulesForRoutes derives labeling targets from ShardRoutes against the
// resources a real API server serves.
func TestRulesForRoutes(t *testing.T) {
	disc, err := discovery.NewDiscoveryClientForConfig(apiServer)
	if err != nil {
		t.Fatal(err)
	}
	served, err := labeler.ServedResources(disc)
	if err != nil {
		t.Fatal(err)
	}
	configMaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	if !slices.Contains(served, configMaps) || slices.Contains(served, schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}) {
		t.Fatalf("served resources should hold configmaps and no cluster-scoped namespaces: %v", served)
	}
	httpClient, err := rest.HTTPClientFor(apiServer)
	if err != nil {
		t.Fatal(err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(apiServer, httpClient)
	if err != nil {
		t.Fatal(err)
	}
	scopes := rules.NewMapperScopes(mapper)

	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	route := func(name string, age time.Duration, buckets int32, groups, resources []string) ctrlmeshv1alpha1.ShardRoute {
		return ctrlmeshv1alpha1.ShardRoute{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: name, CreationTimestamp: metav1.NewTime(base.Add(-age))},
			Spec: ctrlmeshv1alpha1.ShardRouteSpec{Buckets: buckets, Limits: ctrlmeshv1alpha1.Limits{{
				RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: groups, Resources: resources}},
			}}},
		}
	}
	core := []string{""}
	deleting := route("deleting", time.Hour, 16, core, []string{"secrets"})
	deleting.DeletionTimestamp = &metav1.Time{Time: base}

	tests := []struct {
		name          string
		routes        []ctrlmeshv1alpha1.ShardRoute
		wantOK        bool
		wantBuckets   int
		wantResources []schema.GroupVersionResource
		wantRefused   []string
	}{
		{name: "no routes"},
		{
			name:   "one route",
			routes: []ctrlmeshv1alpha1.ShardRoute{route("a", 0, 32, core, []string{"configmaps"})},
			wantOK: true, wantBuckets: 32, wantResources: []schema.GroupVersionResource{configMaps},
		},
		{
			name: "routes with the same buckets add their resources",
			routes: []ctrlmeshv1alpha1.ShardRoute{
				route("a", 0, 32, core, []string{"configmaps"}), route("b", time.Minute, 32, core, []string{"secrets"}),
			},
			wantOK: true, wantBuckets: 32, wantResources: []schema.GroupVersionResource{configMaps, secrets},
		},
		{
			name: "the oldest route sets the bucket count; a younger one counting otherwise is refused",
			routes: []ctrlmeshv1alpha1.ShardRoute{
				route("young", 0, 32, core, []string{"secrets"}), route("old", time.Minute, 64, core, []string{"configmaps"}),
			},
			wantOK: true, wantBuckets: 64, wantResources: []schema.GroupVersionResource{configMaps}, wantRefused: []string{"young"},
		},
		{
			name:   "limits that do not compile are left to the status controller",
			routes: []ctrlmeshv1alpha1.ShardRoute{route("bad", 0, 32, core, []string{"namespaces"})},
		},
		{
			name:   "a route being deleted labels nothing",
			routes: []ctrlmeshv1alpha1.ShardRoute{deleting},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, refused := labeler.TargetsForRoutes(tt.routes, served, scopes)
			if ok != tt.wantOK || got.Space.Buckets() != tt.wantBuckets || !slices.Equal(got.Resources, tt.wantResources) {
				t.Errorf("got ok=%v buckets=%d resources=%v, want ok=%v buckets=%d resources=%v",
					ok, got.Space.Buckets(), got.Resources, tt.wantOK, tt.wantBuckets, tt.wantResources)
			}
			var refusedNames []string
			for _, r := range refused {
				refusedNames = append(refusedNames, r.Route.Name)
				if r.Reason != ctrlmeshv1alpha1.ReasonBucketCountConflict || r.Message == "" {
					t.Errorf("refusal of %s: reason %q, message %q", r.Route.Name, r.Reason, r.Message)
				}
			}
			if !slices.Equal(refusedNames, tt.wantRefused) {
				t.Errorf("refused %v, want %v", refusedNames, tt.wantRefused)
			}
			if ok {
				if err := got.Validate(); err != nil {
					t.Errorf("targets do not validate: %v", err)
				}
			}
		})
	}

	// A wildcard expands to every served resource of the group.
	all, ok, _ := labeler.TargetsForRoutes([]ctrlmeshv1alpha1.ShardRoute{route("all", 0, 32, core, []string{"*"})}, served, scopes)
	if !ok || !slices.Contains(all.Resources, configMaps) || !slices.Contains(all.Resources, secrets) ||
		slices.ContainsFunc(all.Resources, func(gvr schema.GroupVersionResource) bool { return gvr.Group != "" }) {
		t.Errorf("core wildcard expanded to %v", all.Resources)
	}
}
