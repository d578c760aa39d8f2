package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// The forward proxy's tests reach external servers on loopback through the
// real proxy with Go's http.Client. Each server listens on an address of
// its own in 127.0.0.0/8, so that the policies tell them apart by host
// (the API server is on 127.0.0.1).

// externalServer serves handler over plain HTTP (or TLS) on ip, a loopback
// address.
func externalServer(t *testing.T, ip string, tlsServer bool, handler http.Handler) *httptest.Server {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewUnstartedServer(handler)
	_ = s.Listener.Close()
	s.Listener = l
	if tlsServer {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

// okServer answers every request 200 "ok" and counts them.
func okServer(t *testing.T, ip string, tlsServer bool) (*httptest.Server, *atomic.Int64) {
	var served atomic.Int64
	s := externalServer(t, ip, tlsServer, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	return s, &served
}

// forwardClient sends its requests through p's forward proxy. For HTTPS
// (tlsServer given, whose certificate it trusts) it opens a connection,
// so a CONNECT tunnel, per request: the policies see tunnels, not the
// requests in them. Plain HTTP requests keep their connections to the
// proxy, which sees each request.
func forwardClient(p *runningProxy, tlsServer *httptest.Server) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(p.forward), DisableKeepAlives: tlsServer != nil, MaxIdleConnsPerHost: 16}
	if tlsServer != nil {
		tr.TLSClientConfig = tlsServer.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
		// httptest's certificate names 127.0.0.1 and example.com, not the
		// other loopback addresses.
		tr.TLSClientConfig.ServerName = "example.com"
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// send does method url through c: the status and body, or the error.
func send(c *http.Client, method, u string) (int, http.Header, string, error) {
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		return 0, nil, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body), err
}

// connect asks p's forward proxy for a tunnel to authority and returns its
// answer's status and body (the refusal's reason; "" for a tunnel).
func connect(t *testing.T, p *runningProxy, authority string) (int, http.Header, string) {
	t.Helper()
	code, header, body, err := tryConnect(p, authority)
	if err != nil {
		t.Fatal(err)
	}
	return code, header, body
}

// tryConnect is connect, returning its error: the tunnel, if any, is
// closed at once.
func tryConnect(p *runningProxy, authority string) (int, http.Header, string, error) {
	conn, err := net.Dial("tcp", p.forward.Host)
	if err != nil {
		return 0, nil, "", err
	}
	defer func() { _ = conn.Close() }()
	if _, err := fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority); err != nil {
		return 0, nil, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return 0, nil, "", err
	}
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, resp.Header, "", nil
	}
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body), err
}

func hostMatch(hosts ...string) ctrlmeshv1alpha1.TrafficMatch {
	return ctrlmeshv1alpha1.TrafficMatch{Hosts: hosts}
}

