package proxy

import (
	"bufio"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// TestUpgradesPassThrough: exec, attach and port-forward are upgraded
// connections (SPDY or WebSocket). They cannot travel over HTTP/2, which TLS
// would negotiate with kube-apiserver, so the proxy speaks HTTP/1.1 upstream
// and splices the two connections.
//
// kube-apiserver here has no kubelet to upgrade to, so the upstream is a TLS
// server that speaks HTTP/2 and answers an upgrade like kube-apiserver does:
// 101 Switching Protocols, then a raw stream (an echo).
func TestUpgradesPassThrough(t *testing.T) {
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			_, _ = io.WriteString(w, r.Proto)
			return
		}
		if r.Header.Get("Upgrade") != "SPDY/3.1" || r.ProtoMajor != 1 {
			http.Error(w, fmt.Sprintf("want an HTTP/1.1 SPDY upgrade, got %s upgrade %q", r.Proto, r.Header.Get("Upgrade")), http.StatusBadRequest)
			return
		}
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer func() { _ = conn.Close() }()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
		_ = buf.Flush()
		_, _ = io.Copy(conn, buf)
	}))
	upstream.EnableHTTP2 = true
	upstream.StartTLS()
	defer upstream.Close()

	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw})
	cfg := &rest.Config{Host: upstream.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, meta.RESTScopeNamespace)
	p, err := New(Config{Upstream: cfg, Scopes: rules.NewMapperScopes(mapper), Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	p.SetRules(wildcardRules(t, "u1", "0-31"))
	front := httptest.NewServer(p)
	defer front.Close()

	// Plain requests go over HTTP/1.1 too, though the upstream offers
	// HTTP/2: it costs less per request (see New).
	resp, err := http.Get(front.URL + "/version")
	if err != nil {
		t.Fatal(err)
	}
	proto, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || string(proto) != "HTTP/1.1" {
		t.Fatalf("a plain request reached the upstream as %q (%v), want HTTP/1.1", proto, err)
	}

	conn, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = fmt.Fprintf(conn, "POST /api/v1/namespaces/team-a/pods/p/exec?command=sh HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	upgraded, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if upgraded.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(upgraded.Body)
		t.Fatalf("upgrade through the proxy: %s %s", upgraded.Status, body)
	}
	if _, err := conn.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	line, err := br.ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("stream after the upgrade: %q, %v", line, err)
	}
}
