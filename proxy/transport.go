package proxy

import (
	"net/http"

	"k8s.io/client-go/rest"
)

// upstreamIdleConns is how many idle keep-alive connections to the API
// server the proxy's forwarding keeps. client-go keeps 25, which suits one
// client; the proxy forwards every request of an operator over HTTP/1.1,
// one connection per request in flight, and past 25 at once each request
// closed a connection and the next paid a new TLS handshake (make
// bench-proxy, 64 concurrent clients).
const upstreamIdleConns = 256

// upstreamTransport is rest.TransportFor(cfg) — verified TLS, the
// operator's credentials, token files re-read — over an http.Transport of
// the proxy's own whose idle pool holds upstreamIdleConns connections.
// Setting cfg.Proxy (to what client-go would use anyway) keeps client-go
// from sharing the transport with other clients of the same config.
func upstreamTransport(cfg *rest.Config) (http.RoundTripper, error) {
	if cfg.Proxy == nil {
		cfg.Proxy = http.ProxyFromEnvironment
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	for next := rt; next != nil; {
		switch t := next.(type) {
		case *http.Transport:
			t.MaxIdleConnsPerHost = upstreamIdleConns
			return rt, nil
		case interface{ WrappedRoundTripper() http.RoundTripper }:
			next = t.WrappedRoundTripper()
		default:
			next = nil
		}
	}
	return rt, nil
}