// TestForwardProxyRateLimit: plain HTTP requests and HTTPS tunnels to a
// host pass at the declared rate (within ±10 %), the others get 429 with
// Retry-After and the rule's name, counted as API requests' refusals are;
// another host is not limited.
func TestForwardProxyRateLimit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	plain, plainServed := okServer(t, "127.0.0.2", false)
	secure, _ := okServer(t, "127.0.0.3", true)
	other, _ := okServer(t, "127.0.0.4", false)
	const qps, burst = 20, 10
	p, _ := startPolicyProxy(t, ctx, policyRoute("frl1", breakerPolicy(ctrlmeshv1alpha1.CircuitBreakerSpec{RateLimits: []ctrlmeshv1alpha1.RateLimit{
		{Name: "plain", QPS: qps, Burst: burst, Match: hostMatch("127.0.0.2")},
		{Name: "tunnels", QPS: qps, Burst: burst, Match: hostMatch("127.0.0.3")},
	}})))
	// Plain requests through Go's client; tunnels as bare CONNECTs (a
	// TLS handshake in each would make the clients, not the limit, set
	// the pace on a loaded machine; the tunnels of Go's HTTPS client are
	// the other tests').
	c := forwardClient(p, nil)
	for _, tc := range []struct {
		name string
		do   func() (int, http.Header, string, error)
	}{
		{"plain", func() (int, http.Header, string, error) { return send(c, http.MethodGet, plain.URL+"/x") }},
		{"tunnels", func() (int, http.Header, string, error) { return tryConnect(p, secure.Listener.Addr().String()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var passed, limited atomic.Int64
			var bad atomic.Value
			run := hammer(4*time.Second, 4, func() {
				code, header, body, err := tc.do()
				switch {
				case err != nil:
					bad.Store(err.Error())
				case code == http.StatusOK:
					passed.Add(1)
				case code == http.StatusTooManyRequests && header.Get("Retry-After") == "1" &&
					strings.Contains(body, "rate limit "+tc.name+" of CircuitBreaker cb"):
					limited.Add(1)
				default:
					bad.Store(fmt.Sprintf("%d %v %s", code, header, body))
				}
			})
			if b := bad.Load(); b != nil {
				t.Fatalf("not a pass nor a 429 with Retry-After: %v", b)
			}
			checkRate(t, passed.Load(), limited.Load(), run, qps, burst)
			want := fmt.Sprintf(`ctrlmesh_proxy_policy_decisions_total{kind="rateLimit",policy="cb",rule="%s",verdict="rate-limited"} %d`, tc.name, limited.Load())
			if !strings.Contains(scrape(t, p.health), want) {
				t.Errorf("metrics lack %s", want)
			}
		})
	}
	if got := plainServed.Load(); got == 0 {
		t.Fatal("the plain server saw none of the requests")
	}
	// Go's HTTPS client gets through the limit's tunnels, and reports a
	// refused one by its status.
	sc := forwardClient(p, secure)
	for {
		code, _, body, err := send(sc, http.MethodGet, secure.URL)
		if err == nil && code == http.StatusOK && body == "ok" {
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "Too Many Requests") {
			t.Fatalf("HTTPS over the limit: %d %s %v", code, body, err)
		}
		break
	}
	for range 3 * burst {
		if code, _, body, err := send(c, http.MethodGet, other.URL); err != nil || code != http.StatusOK {
			t.Fatalf("a request the limits do not match: %d %s %v", code, body, err)
		}
	}
	if want := `ctrlmesh_proxy_forward_requests_total{method="GET",outcome="forwarded"}`; !strings.Contains(scrape(t, p.health), want) {
		t.Errorf("metrics lack %s", want)
	}
}

