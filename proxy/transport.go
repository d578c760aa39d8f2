package proxy

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"

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

// UpstreamReverseProxy is the proxy's forwarding to the API server of cfg
// and nothing more: no checks, no sharding, no refusals (newReverse adds
// those). It is exported for test/bench/proxybench, which runs it alone as
// its bare hop, the smallest proxy with ctrlmesh-proxy's own forwarding,
// to measure what any sidecar's extra hop costs.
//
// Upstream requests travel over HTTP/1.1, not the HTTP/2 that TLS would
// negotiate with kube-apiserver: upgraded connections (exec, attach,
// port-forward) need it, and for everything else Go's HTTP/2 client costs
// more per request than a pool of keep-alive HTTP/1.1 connections (make
// bench-proxy: GET p50 1.17x of direct over HTTP/2, 1.06-1.09x over
// HTTP/1.1, in one session on 2 shared cores). A watch holds its own
// connection, as with any HTTP/1.1 client. The transport verifies the
// server against the configured CA and adds the operator's credentials
// (token files are re-read on rotation).
func UpstreamReverseProxy(cfg *rest.Config) (*httputil.ReverseProxy, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("host %q: %w", cfg.Host, err)
	}
	if target.Scheme == "" {
		target.Scheme = "https"
	}
	transport, err := upstreamTransport(http1Only(cfg))
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// The upstream credentials are the operator's own, added by the
			// transport; whatever the client sent is not forwarded.
			pr.Out.Header.Del("Authorization")
		},
		Transport:  transport,
		BufferPool: newBufferPool(),
		// No periodic flushing: ReverseProxy flushes every write of a body
		// of unknown length itself (watches, chunked lists, logs followed,
		// whatever the transport decompressed), so streams do not stall. A
		// body of known length (a GET's object) is written whole and goes
		// out with its headers in one write; with FlushInterval -1 every
		// response started a timer whose goroutine flushed the headers in a
		// write of their own first (make bench-proxy, proxy CPU per GET).
		FlushInterval: 0,
	}, nil
}
