package webhook_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/proxy/webhook"
)

// staticScopes knows ConfigMaps, namespaced, through a real RESTMapper.
func staticScopes() rules.Scopes {
	m := meta.NewDefaultRESTMapper(nil)
	m.Add(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, meta.RESTScopeNamespace)
	return rules.NewMapperScopes(m)
}

// TestRouting sends admission requests to two routers, pod-a (shard a,
// buckets 0-15) and pod-b (shard b, buckets 16-31), each in front of its own
// operator stand-in, and checks who answers.
func TestRouting(t *testing.T) {
	ca := newTestCA(t)
	certPEM, keyPEM := ca.issue(t, "webhook.test.svc", "127.0.0.1")
	certDir := t.TempDir()
	writeCertDir(t, certDir, certPEM, keyPEM, nil)

	operators := map[string]*standIn{
		"pod-a": startStandIn(t, "pod-a", certPEM, keyPEM),
		"pod-b": startStandIn(t, "pod-b", certPEM, keyPEM),
	}
	routers := map[string]*router{"pod-a": listenRouter(t, "pod-a"), "pod-b": listenRouter(t, "pod-b")}
	_, portB, _ := net.SplitHostPort(routers["pod-b"].addr())
	peerPortB, _ := strconv.Atoi(portB)
	// pod-a reaches peers without a port in their address at pod-b's port;
	// pod-b knows no peer port.
	routers["pod-a"].serve(t, webhook.Options{ListenPort: peerPortB})
	routers["pod-b"].serve(t, webhook.Options{})

	nsA := namespaceIn("team-a", 0, 14)
	nsB := namespaceIn("team-b", 16, 31)
	nsHandover := namespaceIn("moving", 15, 15)
	scopes := staticScopes()
	client := clientTrusting(ca)

	cases := []struct {
		name      string
		to        string
		ns        string
		namespace bool   // the request is for a Namespace object
		body      []byte // instead of a review for ns
		method    string
		path      string
		forwarded bool
		// mutate edits the rules of both pods.
		mutate func(r *ctrlmeshv1alpha1.ShardRoute)
		// operatorDown names the pod whose operator does not listen.
		operatorDown string
		noRules      bool
		refusal      string
		repeat       int

		wantCode    int
		wantBy      string // the stand-in that answers; "" when the router fails
		wantBody    string // exact body, when set
		wantOutcome string
		wantMessage string // in the router's Status message
	}{
		{name: "A's namespace sent to B is answered by A's operator", to: "pod-b", ns: nsA,
			wantCode: 200, wantBy: "pod-a", wantOutcome: webhook.OutcomeForwarded},
		{name: "B's namespace sent to B is answered by B's operator", to: "pod-b", ns: nsB,
			wantCode: 200, wantBy: "pod-b", wantOutcome: webhook.OutcomeLocal},
		{name: "B's namespace sent to A is answered by B's operator", to: "pod-a", ns: nsB,
			wantCode: 200, wantBy: "pod-b", wantOutcome: webhook.OutcomeForwarded},
		{name: "a forwarded request is served locally, even outside the shard", to: "pod-b", ns: nsA, forwarded: true,
			wantCode: 200, wantBy: "pod-b", wantOutcome: webhook.OutcomeLocal},
		{name: "a cluster-scoped object is served locally", to: "pod-a", ns: "",
			wantCode: 200, wantBy: "pod-a", wantOutcome: webhook.OutcomeLocal},
		{name: "a Namespace object is served locally", to: "pod-a", ns: nsB, namespace: true,
			wantCode: 200, wantBy: "pod-a", wantOutcome: webhook.OutcomeLocal},
		{name: "the operator's error is relayed unchanged", to: "pod-a", ns: nsB, path: "/fail",
			wantCode: 500, wantBy: "pod-b", wantBody: failBody, wantOutcome: webhook.OutcomeForwarded},
		{name: "a pod address without a port is reached at the router port", to: "pod-a", ns: nsB,
			mutate:   func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[1].Pods[0].Address = "127.0.0.1" },
			wantCode: 200, wantBy: "pod-b", wantOutcome: webhook.OutcomeForwarded},
		{name: "a dead pod of the owning shard is skipped", to: "pod-a", ns: nsB, repeat: 2,
			mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
				r.Spec.Shards[1].Pods = []ctrlmeshv1alpha1.RoutePod{
					{Name: "pod-b0", Address: deadAddress(t)},
					{Name: "pod-b", Address: routers["pod-b"].addr()},
				}
			},
			wantCode: 200, wantBy: "pod-b", wantOutcome: webhook.OutcomeForwarded},

		{name: "handover: no shard owns the bucket", to: "pod-b", ns: nsHandover,
			mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
				r.Spec.Shards[0].Buckets = "0-14"
				r.Spec.Shards[1].PendingBuckets = "15"
			},
			wantCode: 503, wantOutcome: webhook.OutcomeUnavailable, wantMessage: "no shard serves namespace"},
		{name: "handover also on the previous owner", to: "pod-a", ns: nsHandover,
			mutate: func(r *ctrlmeshv1alpha1.ShardRoute) {
				r.Spec.Shards[0].Buckets = "0-14"
				r.Spec.Shards[1].PendingBuckets = "15"
			},
			wantCode: 503, wantOutcome: webhook.OutcomeUnavailable, wantMessage: "no shard serves namespace"},
		{name: "peer down", to: "pod-a", ns: nsB,
			mutate:   func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[1].Pods[0].Address = deadAddress(t) },
			wantCode: 503, wantOutcome: webhook.OutcomeUnavailable, wantMessage: "could not be reached"},
		{name: "owning shard has no pod in this cluster", to: "pod-a", ns: nsB,
			mutate:   func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[1].Pods[0].Address = "" },
			wantCode: 503, wantOutcome: webhook.OutcomeUnavailable, wantMessage: "no pod with an address"},
		{name: "peer address without a port and no peer port", to: "pod-b", ns: nsA,
			mutate:   func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Shards[0].Pods[0].Address = "127.0.0.1" },
			wantCode: 503, wantOutcome: webhook.OutcomeUnavailable, wantMessage: "has no port"},
		{name: "local operator down", to: "pod-b", ns: nsB, operatorDown: "pod-b",
			wantCode: 503, wantOutcome: webhook.OutcomeUnavailable, wantMessage: "could not be reached"},
		{name: "rules not loaded", to: "pod-a", ns: nsA, noRules: true,
			wantCode: 503, wantOutcome: webhook.OutcomeUnavailable, wantMessage: "not loaded"},
		// Withdrawn or lapsed rules name owners that may be owners no
		// more: nothing is routed by them.
		{name: "rules withdrawn", to: "pod-a", ns: nsB, refusal: "the ShardRoute was deleted",
			wantCode: 503, wantOutcome: webhook.OutcomeUnavailable, wantMessage: "routes no admission requests: the ShardRoute was deleted"},
		{name: "rules without a webhook", to: "pod-a", ns: nsA,
			// The serving certificate comes from the previous rules' certDir.
			mutate:   func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.Webhook = nil },
			wantCode: 503, wantOutcome: webhook.OutcomeUnavailable, wantMessage: "configure no webhook"},
		{name: "malformed body", to: "pod-a", body: []byte(`{"apiVersion": "admission.k8s.io/v1", "kind": `),
			wantCode: 400, wantOutcome: webhook.OutcomeInvalid, wantMessage: "not an AdmissionReview"},
		{name: "admission.k8s.io/v1beta1", to: "pod-a",
			body:     []byte(`{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x", "namespace": "default"}}`),
			wantCode: 400, wantOutcome: webhook.OutcomeInvalid, wantMessage: "only admission.k8s.io/v1 AdmissionReview"},
		{name: "review without a request", to: "pod-a",
			body:     []byte(`{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}`),
			wantCode: 400, wantOutcome: webhook.OutcomeInvalid, wantMessage: "no request"},
		{name: "not a POST", to: "pod-a", ns: nsA, method: http.MethodPut,
			wantCode: 405, wantOutcome: webhook.OutcomeInvalid, wantMessage: "POSTed"},
	}

	uid := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Rules first compiled normally, so that the certificate loads
			// even for the cases whose rules name no certDir.
			for _, pass := range []bool{false, true} {
				route := twoShards(certDir, routers["pod-a"].addr(), routers["pod-b"].addr())
				if pass && tc.mutate != nil {
					tc.mutate(route)
				}
				for pod, r := range routers {
					port := operators[pod].port()
					if pass && tc.operatorDown == pod {
						_, p, _ := net.SplitHostPort(deadAddress(t))
						port, _ = strconv.Atoi(p)
					}
					r.snap.Store(compileFor(t, route, pod, port, scopes))
					if pass && tc.noRules {
						r.snap.Store(nil)
					}
					r.refusal.Store(nil)
					if pass && tc.refusal != "" {
						r.refusal.Store(&tc.refusal)
					}
				}
				if !pass {
					// Load the certificate under complete rules.
					post(t, client, routers[tc.to].addr(), "/warmup", []byte("{}"), nil)
				}
			}

			to := routers[tc.to]
			beforeOutcome := to.outcome(t, tc.wantOutcome)
			beforeA, beforeB := len(operators["pod-a"].requests()), len(operators["pod-b"].requests())
			repeat := max(tc.repeat, 1)
			for range repeat {
				uid++
				reqUID := types.UID(fmt.Sprintf("uid-%d", uid))
				body := tc.body
				if body == nil {
					body = reviewFor(t, reqUID, tc.ns)
					if tc.namespace {
						body = []byte(strings.Replace(string(body), `"resource":"configmaps"`, `"resource":"namespaces"`, 1))
					}
				}
				header := http.Header{}
				if tc.forwarded {
					header.Set(webhook.ForwardedHeader, "pod-x")
				}
				path := tc.path
				if path == "" {
					path = "/mutate"
				}
				code, got := request(t, client, tc.method, to.addr(), path, body, header)
				if code != tc.wantCode {
					t.Fatalf("status %d, want %d: %s", code, tc.wantCode, got)
				}
				switch {
				case tc.wantBody != "":
					if string(got) != tc.wantBody {
						t.Errorf("body %q, want %q unchanged", got, tc.wantBody)
					}
				case tc.wantBy != "":
					by, err := answeredBy(got, reqUID)
					if err != nil {
						t.Fatal(err)
					}
					if by != tc.wantBy {
						t.Errorf("answered by %q, want %q", by, tc.wantBy)
					}
				default:
					assertRouterFailure(t, got, tc.wantCode, tc.wantMessage)
				}
			}

			if d := to.outcome(t, tc.wantOutcome) - beforeOutcome; d != float64(repeat) {
				t.Errorf("outcome %q counted %v times, want %d", tc.wantOutcome, d, repeat)
			}
			gotA, gotB := len(operators["pod-a"].requests())-beforeA, len(operators["pod-b"].requests())-beforeB
			wantA, wantB := 0, 0
			switch tc.wantBy {
			case "pod-a":
				wantA = repeat
			case "pod-b":
				wantB = repeat
			}
			if gotA != wantA || gotB != wantB {
				t.Errorf("operators received a=%d b=%d requests, want a=%d b=%d", gotA, gotB, wantA, wantB)
			}
		})
	}

	// The routing header is between routers: operators never see it.
	for pod, op := range operators {
		for _, h := range op.requests() {
			if h != "" {
				t.Errorf("operator of %s received %s: %q", pod, webhook.ForwardedHeader, h)
			}
		}
	}
}

