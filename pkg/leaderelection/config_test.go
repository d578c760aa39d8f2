package leaderelection_test

import (
	"context"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/pkg/leaderelection"
)

// server is an HTTP/2 TLS server answering every request with an empty
// LeaseList, counting the connections opened to it and recording each
// request's User-Agent.
type server struct {
	*httptest.Server
	mu     sync.Mutex
	conns  int
	agents []string
}

func newServer(t *testing.T) *server {
	s := &server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.agents = append(s.agents, r.UserAgent())
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","items":[]}`))
	}))
	s.EnableHTTP2 = true
	s.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			s.mu.Lock()
			s.conns++
			s.mu.Unlock()
		}
	}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func (s *server) connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// list lists Leases with a clientset of cfg, as controller-runtime's
// leader election builds its client.
func list(t *testing.T, cfg *rest.Config) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoordinationV1().Leases("ns").List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestOwnConnectionAndLimit: the leader election's client opens a
// connection of its own (the controllers' client reuses client-go's cached
// transport, so a copy of its config alone shares their HTTP/2 connection),
// has its own limit whatever the component's, and says who it is; the
// component's config is not changed.
func TestOwnConnectionAndLimit(t *testing.T) {
	s := newServer(t)
	component := &rest.Config{Host: s.URL, QPS: 0.01, Burst: 1, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM(t, s.Server)}}
	list(t, component)
	list(t, rest.CopyConfig(component))
	if got := s.connections(); got != 1 {
		t.Fatalf("two clients of one config opened %d connections; the test assumes client-go shares one", got)
	}

	elector := leaderelection.Config(component, "ctrlmesh-hub")
	list(t, elector)
	if got := s.connections(); got != 2 {
		t.Errorf("the leader election's client opened no connection of its own: %d connections in all", got)
	}
	if elector.QPS != leaderelection.QPS || elector.Burst != leaderelection.Burst || elector.RateLimiter != nil {
		t.Errorf("limit %v/%d (limiter %v), want its own %v/%d", elector.QPS, elector.Burst, elector.RateLimiter, leaderelection.QPS, leaderelection.Burst)
	}
	if component.QPS != 0.01 || component.Burst != 1 || component.Dial != nil || component.UserAgent != "" {
		t.Errorf("the component's config changed: %+v", component)
	}
	s.mu.Lock()
	last := s.agents[len(s.agents)-1]
	s.mu.Unlock()
	if !strings.HasPrefix(last, "ctrlmesh-hub") {
		t.Errorf("User-Agent %q, want the component's name", last)
	}
}

// caPEM is the PEM of the test server's certificate, its own CA.
func caPEM(t *testing.T, s *httptest.Server) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
}
