package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/policy"
)

// The forward proxy serves the operator's external (non-Kubernetes)
// requests, which the injector sends to it through HTTP_PROXY and
// HTTPS_PROXY: plain HTTP in absolute form ("GET http://host/path"),
// forwarded by an httputil.ReverseProxy, and HTTPS as CONNECT tunnels. The
// traffic policies apply to them as to API requests, matched by host (and
// for plain HTTP by method and path). It never reaches the API server:
// API requests go through the API port, where they are fenced.

// Outcomes of the forward proxy's requests, the "outcome" label of
// ctrlmesh_proxy_forward_requests_total.
const (
	forwardForwarded   = "forwarded"
	forwardTunneled    = "tunneled"
	forwardFailed      = "failed"
	forwardPolicy      = outcomePolicy
	forwardRefused     = outcomeRefused
	forwardUnavailable = outcomeUnavailable
)

// countedMethods are the methods ctrlmesh_proxy_forward_requests_total
// names; others count as "other", so that a client cannot grow the
// metric without bound.
var countedMethods = []string{http.MethodConnect, http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions}

// APIAddresses are the API server's addresses, which the forward proxy
// refuses: by name and port before it decides anything, and by the IP
// address it dials (so that no other name of the API server gets
// through). The names of the kubernetes Service (kubernetes,
// kubernetes.default, kubernetes.default.svc and its names in any
// cluster domain) are refused on every port.
type APIAddresses struct {
	// hosts are refused on every port, hostPorts on theirs; both as
	// policy.HostOf reads them.
	hosts     []string
	hostPorts []string
	// ips are refused on every port, ipPorts on theirs.
	ips     []netip.Addr
	ipPorts []netip.AddrPort
}

// NewAPIAddresses refuses the API servers at urls (scheme://host[:port],
// each on its port: a loopback API server shares its address with other
// local servers) and the hosts names (names or IP addresses, on every
// port; loopback ones are left out, as the operator reaches the proxy's
// API port there). Names are resolved once, with resolve, to refuse their
// addresses too; a name that does not resolve is still refused by name.
func NewAPIAddresses(ctx context.Context, urls, hosts []string, resolve func(context.Context, string) ([]netip.Addr, error)) (*APIAddresses, error) {
	a := &APIAddresses{}
	add := func(host, port string) {
		host = policy.HostOf(host)
		if host == "" {
			return
		}
		ip, err := netip.ParseAddr(host)
		isIP := err == nil
		ip = ip.Unmap().WithZone("")
		switch {
		case port == "" && isIP && ip.IsLoopback(), port == "" && host == "localhost":
		case port == "" && isIP:
			a.ips = append(a.ips, ip)
		case port == "":
			a.hosts = append(a.hosts, host)
		default:
			a.hostPorts = append(a.hostPorts, net.JoinHostPort(host, port))
			if p, err := strconv.ParseUint(port, 10, 16); err == nil && isIP {
				a.ipPorts = append(a.ipPorts, netip.AddrPortFrom(ip, uint16(p)))
			}
		}
	}
	// The names to resolve, with the port they are refused on ("" every).
	type name struct{ host, port string }
	var names []name
	for _, raw := range urls {
		host, port, err := urlHostPort(raw)
		if err != nil {
			return nil, err
		}
		add(host, port)
		if _, err := netip.ParseAddr(host); err != nil {
			names = append(names, name{host, port})
		}
	}
	for _, h := range hosts {
		add(h, "")
		if h = policy.HostOf(h); h != "" && h != "localhost" && !kubernetesServiceName(h) {
			if _, err := netip.ParseAddr(h); err != nil {
				names = append(names, name{h, ""})
			}
		}
	}
	for _, n := range names {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		addrs, err := resolve(rctx, n.host)
		cancel()
		if err != nil {
			continue // refused by name still
		}
		for _, ip := range addrs {
			add(ip.Unmap().String(), n.port)
		}
	}
	return a, nil
}

