package proxy_test

import (
	"context"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestDiscoveryMapperLearnsNewResources: the proxy's mapper answers scope
// and version from the API server's discovery, says "no match" for what it
// does not serve, and finds a resource served since (a CRD installed after
// the group was first asked about) without a restart.
func TestDiscoveryMapperLearnsNewResources(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := fleet.Cluster("label").Config
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper, err := proxy.NewDiscoveryMapper(cfg.Host, client)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gr         schema.GroupResource
		namespaced bool
		version    string
	}{
		{schema.GroupResource{Resource: "configmaps"}, true, "v1"},
		{schema.GroupResource{Resource: "namespaces"}, false, "v1"},
		{schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, true, "v1"},
		{schema.GroupResource{Group: "rbac.authorization.k8s.io", Resource: "clusterroles"}, false, "v1"},
	} {
		gvr, err := mapper.ResourceFor(tc.gr.WithVersion(""))
		if err != nil || gvr.Version != tc.version {
			t.Errorf("%s: %v, %v; want version %s", tc.gr, gvr, err, tc.version)
			continue
		}
		gvk, err := mapper.KindFor(gvr)
		if err != nil {
			t.Fatal(err)
		}
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatal(err)
		}
		if got := mapping.Scope.Name() == meta.RESTScopeNameNamespace; got != tc.namespaced {
			t.Errorf("%s: namespaced %v, want %v", tc.gr, got, tc.namespaced)
		}
	}

	widgets := schema.GroupResource{Group: "discovery.test.ctrlmesh.io", Resource: "widgets"}
	if _, err := mapper.KindFor(widgets.WithVersion("")); !meta.IsNoMatchError(err) {
		t.Fatalf("an unserved group: %v, want a no-match error", err)
	}
	if _, err := mapper.KindFor(schema.GroupVersionResource{Resource: "nosuchthings"}); !meta.IsNoMatchError(err) {
		t.Fatalf("an unserved core resource: %v, want a no-match error", err)
	}
	crds := apiextensionsclient.NewForConfigOrDie(cfg).ApiextensionsV1().CustomResourceDefinitions()
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: widgets.Resource + "." + widgets.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: widgets.Group, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1beta1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object"}}}},
		},
	}
	if _, err := crds.Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = crds.Delete(context.Background(), crd.Name, metav1.DeleteOptions{}) })
	env.Eventually(t, time.Minute, "the CRD's resource found", func() error {
		gvk, err := mapper.KindFor(widgets.WithVersion(""))
		if err != nil {
			return err
		}
		if gvk.Kind != "Widget" || gvk.Version != "v1beta1" {
			t.Fatalf("kind %v, want Widget in v1beta1", gvk)
		}
		return nil
	})
}