// TestForwardProxyBreaker: a host answering 5xx opens its breaker, which
// then fails requests fast (503, Retry-After) for its recovery window
// without reaching the host; after the window one probe reaches it and,
// succeeding, closes the breaker. Tunnels that cannot be dialed open a
// breaker too.
func TestForwardProxyBreaker(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var failing atomic.Bool
	var served atomic.Int64
	failing.Store(true)
	flaky := externalServer(t, "127.0.0.2", false, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		if failing.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	// A port nothing listens on: tunnels to it cannot be dialed.
	l, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	const open = 3 * time.Second
	breaker := func(name, host string) ctrlmeshv1alpha1.Breaker {
		return ctrlmeshv1alpha1.Breaker{Name: name, Match: hostMatch(host), FailureRatioPercent: ptr.To[int32](50), MinRequests: 4,
			WindowSeconds: 30, OpenSeconds: int32(open / time.Second), HalfOpenProbes: 1}
	}
	p, _ := startPolicyProxy(t, ctx, policyRoute("fcb1", breakerPolicy(ctrlmeshv1alpha1.CircuitBreakerSpec{Breakers: []ctrlmeshv1alpha1.Breaker{
		breaker("flaky", "127.0.0.2"), breaker("unreachable", "127.0.0.3"),
	}})))
	c := forwardClient(p, nil)
	for i := range 4 {
		if code, _, body, err := send(c, http.MethodGet, flaky.URL); err != nil || code != http.StatusInternalServerError {
			t.Fatalf("failure %d: %d %s %v", i, code, body, err)
		}
	}
	opened := time.Now()
	code, header, body, err := send(c, http.MethodGet, flaky.URL)
	if err != nil || code != http.StatusServiceUnavailable || header.Get("Retry-After") != "3" ||
		!strings.Contains(body, "circuit breaker flaky of CircuitBreaker cb is open until") || !strings.Contains(body, "4 of 4 requests failed") {
		t.Fatalf("after 4 failures of 4: %d %v %s %v", code, header, body, err)
	}
	if got := served.Load(); got != 4 {
		t.Fatalf("the host saw %d requests; the open breaker let one through", got)
	}
	failing.Store(false)
	waitBreakerClosed(t, opened, open, func() (int, string) {
		code, _, body, err := send(c, http.MethodGet, flaky.URL)
		if err != nil {
			t.Fatal(err)
		}
		return code, body
	})
	if got := served.Load(); got != 5 {
		t.Errorf("the host saw %d requests: want the 4 failures and the one probe", got)
	}
	for range 5 {
		if code, _, body, err := send(c, http.MethodGet, flaky.URL); err != nil || code != http.StatusOK {
			t.Fatalf("after closing: %d %s %v", code, body, err)
		}
	}

	for i := range 4 {
		if code, _, body := connect(t, p, closed); code != http.StatusBadGateway {
			t.Fatalf("tunnel %d to a closed port: %d %s", i, code, body)
		}
	}
	if code, header, body := connect(t, p, closed); code != http.StatusServiceUnavailable || header.Get("Retry-After") == "" ||
		!strings.Contains(body, "circuit breaker unreachable of CircuitBreaker cb is open") {
		t.Fatalf("a tunnel under the open breaker: %d %v %s", code, header, body)
	}
}

// TestForwardProxyDeny: deny rules refuse exactly what they match, with
// their reason: by host, method and path prefix (any spelling of the
// path) for plain HTTP, by host alone for tunnels, which a match with
// methods or paths never refuses.
func TestForwardProxyDeny(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	plain, plainServed := okServer(t, "127.0.0.2", false)
	securePlainHost, _ := okServer(t, "127.0.0.2", true)
	secure, secureServed := okServer(t, "127.0.0.3", true)
	plainOfSecureHost, _ := okServer(t, "127.0.0.3", false)
	p, _ := startPolicyProxy(t, ctx, policyRoute("fdeny1", breakerPolicy(ctrlmeshv1alpha1.CircuitBreakerSpec{Deny: []ctrlmeshv1alpha1.DenyRule{
		{Name: "no-admin-deletes", Reason: "the operator must not delete admin objects",
			Match: ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"127.0.0.2"}, Methods: []string{"DELETE"}, PathPrefixes: []string{"/admin/"}}},
		{Name: "no-secure-host", Reason: "127.0.0.3 is off limits", Match: hostMatch("127.0.0.3")},
	}})))
	c := forwardClient(p, nil)
	for _, tc := range []struct {
		method, url string
		denied      bool
	}{
		{http.MethodDelete, plain.URL + "/admin/x", true},
		{http.MethodDelete, plain.URL + "/public/../admin/x", true},
		{http.MethodDelete, plain.URL + "//admin/x", true},
		{http.MethodDelete, plain.URL + "/%61dmin/x", true},
		{http.MethodDelete, plain.URL + "/admin", false},
		{http.MethodDelete, plain.URL + "/administrator/x", false},
		{http.MethodGet, plain.URL + "/admin/x", false},
		{http.MethodPost, plain.URL + "/admin/x", false},
		{http.MethodGet, plainOfSecureHost.URL + "/", true},
	} {
		before := plainServed.Load()
		code, _, body, err := send(c, tc.method, tc.url)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case tc.denied && (code != http.StatusForbidden || !strings.Contains(body, "denied by CircuitBreaker cb")):
			t.Errorf("%s %s: %d %s, want it denied", tc.method, tc.url, code, body)
		case !tc.denied && code != http.StatusOK:
			t.Errorf("%s %s: %d %s, want it through", tc.method, tc.url, code, body)
		case tc.denied && plainServed.Load() != before:
			t.Errorf("%s %s reached the host", tc.method, tc.url)
		}
	}
	if _, _, body, _ := send(c, http.MethodDelete, plain.URL+"/admin/x"); !strings.Contains(body, "rule no-admin-deletes: the operator must not delete admin objects") {
		t.Errorf("the refusal lacks the rule's reason: %s", body)
	}
	// Tunnels: the host-only rule refuses them, the one with a method and
	// path cannot see into them.
	if _, _, _, err := send(forwardClient(p, secure), http.MethodGet, secure.URL); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Errorf("HTTPS to a denied host: %v", err)
	}
	if code, _, body := connect(t, p, secure.Listener.Addr().String()); code != http.StatusForbidden || !strings.Contains(body, "rule no-secure-host: 127.0.0.3 is off limits") {
		t.Errorf("CONNECT to a denied host: %d %s", code, body)
	}
	if secureServed.Load() != 0 {
		t.Error("the denied HTTPS host was reached")
	}
	if code, _, body, err := send(forwardClient(p, securePlainHost), http.MethodDelete, securePlainHost.URL+"/admin/x"); err != nil || code != http.StatusOK {
		t.Errorf("HTTPS DELETE /admin/x, which a tunnel hides from the method and path rule: %d %s %v", code, body, err)
	}
	if want := `ctrlmesh_proxy_policy_decisions_total{kind="deny",policy="cb",rule="no-secure-host",verdict="denied"} 3`; !strings.Contains(scrape(t, p.health), want) {
		t.Errorf("metrics lack %s", want)
	}
}

