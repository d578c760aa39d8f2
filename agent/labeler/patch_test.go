package labeler_test

import (
	"encoding/json"
	"reflect"
	"testing"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// applyPatch applies a JSON patch given as operations to doc.
func applyPatch(t testing.TB, doc []byte, ops any) []byte {
	t.Helper()
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatchapply.DecodePatch(raw)
	if err != nil {
		t.Fatalf("patch %s: %v", raw, err)
	}
	out, err := patch.Apply(doc)
	if err != nil {
		t.Fatalf("applying %s to %s: %v", raw, doc, err)
	}
	return out
}

func decode(t testing.TB, doc []byte) map[string]any {
	t.Helper()
	var out map[string]any
	if err := json.Unmarshal(doc, &out); err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	return out
}

func TestLabelPatch(t *testing.T) {
	const ns = "team-a"
	want := labeler.DesiredLabels(sharding.MustSpace(32), ns)
	right := wantLabels(ns, map[string]string{"app": "x"})
	cases := []struct {
		name   string
		object string
		// after is the object after the patch; empty when no patch is due.
		after string
	}{
		{
			name:   "labels missing",
			object: `{"kind":"ConfigMap","metadata":{"name":"a","labels":{"app":"x"}},"data":{"n":"1"}}`,
			after:  `{"kind":"ConfigMap","metadata":{"name":"a","labels":` + mustJSON(t, right) + `},"data":{"n":"1"}}`,
		},
		{
			name:   "labels wrong",
			object: `{"metadata":{"name":"a","labels":{"app":"x","ctrlmesh.io/sharding-hash":"99","ctrlmesh.io/namespace":"b","ctrlmesh.io/control":"false"}}}`,
			after:  `{"metadata":{"name":"a","labels":` + mustJSON(t, right) + `}}`,
		},
		{
			name:   "one label wrong",
			object: `{"metadata":{"labels":{"app":"x","ctrlmesh.io/sharding-hash":"` + want["ctrlmesh.io/sharding-hash"] + `","ctrlmesh.io/namespace":"b","ctrlmesh.io/control":"true"}}}`,
			after:  `{"metadata":{"labels":` + mustJSON(t, right) + `}}`,
		},
		{
			name:   "already right",
			object: `{"metadata":{"name":"a","labels":` + mustJSON(t, right) + `},"spec":{"big":12345678901234567890}}`,
		},
		{
			name:   "no labels map",
			object: `{"metadata":{"name":"a","annotations":{"k":"v"}},"spec":{"replicas":3,"big":12345678901234567890}}`,
			after:  `{"metadata":{"name":"a","annotations":{"k":"v"},"labels":` + mustJSON(t, want) + `},"spec":{"replicas":3,"big":12345678901234567890}}`,
		},
		{
			name:   "labels null",
			object: `{"metadata":{"name":"a","labels":null}}`,
			after:  `{"metadata":{"name":"a","labels":` + mustJSON(t, want) + `}}`,
		},
		{
			name:   "no metadata",
			object: `{"kind":"ConfigMap"}`,
			after:  `{"kind":"ConfigMap","metadata":{"labels":` + mustJSON(t, want) + `}}`,
		},
		{
			name:   "label of another type",
			object: `{"metadata":{"labels":{"ctrlmesh.io/control":true}}}`,
			after:  `{"metadata":{"labels":` + mustJSON(t, want) + `}}`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ops, err := labeler.LabelPatch([]byte(tc.object), want)
			if err != nil {
				t.Fatal(err)
			}
			if tc.after == "" {
				if len(ops) != 0 {
					t.Fatalf("patch %v for an object that needs none", ops)
				}
				return
			}
			if len(ops) == 0 {
				t.Fatal("no patch")
			}
			for _, op := range ops {
				if len(op.Path) < len("/metadata") || op.Path[:len("/metadata")] != "/metadata" {
					t.Errorf("operation %s %s outside metadata", op.Operation, op.Path)
				}
			}
			got := applyPatch(t, []byte(tc.object), ops)
			if g, w := decode(t, got), decode(t, []byte(tc.after)); !reflect.DeepEqual(g, w) {
				t.Errorf("patched object\n%s\nwant\n%s", got, tc.after)
			}
		})
	}
}

