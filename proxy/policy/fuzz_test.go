package policy

import (
	"strings"
	"testing"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// FuzzMatch holds the matcher to what its documentation says for any
// pattern and request: a host match never matches an API request, "*"
// matches every external request with a host, an exact host only itself,
// a suffix only hosts ending in "."+suffix, and a tunnel only matches
// without methods and path prefixes.
func FuzzMatch(f *testing.F) {
	f.Add("*.example.com", "a.example.com", "GET", "/v1/x", "/v1", false)
	f.Add("example.com", "example.com", "POST", "/", "", true)
	f.Add("*", "", "GET", "/", "", false)
	f.Fuzz(func(t *testing.T, pattern, host, method, path, prefix string, tunnel bool) {
		m := ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{pattern}}
		if prefix != "" {
			m.PathPrefixes = []string{prefix}
		}
		cm := compileMatch(m)
		req := Request{Host: host, Method: method, Path: path, Tunnel: tunnel}
		got := cm.matches(&req)
		p := strings.ToLower(pattern)
		var want bool
		switch {
		case host == "":
			want = false
		case p == "*":
			want = true
		case strings.HasPrefix(p, "*."):
			want = strings.HasSuffix(host, p[1:]) && len(host) > len(p)-1
		default:
			want = p == host
		}
		if tunnel && prefix != "" {
			want = false
		} else if !tunnel && prefix != "" {
			want = want && strings.HasPrefix(path, prefix)
		}
		if got != want {
			t.Fatalf("pattern %q prefix %q, request %+v: matches %v, want %v", pattern, prefix, req, got, want)
		}
		api := req
		api.Resource, api.Verb = "pods", "get"
		if cm.matches(&api) {
			t.Fatalf("host match %q matched an API request", pattern)
		}
	})
}

// FuzzHostOf: the host a request is matched by has no port, no brackets,
// no upper case, no characters of a URL's other parts, and reading it again
// changes nothing.
func FuzzHostOf(f *testing.F) {
	for _, s := range []string{"Example.COM:443", "[::1]:80", "a@b:1", "10.0.0.1", "x.", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, authority string) {
		h := HostOf(authority)
		if h != strings.ToLower(h) || strings.ContainsAny(h, "/@?# []") {
			t.Fatalf("HostOf(%q) = %q", authority, h)
		}
		if again := HostOf(h); again != h && !strings.Contains(h, ":") {
			t.Fatalf("HostOf(%q) = %q, but HostOf(%q) = %q", authority, h, h, again)
		}
	})
}