// TestForwardProxyFaults: an abort lands on the declared percentage of a
// host's plain requests (binomial bounds), each counted; an abort of
// tunnels refuses them with its status, a delay holds them back.
func TestForwardProxyFaults(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	plain, _ := okServer(t, "127.0.0.2", false)
	aborted, _ := okServer(t, "127.0.0.3", true)
	slow, _ := okServer(t, "127.0.0.4", true)
	const percent, n = 30, 400
	p, _ := startPolicyProxy(t, ctx, policyRoute("ffi1", &ctrlmeshv1alpha1.RoutePolicies{FaultInjections: []ctrlmeshv1alpha1.RouteFaultInjection{{Name: "chaos", Generation: 1,
		Spec: ctrlmeshv1alpha1.FaultInjectionSpec{ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: "demo"}, Faults: []ctrlmeshv1alpha1.Fault{
			{Name: "abort", Percent: percent, Match: hostMatch("127.0.0.2"), Abort: &ctrlmeshv1alpha1.FaultAbort{StatusCode: 503}},
			{Name: "no-tunnel", Percent: 100, Match: hostMatch("127.0.0.3"), Abort: &ctrlmeshv1alpha1.FaultAbort{StatusCode: 504}},
			{Name: "slow", Percent: 100, Match: hostMatch("127.0.0.4"), Delay: &ctrlmeshv1alpha1.FaultDelay{Milliseconds: 100}},
		}}}}}))
	c := forwardClient(p, nil)
	hits := 0
	for range n {
		switch code, _, body, err := send(c, http.MethodGet, plain.URL); {
		case err != nil:
			t.Fatal(err)
		case code == http.StatusOK:
		case code == http.StatusServiceUnavailable && strings.Contains(body, "fault abort of FaultInjection chaos injected"):
			hits++
		default:
			t.Fatalf("status %d: %s", code, body)
		}
	}
	checkBinomial(t, hits, n, percent)
	if want := fmt.Sprintf(`ctrlmesh_proxy_faults_injected_total{effect="abort",fault="abort",policy="chaos"} %d`, hits); !strings.Contains(scrape(t, p.health), want) {
		t.Errorf("metrics lack %s", want)
	}
	if code, _, body := connect(t, p, aborted.Listener.Addr().String()); code != http.StatusGatewayTimeout || !strings.Contains(body, "fault no-tunnel of FaultInjection chaos injected") {
		t.Errorf("an aborted tunnel: %d %s", code, body)
	}
	sc := forwardClient(p, slow)
	for range 5 {
		start := time.Now()
		if code, _, body, err := send(sc, http.MethodGet, slow.URL); err != nil || code != http.StatusOK {
			t.Fatalf("a delayed tunnel: %d %s %v", code, body, err)
		}
		if took := time.Since(start); took < 100*time.Millisecond {
			t.Fatalf("a 100ms delay took %v", took)
		}
	}
	if want := `ctrlmesh_proxy_faults_injected_total{effect="delay",fault="slow",policy="chaos"} 5`; !strings.Contains(scrape(t, p.health), want) {
		t.Errorf("metrics lack %s", want)
	}
}