func TestLabelPatchRejects(t *testing.T) {
	want := labeler.DesiredLabels(sharding.MustSpace(32), "ns")
	for _, object := range []string{``, `null`, `[]`, `"x"`, `{"metadata":[]}`, `{"metadata":{"labels":"x"}}`, `{} {}`, `{`} {
		if ops, err := labeler.LabelPatch([]byte(object), want); err == nil {
			t.Errorf("%q: patch %v, want an error", object, ops)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWebhookConfiguration(t *testing.T) {
	deployments := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	targets := labeler.Targets{
		Resources:         []schema.GroupVersionResource{configMaps, deployments},
		Space:             sharding.MustSpace(32),
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "tenant"}},
	}
	cfg, err := targets.WebhookConfiguration(labeler.WebhookOptions{
		ConfigurationName: "ctrlmesh-labeler",
		WebhookName:       "labeler.ctrlmesh.io",
		ClientConfig: admissionregistrationv1.WebhookClientConfig{
			Service:  &admissionregistrationv1.ServiceReference{Namespace: "ctrlmesh-system", Name: "agent", Path: ptr.To("/label")},
			CABundle: []byte("ca"),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Webhooks) != 1 {
		t.Fatalf("%d webhooks", len(cfg.Webhooks))
	}
	wh := cfg.Webhooks[0]
	if *wh.FailurePolicy != admissionregistrationv1.Ignore || *wh.TimeoutSeconds != 2 || *wh.SideEffects != admissionregistrationv1.SideEffectClassNone {
		t.Errorf("failurePolicy %s, timeout %d, sideEffects %s", *wh.FailurePolicy, *wh.TimeoutSeconds, *wh.SideEffects)
	}
	if string(wh.ClientConfig.CABundle) != "ca" || wh.ClientConfig.Service.Name != "agent" {
		t.Errorf("clientConfig %+v", wh.ClientConfig)
	}
	var got []string
	for _, r := range wh.Rules {
		if len(r.APIGroups) != 1 || len(r.APIVersions) != 1 || len(r.Resources) != 1 || *r.Scope != admissionregistrationv1.NamespacedScope {
			t.Errorf("rule %+v is not exactly one namespaced resource", r)
			continue
		}
		if !reflect.DeepEqual(r.Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}) {
			t.Errorf("rule operations %v", r.Operations)
		}
		got = append(got, r.APIGroups[0]+"/"+r.APIVersions[0]+"/"+r.Resources[0])
	}
	if want := []string{"/v1/configmaps", "apps/v1/deployments"}; !reflect.DeepEqual(got, want) {
		t.Errorf("rules for %v, want %v", got, want)
	}
	nsSel, err := metav1.LabelSelectorAsSelector(wh.NamespaceSelector)
	if err != nil {
		t.Fatal(err)
	}
	if want := "kubernetes.io/metadata.name notin (kube-node-lease,kube-public,kube-system),tier=tenant"; nsSel.String() != want {
		t.Errorf("namespaceSelector %q, want %q", nsSel, want)
	}
	objSel, err := metav1.LabelSelectorAsSelector(wh.ObjectSelector)
	if err != nil {
		t.Fatal(err)
	}
	if want := "ctrlmesh.io/control notin (true)"; objSel.String() != want {
		t.Errorf("objectSelector %q, want %q", objSel, want)
	}

	for _, bad := range []labeler.WebhookOptions{
		{ConfigurationName: "a", WebhookName: "a.b.c"},
		{ConfigurationName: "a", WebhookName: "a.b.c", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://x"), Service: &admissionregistrationv1.ServiceReference{}}},
		{WebhookName: "a.b.c", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://x")}},
	} {
		if _, err := targets.WebhookConfiguration(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
