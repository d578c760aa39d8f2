package operator_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
)

// seenRequest is one request the operator sent, as a proxy would see it.
type seenRequest struct {
	Method, Path, ContentType, Accept, UserAgent string
	Query                                        url.Values
}

func (r seenRequest) watch() bool { return r.Query.Get("watch") == "true" }

// requestLog records the operator's requests on their way out.
type requestLog struct {
	mu   sync.Mutex
	reqs []seenRequest
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		l.mu.Lock()
		l.reqs = append(l.reqs, seenRequest{
			Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(),
			ContentType: r.Header.Get("Content-Type"), Accept: r.Header.Get("Accept"), UserAgent: r.Header.Get("User-Agent"),
		})
		l.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

func (l *requestLog) snapshot() []seenRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]seenRequest(nil), l.reqs...)
}

// TestRequestsAProxySees records every request the operator sends to the
// API server and checks the contract the ctrlmesh proxy relies on: ConfigMap
// list and watch carry the operator's own label selector; ConfigMap writes
// are merge patches of single managed objects; the Lease is reached by its
// name in its namespace. It logs the distinct requests (go test -v) for the
// proxy's authors.
func TestRequestsAProxySees(t *testing.T) {
	c := member(t)
	ns := newNamespace(t, c, "requests-")
	const pod, lock = "pod-q", "demo-operator-requests"

	var log requestLog
	cfg := rest.CopyConfig(c.Config)
	cfg.Wrap(log.wrap)
	op := startOperator(t, c, operator.Options{Config: cfg, PodName: pod, LeaderElectionID: lock, LeaderElectionNamespace: ns})
	mustCreate(t, c, newConfigMap(ns, "watched", managedLabels(), map[string]string{"k": "v"}))
	waitReconciledBy(t, c, ns, "watched", pod)
	if err := op.stop(); err != nil { // includes releasing the Lease
		t.Fatal(err)
	}
	reqs := log.snapshot()

	selector := operator.ManagedSelector().String()
	leasePath := fmt.Sprintf("/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s", ns, lock)
	leaseCollection := fmt.Sprintf("/apis/coordination.k8s.io/v1/namespaces/%s/leases", ns)
	patchPath := regexp.MustCompile(`^/api/v1/namespaces/[^/]+/configmaps/[^/]+$`)
	var lists, watches, patches, leaseGets, leaseWrites int
	for _, r := range reqs {
		switch {
		case r.Path == "/api/v1/configmaps":
			if r.Method != http.MethodGet {
				t.Errorf("%s %s: only list and watch expected on the collection", r.Method, r.Path)
			}
			if got := r.Query.Get("labelSelector"); got != selector {
				t.Errorf("%s %s?%s: labelSelector %q, want %q", r.Method, r.Path, r.Query.Encode(), got, selector)
			}
			if r.watch() {
				watches++
			} else {
				lists++
			}
		case patchPath.MatchString(r.Path):
			if r.Method != http.MethodPatch || r.ContentType != "application/merge-patch+json" {
				t.Errorf("%s %s (%s): ConfigMap writes should be merge patches", r.Method, r.Path, r.ContentType)
			}
			patches++
		case strings.Contains(r.Path, "configmaps"):
			t.Errorf("unexpected ConfigMap request %s %s?%s", r.Method, r.Path, r.Query.Encode())
		case r.Path == leasePath && r.Method == http.MethodGet:
			leaseGets++
		case (r.Path == leasePath && r.Method == http.MethodPut) || (r.Path == leaseCollection && r.Method == http.MethodPost):
			leaseWrites++
		case strings.Contains(r.Path, "leases"):
			t.Errorf("unexpected Lease request %s %s", r.Method, r.Path)
		}
	}
	if lists == 0 || watches == 0 || patches == 0 || leaseGets == 0 || leaseWrites == 0 {
		t.Errorf("lists %d, watches %d, patches %d, Lease gets %d, Lease writes %d: want each at least once", lists, watches, patches, leaseGets, leaseWrites)
	}
	logDistinct(t, reqs, ns)
}

// logDistinct logs each kind of request once, with names generalised.
func logDistinct(t *testing.T, reqs []seenRequest, ns string) {
	counts := map[string]int{}
	for _, r := range reqs {
		path := strings.ReplaceAll(r.Path, ns, "{ns}")
		path = regexp.MustCompile(`/configmaps/[^/]+$`).ReplaceAllString(path, "/configmaps/{name}")
		q := url.Values{}
		for k, v := range r.Query {
			switch k {
			case "resourceVersion", "timeoutSeconds", "timeout":
				q[k] = []string{"…"}
			default:
				q[k] = v
			}
		}
		key := fmt.Sprintf("%-6s %s?%s\n         content-type %q accept %q user-agent %q",
			r.Method, path, q.Encode(), r.ContentType, r.Accept, r.UserAgent)
		counts[key]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%4d× %s\n", counts[k], k)
	}
	t.Logf("requests the operator sent:\n%s", b.String())
}