// urlHostPort is the host and port of an API server's URL, with the
// scheme's default port.
func urlHostPort(raw string) (string, string, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		scheme, rest = "https", raw
	}
	rest, _, _ = strings.Cut(rest, "/")
	if host, port, err := net.SplitHostPort(rest); err == nil {
		return host, port, nil
	}
	switch scheme {
	case "http":
		return rest, "80", nil
	case "https":
		return rest, "443", nil
	}
	return "", "", fmt.Errorf("the API server's address %q has no port and an unknown scheme", raw)
}

// kubernetesServiceName reports whether host names the kubernetes Service
// (the API server) in any namespace search or cluster domain.
func kubernetesServiceName(host string) bool {
	return host == "kubernetes" || host == "kubernetes.default" || host == "kubernetes.default.svc" ||
		strings.HasPrefix(host, "kubernetes.default.svc.")
}

// refuses reports whether host (as policy.HostOf reads it) and port name
// the API server.
func (a *APIAddresses) refuses(host, port string) bool {
	if kubernetesServiceName(host) || slices.Contains(a.hosts, host) || slices.Contains(a.hostPorts, net.JoinHostPort(host, port)) {
		return true
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return a.refusesIP(netip.AddrPortFrom(ip.Unmap(), parsePort(port)))
	}
	return false
}

func (a *APIAddresses) refusesIP(ap netip.AddrPort) bool {
	ap = netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
	return slices.Contains(a.ips, ap.Addr()) || slices.Contains(a.ipPorts, ap)
}

func parsePort(port string) uint16 {
	p, _ := strconv.ParseUint(port, 10, 16)
	return uint16(p)
}

// errAPIServer is the dial guard's refusal of an API server's address.
var errAPIServer = errors.New("the address is the Kubernetes API server's")

// control refuses connections to the API server's addresses, as resolved
// when dialing: a name the forward proxy does not know as the API
// server's may still resolve to it.
func (a *APIAddresses) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dialing %s: %w", address, err)
	}
	if a.refusesIP(ap) {
		return fmt.Errorf("dialing %s: %w", address, errAPIServer)
	}
	return nil
}

// forwardRefusal is the forward proxy's own refusal of a request.
type forwardRefusal struct {
	status  int
	message string
}

// apiRefusal tells the operator that the API is not served here.
func apiRefusal(host string) *forwardRefusal {
	return &forwardRefusal{status: http.StatusForbidden, message: fmt.Sprintf(
		"ctrlmesh forward proxy: %s is the Kubernetes API server, which the forward proxy never reaches: API requests go through the proxy's API port 127.0.0.1:%d (the kubeconfig or in-cluster configuration the proxy wrote); exclude the API server's host from the proxy environment (NO_PROXY)",
		host, ctrlmeshv1alpha1.ProxyListenPort)}
}

