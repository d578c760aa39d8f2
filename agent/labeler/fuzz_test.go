package labeler_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/util/json"

	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

func review(op, group, version, resource, subresource, ns, object string) string {
	return fmt.Sprintf(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"ConfigMap"},`+
		`"resource":{"group":%q,"version":%q,"resource":%q},"subResource":%q,"namespace":%q,"operation":%q,"object":%s}}`,
		group, version, resource, subresource, ns, op, object)
}

// FuzzHandler posts arbitrary bodies to the admission handler. It must not
// panic and must answer every body with an AdmissionReview; it must answer
// every admission.k8s.io/v1 AdmissionReview with its UID, allowed; and for a creation or update of a configured resource in a
// controlled namespace, its patch applied to the object must give exactly
// the object with the three labels set.
func FuzzHandler(f *testing.F) {
	objects := []string{
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"team-a"},"data":{"k":"v"}}`,
		`{"metadata":{"labels":{"app":"x","ctrlmesh.io/sharding-hash":"99"}}}`,
		`{"metadata":{"labels":null},"spec":{"n":1.5e3,"big":123456789012345678901234}}`,
		`{"kind":"ConfigMap"}`,
		`{"metadata":{"labels":{"ctrlmesh.io/control":true,"a/b~c":"d"}}}`,
		`null`,
		`{"metadata":"x"}`,
	}
	for _, obj := range objects {
		f.Add([]byte(review("CREATE", "", "v1", "configmaps", "", "team-a", obj)))
		f.Add([]byte(review("UPDATE", "", "v1", "configmaps", "", "tenant-07", obj)))
	}
	f.Add([]byte(review("DELETE", "", "v1", "configmaps", "", "team-a", objects[0])))
	f.Add([]byte(review("CREATE", "", "v1", "configmaps", "status", "team-a", objects[0])))
	f.Add([]byte(review("CREATE", "", "v1", "secrets", "", "team-a", objects[0])))
	f.Add([]byte(review("CREATE", "", "v1", "configmaps", "", "kube-system", objects[0])))
	f.Add([]byte(review("CREATE", "", "v1", "configmaps", "", "", objects[0])))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`))
	f.Add([]byte(`not json`))

	targets := labeler.Targets{Resources: []schema.GroupVersionResource{configMaps}, Space: sharding.MustSpace(32)}
	h, err := labeler.NewHandler(targets, logr.Discard())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		post := httptest.NewRequest(http.MethodPost, "/label", bytes.NewReader(body))
		post.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, post)

		// Every body gets an AdmissionReview back; a malformed one an
		// errored response.
		if rec.Code != http.StatusOK {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("the answer is no AdmissionReview: %v", err)
		}
		// Decoded as the API server's decoder does (case-sensitively), a v1
		// review with a request must be answered in full.
		var in admissionv1.AdmissionReview
		if err := kjson.Unmarshal(body, &in); err != nil || in.APIVersion != "admission.k8s.io/v1" || in.Kind != "AdmissionReview" || in.Request == nil {
			return
		}
		resp := out.Response
		if resp == nil || resp.UID != in.Request.UID || !resp.Allowed {
			t.Fatalf("response %+v, want allowed with UID %q", resp, in.Request.UID)
		}
		req := in.Request
		ns := req.Namespace
		object, wantPatch := labeledObject(req.Object.Raw, ns)
		applies := (req.Operation == admissionv1.Create || req.Operation == admissionv1.Update) &&
			req.Resource.Group == "" && req.Resource.Version == "v1" && req.Resource.Resource == "configmaps" &&
			req.SubResource == "" && ns != "" && ns != "kube-system" && ns != "kube-public" && ns != "kube-node-lease"
		if !applies || object == nil || !wantPatch {
			if resp.Patch != nil {
				t.Fatalf("patch %s for a request needing none: %s", resp.Patch, body)
			}
			return
		}
		if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch || resp.Patch == nil {
			t.Fatalf("no JSON patch for %s", body)
		}
		var ops []any
		if err := json.Unmarshal(resp.Patch, &ops); err != nil {
			t.Fatal(err)
		}
		got := decode(t, applyPatch(t, req.Object.Raw, ops))
		if !reflect.DeepEqual(got, object) {
			t.Fatalf("patched object\n%v\nwant\n%v", got, object)
		}
	})
}

// labeledObject is the object raw with the labels of ns set, and whether
// that differs from raw; nil if raw is no object the handler can label.
func labeledObject(raw []byte, ns string) (map[string]any, bool) {
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, false
	}
	meta, ok := obj["metadata"].(map[string]any)
	if !ok && obj["metadata"] != nil {
		return nil, false
	}
	if meta == nil {
		meta = map[string]any{}
		obj["metadata"] = meta
	}
	labels, ok := meta["labels"].(map[string]any)
	if !ok && meta["labels"] != nil {
		return nil, false
	}
	before := maps.Clone(labels)
	if labels == nil {
		labels = map[string]any{}
		meta["labels"] = labels
	}
	for k, v := range wantLabels(ns, nil) {
		labels[k] = v
	}
	return obj, !reflect.DeepEqual(before, labels)
}
