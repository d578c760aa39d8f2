// Package policy is the proxy's traffic-policy engine: the CircuitBreakers
// and FaultInjections a ShardRoute carries (spec.policies), compiled for
// one pod (Compile, a Set: pure and immutable) and enforced with their
// state — token buckets, breakers, deny counters — by an Engine, which
// carries the state of unchanged rules over a reload. The engine decides;
// the proxy (package proxy) answers, forwards and counts.
package policy

import (
	"net"
	"slices"
	"strings"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// Request is what the engine knows of one request of the operator: an API
// request (Resource set) or an external one through the forward proxy
// (Host set).
type Request struct {
	// API requests, as the API server's RequestInfo reads them: the group,
	// the resource (without subresource), the verb, the namespace and the
	// object's name, each "" when the request has none.
	Group, Resource, Verb, Namespace, Name string
	// External requests: the host (lower case, without port), and for
	// plain HTTP the method and the path. Tunnel is true for CONNECT
	// (HTTPS), whose method and path the proxy cannot see.
	Host, Method, Path string
	Tunnel             bool
}

// API reports whether r is an API request.
func (r *Request) API() bool { return r.Resource != "" }

// matcher is a compiled TrafficMatch.
type matcher struct {
	resources  []ctrlmeshv1alpha1.ResourceGroup
	verbs      []string
	namespaces []string
	names      []string
	hosts      []string
	methods    []string
	paths      []string
}

func compileMatch(m ctrlmeshv1alpha1.TrafficMatch) matcher {
	out := matcher{
		resources: m.Resources, namespaces: m.Namespaces, names: m.Names,
		methods: m.Methods, paths: m.PathPrefixes,
	}
	for _, v := range m.Verbs {
		out.verbs = append(out.verbs, string(v))
	}
	for _, h := range m.Hosts {
		out.hosts = append(out.hosts, strings.ToLower(h))
	}
	return out
}

// matches reports whether r is one of the requests m selects. A match names
// either API resources or external hosts (the CRD and Compile hold it to
// that), so an API request never matches a host match and the other way
// round.
func (m *matcher) matches(r *Request) bool {
	if len(m.resources) > 0 {
		if !r.API() || !m.matchesResource(r.Group, r.Resource) {
			return false
		}
		return anyOrContains(m.verbs, r.Verb, "*") && anyOrContains(m.namespaces, r.Namespace, "") &&
			anyOrContains(m.names, r.Name, "")
	}
	if r.API() || r.Host == "" || !slices.ContainsFunc(m.hosts, func(h string) bool { return hostMatches(h, r.Host) }) {
		return false
	}
	if r.Tunnel {
		return len(m.methods) == 0 && len(m.paths) == 0
	}
	return anyOrContains(m.methods, r.Method, "") &&
		(len(m.paths) == 0 || slices.ContainsFunc(m.paths, func(p string) bool { return strings.HasPrefix(r.Path, p) }))
}

func (m *matcher) matchesResource(group, resource string) bool {
	return slices.ContainsFunc(m.resources, func(rg ctrlmeshv1alpha1.ResourceGroup) bool {
		return (slices.Contains(rg.APIGroups, "*") || slices.Contains(rg.APIGroups, group)) &&
			(slices.Contains(rg.Resources, "*") || slices.Contains(rg.Resources, resource))
	})
}

// anyOrContains: an empty list matches everything; else the value must be
// in it, or the wildcard when one is given ("" for none).
func anyOrContains(list []string, value, wildcard string) bool {
	if len(list) == 0 {
		return true
	}
	return slices.Contains(list, value) || (wildcard != "" && slices.Contains(list, wildcard))
}

// hostMatches matches a host against "*", "*.suffix" (its subdomains, not
// the suffix itself) or an exact name.
func hostMatches(pattern, host string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasPrefix(pattern, "*."):
		return strings.HasSuffix(host, pattern[1:]) && len(host) > len(pattern)-1
	default:
		return pattern == host
	}
}

// HostOf is the host an external request is matched by: the authority
// (host, host:port, [ipv6]:port) without port and brackets, in lower case,
// with a trailing dot dropped; "" when it names no host.
func HostOf(authority string) string {
	host := authority
	if h, _, err := net.SplitHostPort(authority); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if strings.ContainsAny(host, "/@?# []") {
		return ""
	}
	return host
}
