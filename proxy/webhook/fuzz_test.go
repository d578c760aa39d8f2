package webhook

import (
	"encoding/json"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// fuzzSnapshot is pod-a's rules: shard a serves buckets 0-15, shard b
// 16-23, and 24-31 are being handed over (served by nobody).
func fuzzSnapshot(f *testing.F) *rules.Snapshot {
	m := meta.NewDefaultRESTMapper(nil)
	m.Add(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, meta.RESTScopeNamespace)
	route := &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "operators", Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: "c", RoutingGeneration: 2, RulesHash: "h2", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Webhook: &ctrlmeshv1alpha1.WebhookConfig{CertDir: "/certs", Port: 9443},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}},
			}}},
			Shards: []ctrlmeshv1alpha1.RouteShard{
				{ID: "a", Buckets: "0-15", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "pod-a", Address: "10.0.0.1"}}},
				{ID: "b", Buckets: "16-23", PendingBuckets: "24-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "pod-b", Address: "10.0.0.2"}}},
			},
		},
	}
	snap, err := rules.Compile(route, "pod-a", rules.ModeLabel, rules.NewMapperScopes(m))
	if err != nil {
		f.Fatal(err)
	}
	return snap
}

// FuzzRouteReview feeds arbitrary bodies to the router's reading of an
// AdmissionReview and its routing decision: neither may panic; a body that
// is not an admission.k8s.io/v1 AdmissionReview with a request, a UID and a
// namespace name (or none) is refused, never routed; and what is routed goes
// to this pod exactly when its shard serves the namespace (or the request
// is cluster-scoped, a Namespace, or forwarded), else to the shard serving
// it, or to nobody while it is handed over.
func FuzzRouteReview(f *testing.F) {
	snap := fuzzSnapshot(f)
	for _, seed := range []string{
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","resource":{"version":"v1","resource":"configmaps"},"namespace":"team-a"}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u2","resource":{"group":"rbac.authorization.k8s.io","version":"v1","resource":"clusterroles"}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u3","resource":{"version":"v1","resource":"namespaces"},"namespace":"team-b"}}`,
		`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u4","namespace":"team-a"}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"namespace":"team-a"}}`,
		`{"APIVERSION":"admission.k8s.io/v1","Kind":"AdmissionReview","request":{"uid":"u5","NAMESPACE":"team-a"}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u6","namespace":"Team_A/../x"}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u7","namespace":"a","namespace":"b"}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}`,
		`[]`, `null`, `{`, ``, "\x00\xff",
	} {
		f.Add([]byte(seed), false)
		f.Add([]byte(seed), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, forwarded bool) {
		r, err := parseReview(body)
		if err != nil {
			if r != nil {
				t.Fatalf("refused with %v, yet returned %+v", err, r)
			}
			return
		}
		// Accepted: check independently that it is what the router says.
		var doc struct {
			APIVersion *string                    `json:"apiVersion"`
			Kind       *string                    `json:"kind"`
			Request    map[string]json.RawMessage `json:"request"`
		}
		var keys map[string]json.RawMessage
		if json.Unmarshal(body, &keys) != nil || keys["apiVersion"] == nil || keys["kind"] == nil || keys["request"] == nil {
			t.Fatalf("accepted %q, whose exact keys lack apiVersion, kind or request", body)
		}
		if json.Unmarshal(body, &doc) != nil || *doc.APIVersion != "admission.k8s.io/v1" || *doc.Kind != "AdmissionReview" {
			t.Fatalf("accepted %q as an admission.k8s.io/v1 AdmissionReview", body)
		}
		if r.UID == "" || (r.Namespace != "" && len(validation.IsDNS1123Label(r.Namespace)) > 0) {
			t.Fatalf("accepted %q with uid %q and namespace %q", body, r.UID, r.Namespace)
		}

		local, owner := routeOf(snap, r, forwarded)
		ns := r.Namespace
		wantLocal := ns == "" || (r.Resource.Group == "" && r.Resource.Resource == "namespaces") || forwarded || snap.Owns(ns)
		if local != wantLocal {
			t.Fatalf("namespace %q (bucket %d), resource %v, forwarded %v: local %v, want %v", ns, snap.Bucket(ns), r.Resource, forwarded, local, wantLocal)
		}
		if local {
			if owner != nil {
				t.Fatalf("served locally and by shard %s", owner.ID)
			}
			return
		}
		switch bucket := snap.Bucket(ns); {
		case bucket < 16:
			t.Fatalf("namespace %q of bucket %d, which this pod's shard serves, is not served locally", ns, bucket)
		case bucket < 24:
			if owner == nil || owner.ID != "b" {
				t.Fatalf("namespace %q of bucket %d goes to %+v, want shard b", ns, bucket, owner)
			}
		default:
			if owner != nil {
				t.Fatalf("namespace %q of bucket %d, handed over, goes to shard %s", ns, bucket, owner.ID)
			}
		}
	})
}