// TestForwardProxyRefusesTheAPIServer: the forward proxy is no way around
// the API port's fencing: the API server, by its address, by another name
// of it, or by the kubernetes Service's names, is refused for plain HTTP
// and tunnels alike, with a message pointing at the API port; before its
// first rules the forward proxy serves nothing.
func TestForwardProxyRefusesTheAPIServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	plain, served := okServer(t, "127.0.0.2", false)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	p := startProxy(t, ctx, fleet.Cluster("label").Config, "pod-a", file, rules.ModeLabel)
	c := forwardClient(p, nil)
	if code, header, body, err := send(c, http.MethodGet, plain.URL); err != nil || code != http.StatusServiceUnavailable ||
		header.Get("Retry-After") == "" || !strings.Contains(body, "rules not loaded yet") || served.Load() != 0 {
		t.Fatalf("before the first rules: %d %s %v", code, body, err)
	}
	r := policyRoute("fapi1", nil)
	writeRules(t, file, r)
	checkMetric(t, p.health, `ctrlmesh_proxy_rules_info{generation="1",hash="fapi1"`)
	if code, _, body, err := send(c, http.MethodGet, plain.URL); err != nil || code != http.StatusOK {
		t.Fatalf("with rules: %d %s %v", code, body, err)
	}

	api, err := url.Parse(fleet.Cluster("label").Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(api.Host)
	apiClient := forwardClient(p, nil)
	apiClient.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the test expects a refusal, never a TLS handshake
	for _, authority := range []string{api.Host, "localhost:" + port, "kubernetes.default.svc:443", "kubernetes.default.svc.cluster.local:443", "kubernetes:443"} {
		code, _, body := connect(t, p, authority)
		if code != http.StatusForbidden || !strings.Contains(body, "is the Kubernetes API server") ||
			!strings.Contains(body, fmt.Sprintf("through the proxy's API port 127.0.0.1:%d", ctrlmeshv1alpha1.ProxyListenPort)) {
			t.Errorf("CONNECT %s: %d %s", authority, code, body)
		}
		code, _, body, err := send(c, http.MethodGet, "http://"+authority+"/api/v1/namespaces")
		if err != nil || code != http.StatusForbidden || !strings.Contains(body, "is the Kubernetes API server") {
			t.Errorf("GET http://%s/api: %d %s %v", authority, code, body, err)
		}
	}
	if _, _, _, err := send(apiClient, http.MethodGet, "https://"+api.Host+"/api/v1/namespaces"); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Errorf("HTTPS to the API server through the forward proxy: %v", err)
	}
	// Origin-form requests are no proxy requests.
	resp, err := http.Get(p.forward.String() + "/api/v1/namespaces")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "is not a proxy request") {
		t.Errorf("an origin-form request: %d %s", resp.StatusCode, body)
	}
}

// TestForwardProxyForwards: a plain request reaches its host as sent —
// method, path, query, body, end-to-end headers — without hop-by-hop
// headers, proxy credentials or X-Forwarded-*; a tunnel carries TLS both
// ways; and the forward proxy listens on loopback only.
func TestForwardProxyForwards(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type seen struct {
		method, uri, body string
		header            http.Header
	}
	got := make(chan seen, 1)
	echo := externalServer(t, "127.0.0.2", false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.RequestURI, string(body), r.Header.Clone()}
		w.Header().Set("X-Answer", "42")
		w.WriteHeader(http.StatusCreated)
	}))
	secure, served := okServer(t, "127.0.0.3", true)
	p, _ := startPolicyProxy(t, ctx, policyRoute("ffwd1", nil))
	req, err := http.NewRequest(http.MethodPut, echo.URL+"/a/b?c=d", strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-End-To-End", "kept")
	req.Header.Set("X-Hop", "dropped")
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
	resp, err := forwardClient(p, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("X-Answer") != "42" {
		t.Errorf("the answer: %d %v", resp.StatusCode, resp.Header)
	}
	s := <-got
	if s.method != http.MethodPut || s.uri != "/a/b?c=d" || s.body != "payload" || s.header.Get("X-End-To-End") != "kept" {
		t.Errorf("the host saw %s %s %q %v", s.method, s.uri, s.body, s.header)
	}
	for _, h := range []string{"X-Hop", "Proxy-Authorization", "X-Forwarded-For", "X-Forwarded-Host", "Forwarded"} {
		if v := s.header.Values(h); v != nil {
			t.Errorf("the host saw %s: %v", h, v)
		}
	}
	if code, _, body, err := send(forwardClient(p, secure), http.MethodGet, secure.URL); err != nil || code != http.StatusOK || body != "ok" || served.Load() != 1 {
		t.Errorf("HTTPS through a tunnel: %d %q %v (served %d)", code, body, err, served.Load())
	}
	if want := `ctrlmesh_proxy_forward_requests_total{method="CONNECT",outcome="tunneled"} 1`; !strings.Contains(scrape(t, p.health), want) {
		t.Errorf("metrics lack %s", want)
	}

	err = proxy.Run(ctx, proxy.Options{Upstream: fleet.Cluster("label").Config, Pod: "pod-a", RulesFile: filepath.Join(t.TempDir(), "rules.yaml"),
		ListenAddress: "127.0.0.1:0", ForwardProxyAddress: "0.0.0.0:0"})
	if err == nil || !strings.Contains(err.Error(), "is not a loopback IP address") {
		t.Errorf("a forward proxy on every address: %v", err)
	}
}