// forwardRoute is the forward proxy's decision on where a request goes:
// the policy request the engine decides, and the authority (host:port) to
// dial; or the proxy's refusal. CONNECT asks for a tunnel to its
// authority; other methods must carry an absolute http:// URL. The path
// is matched decoded, with its dot segments resolved ("/a/../admin" is
// "/admin"), so that a path prefix matches every spelling of its paths.
func (a *APIAddresses) forwardRoute(r *http.Request) (policy.Request, string, *forwardRefusal) {
	bad := func(format string, args ...any) (policy.Request, string, *forwardRefusal) {
		return policy.Request{}, "", &forwardRefusal{status: http.StatusBadRequest, message: "ctrlmesh forward proxy: " + fmt.Sprintf(format, args...)}
	}
	var req policy.Request
	var authority string
	if r.Method == http.MethodConnect {
		authority = r.URL.Host
		if authority == "" || r.URL.Path != "" || r.URL.Scheme != "" {
			return bad("CONNECT needs a host:port to tunnel to, not %q", r.RequestURI)
		}
		req.Tunnel = true
	} else {
		u := r.URL
		switch {
		case u.Scheme == "" && u.Host == "":
			return bad("%s %s is not a proxy request: the forward proxy serves absolute http:// URLs and CONNECT; the Kubernetes API is served on 127.0.0.1:%d", r.Method, u.Path, ctrlmeshv1alpha1.ProxyListenPort)
		case u.Scheme != "http":
			return bad("the forward proxy serves http:// URLs, not %s:// (HTTPS clients tunnel with CONNECT)", u.Scheme)
		case u.Host == "":
			return bad("%s has no host", u.Redacted())
		}
		authority = u.Host
		if _, _, err := net.SplitHostPort(authority); err != nil {
			authority = net.JoinHostPort(strings.TrimSuffix(strings.TrimPrefix(authority, "["), "]"), "80")
		}
		req.Method, req.Path = r.Method, cleanPath(u.Path)
	}
	host, port, err := net.SplitHostPort(authority)
	if err != nil {
		return bad("%q is no host:port: %v", authority, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return bad("%q has no valid port", authority)
	}
	if req.Host = policy.HostOf(authority); req.Host == "" || host == "" {
		return bad("%q names no host", authority)
	}
	if r.Method != http.MethodConnect && policy.HostOf(r.Host) != req.Host {
		// The server sets Host from the URL; anything else is not a
		// request it parsed.
		return bad("the Host %q differs from the URL's host %q", r.Host, req.Host)
	}
	if a.refuses(req.Host, port) {
		return policy.Request{}, "", apiRefusal(req.Host)
	}
	return req, authority, nil
}

// cleanPath is p with its dot segments and repeated slashes resolved,
// keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	c := path.Clean("/" + p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

// forwardProxy is the forward proxy's handler.
type forwardProxy struct {
	p   *Proxy
	api *APIAddresses
	// dialTCP dials with the dialer's control refusing the API server's
	// addresses. A function, not a *net.Dialer field: a handler's fields
	// are reachable by reflection, and a *net.Dialer's would keep every
	// method of net.Resolver linked, costing the idle proxy's memory.
	dialTCP func(ctx context.Context, network, address string) (net.Conn, error)
	reverse *httputil.ReverseProxy
	log     logr.Logger
}

// dial connects to address unless it is the API server's: a name is
// refused when any of its addresses is (the dialer may try them all),
// and the dialer's control refuses an API server's address it is handed
// anyway.
func (f *forwardProxy) dial(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(host); err != nil {
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, err
		}
		for _, ip := range ips {
			if f.api.refusesIP(netip.AddrPortFrom(ip, parsePort(port))) {
				return nil, fmt.Errorf("%s resolves to %s: %w", host, ip, errAPIServer)
			}
		}
	}
	return f.dialTCP(ctx, network, address)
}

// ForwardProxy returns the handler of the forward proxy of p, which never
// reaches api. Serve it on loopback only: anything that reaches it
// reaches what the pod's network does.
func (p *Proxy) ForwardProxy(api *APIAddresses) http.Handler {
	f := &forwardProxy{p: p, api: api, log: p.log.WithName("forward"),
		dialTCP: (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: api.control}).DialContext}
	transport := &http.Transport{
		// Never another proxy: the proxy's own environment is not the
		// operator's.
		Proxy:                 nil,
		DialContext:           f.dial,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	f.reverse = &httputil.ReverseProxy{
		// The outbound request is the inbound one, absolute URL and all,
		// without hop-by-hop headers (ReverseProxy drops them) and without
		// X-Forwarded-* (Rewrite adds none): the host dialed is the URL's.
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.Host = ""
		},
		Transport: transport,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if rec, ok := w.(*outcomeRecorder); ok {
				rec.err = err
			}
			if errors.Is(err, errAPIServer) {
				http.Error(w, apiRefusal(r.URL.Host).message, http.StatusForbidden)
				return
			}
			http.Error(w, fmt.Sprintf("ctrlmesh forward proxy: %s %s: %v", r.Method, r.URL.Redacted(), err), http.StatusBadGateway)
		},
	}
	return f
}