// assertRouterFailure checks that the router answered on its own with an
// HTTP error carrying a Kubernetes Status, and nothing that could pass for an
// admission response.
func assertRouterFailure(t *testing.T, body []byte, code int, message string) {
	t.Helper()
	var status metav1.Status
	if err := json.Unmarshal(body, &status); err != nil {
		t.Fatalf("not a Status: %v: %s", err, body)
	}
	if status.Kind != "Status" || status.Status != metav1.StatusFailure || int(status.Code) != code {
		t.Errorf("status %+v, want a failure with code %d", status, code)
	}
	if !strings.Contains(status.Message, message) {
		t.Errorf("message %q does not say %q", status.Message, message)
	}
	var review struct {
		Response json.RawMessage `json:"response"`
	}
	if err := json.Unmarshal(body, &review); err == nil && review.Response != nil {
		t.Errorf("the router invented an admission response: %s", body)
	}
}

func request(t *testing.T, client *http.Client, method, addr, path string, body []byte, header http.Header) (int, []byte) {
	t.Helper()
	if method == "" || method == http.MethodPost {
		return post(t, client, addr, path, body, header)
	}
	req, err := http.NewRequest(method, "https://"+addr+path, strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var raw json.RawMessage
	_ = json.NewDecoder(resp.Body).Decode(&raw)
	return resp.StatusCode, raw
}
