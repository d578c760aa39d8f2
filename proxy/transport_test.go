package proxy

import (
	"net/http"
	"testing"

	"k8s.io/client-go/rest"
)

// TestUpstreamTransportKeepsIdleConnections: the forwarding transport is
// the proxy's own, its idle pool upstreamIdleConns deep, and the config's
// credentials still wrap it.
func TestUpstreamTransportKeepsIdleConnections(t *testing.T) {
	cfg := &rest.Config{Host: "https://example.invalid", BearerToken: "t", TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	var inner []*http.Transport
	for range 2 {
		rt, err := upstreamTransport(rest.CopyConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		wrapped := false
		for next := rt; next != nil; {
			switch tr := next.(type) {
			case *http.Transport:
				inner = append(inner, tr)
				next = nil
			case interface{ WrappedRoundTripper() http.RoundTripper }:
				wrapped = true
				next = tr.WrappedRoundTripper()
			default:
				t.Fatalf("%T wraps no *http.Transport", next)
			}
		}
		if !wrapped {
			t.Error("the bearer token does not wrap the transport")
		}
	}
	if len(inner) != 2 || inner[0] == inner[1] {
		t.Fatal("two proxies share one transport")
	}
	if got := inner[0].MaxIdleConnsPerHost; got != upstreamIdleConns {
		t.Errorf("MaxIdleConnsPerHost = %d, want %d", got, upstreamIdleConns)
	}
	if shared, err := rest.TransportFor(cfg); err == nil && shared == http.RoundTripper(inner[0]) {
		t.Error("the proxy's transport is client-go's shared one")
	}
}