func (f *forwardProxy) count(method, outcome string) {
	if !slices.Contains(countedMethods, method) {
		method = "other"
	}
	f.p.metrics.forwardRequests.With(method, outcome).Inc()
}

// ServeHTTP serves one request of the forward proxy. Before the first
// rules it serves nothing: their policies may refuse what it would let
// through.
func (f *forwardProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e := f.p.policies.Load()
	if e == nil {
		f.count(r.Method, forwardUnavailable)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "ctrlmesh forward proxy: rules not loaded yet, so the traffic policies are unknown", http.StatusServiceUnavailable)
		return
	}
	req, authority, refusal := f.api.forwardRoute(r)
	if refusal != nil {
		f.count(r.Method, forwardRefused)
		http.Error(w, refusal.message, refusal.status)
		return
	}
	d := e.Check(&req)
	if !f.p.enforce(w, r, &d, func(w http.ResponseWriter, d *policy.Decision) {
		f.count(r.Method, forwardPolicy)
		http.Error(w, "ctrlmesh forward proxy: "+d.Message, d.Status)
	}) {
		if d.Watched() {
			// As for API requests: an injected abort stands for the
			// upstream's failure.
			status := 0
			if d.Verdict == policy.Aborted && r.Context().Err() == nil {
				status = d.Status
			}
			e.Done(&d, status, d.Delay, false)
		}
		return
	}
	if req.Tunnel {
		f.tunnel(w, r, authority, e, &d)
		return
	}
	rec := &outcomeRecorder{ResponseWriter: w, start: time.Now()}
	f.reverse.ServeHTTP(rec, r)
	e.Done(&d, rec.status, time.Since(rec.start), false)
	outcome := forwardForwarded
	if rec.err != nil {
		outcome = forwardFailed
	}
	f.count(r.Method, outcome)
}

// tunnel connects the client to authority. The breakers count the dial:
// a tunnel that cannot be dialed failed, and a slow dial is a slow call;
// what flows through the tunnel is the client's and the host's.
func (f *forwardProxy) tunnel(w http.ResponseWriter, r *http.Request, authority string, e *policy.Engine, d *policy.Decision) {
	start := time.Now()
	upstream, err := f.dial(r.Context(), "tcp", authority)
	if err != nil {
		e.Done(d, 0, time.Since(start), false)
		f.count(r.Method, forwardFailed)
		if errors.Is(err, errAPIServer) {
			http.Error(w, apiRefusal(authority).message, http.StatusForbidden)
			return
		}
		http.Error(w, fmt.Sprintf("ctrlmesh forward proxy: tunnel to %s: %v", authority, err), http.StatusBadGateway)
		return
	}
	e.Done(d, http.StatusOK, time.Since(start), false)
	client, buffered, err := http.NewResponseController(w).Hijack()
	if err != nil {
		_ = upstream.Close()
		f.count(r.Method, forwardFailed)
		http.Error(w, "ctrlmesh forward proxy: cannot take the connection over: "+err.Error(), http.StatusInternalServerError)
		return
	}
	f.count(r.Method, forwardTunneled)
	defer func() { _ = client.Close(); _ = upstream.Close() }()
	// The proxy's end ends the tunnel too.
	stop := context.AfterFunc(r.Context(), func() { _ = client.Close(); _ = upstream.Close() })
	defer stop()
	if _, err := buffered.WriteString("HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	if err := buffered.Flush(); err != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// What the client sent after CONNECT may be buffered already. The
		// client's end of its stream ends the host's; the host's answer
		// may still come.
		_, _ = io.Copy(upstream, buffered.Reader)
		closeWrite(upstream)
	}()
	// The host's end of its stream ends the tunnel: nothing the client
	// still sends would be answered.
	_, _ = io.Copy(client, upstream)
	_ = client.Close()
	_ = upstream.Close()
	wg.Wait()
}

// closeWrite half-closes c, so that its peer reads the end of the stream
// while the other direction goes on.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
