package proxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/proxy/policy"
)

// fuzzAPI are the API server's addresses of the forward proxy's fuzz
// target: a Service IP, a name with its port, an endpoint and the loopback
// names the operator reaches the API port by (which are not refused).
func fuzzAPI(t testing.TB) *APIAddresses {
	a, err := NewAPIAddresses(context.Background(), []string{"https://10.96.0.1:443", "https://api.example.com:6443"},
		[]string{"172.18.0.2", "127.0.0.1", "localhost", "kubernetes.default.svc.cluster.local"},
		func(context.Context, string) ([]netip.Addr, error) {
			return nil, errors.New("no resolver in the fuzz target")
		})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// FuzzForwardRoute: whatever request the forward proxy's server parses,
// its routing decision either refuses it or names a host:port to dial
// whose host is the one the policies match, which is never the API
// server's; a tunnel is exactly a CONNECT, and a plain request's path, as
// the policies match it, has no dot segments or empty ones.
func FuzzForwardRoute(f *testing.F) {
	for _, seed := range []string{
		"GET http://example.com/a/b?c=d HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"DELETE http://example.com:8080/public/../admin/x HTTP/1.1\r\nHost: example.com:8080\r\n\r\n",
		"GET http://[::1]:8080//admin/%2e%2e/x HTTP/1.1\r\n\r\n",
		"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
		"CONNECT [::ffff:10.96.0.1]:443 HTTP/1.1\r\n\r\n",
		"CONNECT kubernetes.default.svc.:443 HTTP/1.1\r\n\r\n",
		"CONNECT API.EXAMPLE.COM:6443 HTTP/1.1\r\n\r\n",
		"GET http://172.18.0.2:6443/api HTTP/1.1\r\n\r\n",
		"GET /api/v1/pods HTTP/1.1\r\nHost: 127.0.0.1:15082\r\n\r\n",
		"GET https://example.com/ HTTP/1.1\r\n\r\n",
		"CONNECT example.com HTTP/1.1\r\n\r\n",
		"GET http://user:pw@example.com:0/ HTTP/1.1\r\n\r\n",
	} {
		f.Add(seed)
	}
	api := fuzzAPI(f)
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return
		}
		req, authority, refusal := api.forwardRoute(r)
		if refusal != nil {
			if (refusal.status != http.StatusBadRequest && refusal.status != http.StatusForbidden) || refusal.message == "" {
				t.Fatalf("refusal %d %q", refusal.status, refusal.message)
			}
			return
		}
		host, port, err := net.SplitHostPort(authority)
		if err != nil {
			t.Fatalf("dials %q: %v", authority, err)
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			t.Fatalf("dials port %q", port)
		}
		if req.Host == "" || req.Host != policy.HostOf(authority) || policy.HostOf(host) != req.Host {
			t.Fatalf("matches host %q, dials %q", req.Host, authority)
		}
		if kubernetesServiceName(req.Host) || api.refuses(req.Host, port) {
			t.Fatalf("routes %q to the API server", authority)
		}
		if ip, err := netip.ParseAddr(req.Host); err == nil {
			ap := netip.AddrPortFrom(ip.Unmap(), parsePort(port))
			if ap.Addr() == netip.MustParseAddr("10.96.0.1") && port == "443" || ap.Addr() == netip.MustParseAddr("172.18.0.2") {
				t.Fatalf("routes %q to the API server", authority)
			}
		}
		if req.Tunnel != (r.Method == http.MethodConnect) {
			t.Fatalf("%s is a tunnel: %v", r.Method, req.Tunnel)
		}
		if req.Tunnel {
			return
		}
		if req.Method != r.Method || !strings.HasPrefix(req.Path, "/") {
			t.Fatalf("matches %s %q", req.Method, req.Path)
		}
		for _, seg := range strings.Split(strings.TrimSuffix(req.Path[1:], "/"), "/") {
			if (seg == "" && req.Path != "/") || seg == "." || seg == ".." {
				t.Fatalf("matches path %q, with segment %q", req.Path, seg)
			}
		}
	})
}

// TestAPIAddresses: what the forward proxy refuses as the API server's,
// by name and port and by address when dialing.
func TestAPIAddresses(t *testing.T) {
	resolved := map[string][]netip.Addr{"api.example.com": {netip.MustParseAddr("10.0.0.9")}, "local.example.com": {netip.MustParseAddr("127.0.0.1")}}
	a, err := NewAPIAddresses(context.Background(), []string{"https://api.example.com:6443", "http://127.0.0.1:8080/prefix"},
		[]string{"10.96.0.1", "127.0.0.1", "localhost", "::1", "local.example.com", "kubernetes.default.svc.cluster.local"},
		func(_ context.Context, host string) ([]netip.Addr, error) {
			if ips, ok := resolved[host]; ok {
				return ips, nil
			}
			return nil, errors.New("no such host")
		})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		host, port string
		refused    bool
	}{
		{"api.example.com", "6443", true},
		{"api.example.com", "443", false},
		{"10.0.0.9", "6443", true}, // the name's address, on its port
		{"10.0.0.9", "80", false},
		{"10.96.0.1", "443", true}, // a serving name: every port
		{"10.96.0.1", "80", true},
		{"::ffff:10.96.0.1", "443", true},
		{"127.0.0.1", "8080", true}, // a loopback upstream: its port only
		{"127.0.0.1", "15082", false},
		{"localhost", "80", false},
		{"::1", "80", false},
		{"local.example.com", "80", true}, // by name; its loopback address is not refused
		{"kubernetes", "443", true},
		{"kubernetes.default.svc.other.domain", "8443", true},
		{"kubernetes.example.com", "443", false},
		{"example.com", "443", false},
	} {
		if got := a.refuses(tt.host, tt.port); got != tt.refused {
			t.Errorf("refuses(%s, %s) = %v, want %v", tt.host, tt.port, got, tt.refused)
		}
	}
	for address, refused := range map[string]bool{"10.96.0.1:1": true, "[::ffff:10.96.0.1]:443": true, "10.0.0.9:6443": true,
		"10.0.0.9:443": false, "127.0.0.1:8080": true, "127.0.0.1:8081": false, "[fe80::1%eth0]:80": false} {
		if err := a.control("tcp", address, nil); (err != nil) != refused || (err != nil && !errors.Is(err, errAPIServer)) {
			t.Errorf("dialing %s: %v, want refused %v", address, err, refused)
		}
	}
}
