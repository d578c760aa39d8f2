package proxy_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// TestStopsCleanlyWithConnectionsOpen: a proxy told to stop while its
// operator holds a watch open and a client connection that never sent a
// request (as net/http's transport leaves one when another connection
// took its request) stops within its grace and without an error. It
// returned "context deadline exceeded" instead: each counted as busy
// until the graceful stop ran out its time (in CI, after
// TestRateLimitThroughProxy's clients).
func TestStopsCleanlyWithConnectionsOpen(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster := fleet.Cluster("range")
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, route("s1", 1, "0-15", "16-31"))
	ready := make(chan [2]net.Addr, 1)
	errc := make(chan error, 1)
	runCtx, stop := context.WithCancel(ctx)
	go func() {
		errc <- proxy.Run(runCtx, proxy.Options{
			Upstream: cluster.Config, Pod: "pod-a", RulesFile: rulesFile, RulesFileInterval: 50 * time.Millisecond, Mode: rules.ModeRange,
			ListenAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0",
			Ready: func(api, health, _ net.Addr) { ready <- [2]net.Addr{api, health} },
			Log:   testr.New(t).WithName("pod-a"),
		})
	}()
	var addrs [2]net.Addr
	select {
	case addrs = <-ready:
	case err := <-errc:
		t.Fatalf("proxy: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the proxy did not start")
	}
	checkMetric(t, "http://"+addrs[1].String(), `ctrlmesh_proxy_rules_info{generation="1",hash="s1"`)
	watch := openWatch(t, ctx, &rest.Config{Host: "http://" + addrs[0].String()}, "application/json")
	defer func() { _ = watch.Body.Close() }()
	idle, err := net.Dial("tcp", addrs[0].String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = idle.Close() }()

	stopped := time.Now()
	stop()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("the proxy stopped with %v, %v after it was told to", err, time.Since(stopped))
		}
		t.Logf("stopped %v after it was told to", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("the proxy did not stop within 30s")
	}
}
