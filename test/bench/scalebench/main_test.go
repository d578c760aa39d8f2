package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestSmallFleet is make bench-scale at a small scale, in make test: every
// step runs against the real hub binary and API server, and the hub's
// promises hold whatever the timings — a pod failure and a restart each
// write the affected member's Work and nothing else, no Work is rewritten
// with the rules it had, the hub at rest makes no more requests than its
// leader election and the members' heartbeats call for, and a lost Fleet
// member's buckets go to the others. Its PerCluster configs share one
// namespace, as operators' do, so that the configs also tell each other
// what their members report (a restart's hub tells every config's
// peers), and still rewrite nothing.
func TestSmallFleet(t *testing.T) {
	assets := os.Getenv(env.AssetsEnv)
	if assets == "" {
		root, err := controlplane.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		assets = filepath.Join(root, "bin")
	}
	if err := controlplane.CheckBinaries(assets, "run make tools", "kube-apiserver", "etcd"); err != nil {
		t.Fatal(err)
	}
	opts := options{
		assets: assets, pods: 3, fleetSize: 3, namespace: "operators", steady: 10 * time.Second, proxyDelay: 100 * time.Millisecond,
		lease: 10 * time.Second, renew: 2 * time.Second, readyWithin: 5 * time.Minute, stepWithin: 3 * time.Minute,
		workDir: t.TempDir(), log: testWriter{t}, ceilingWorks: 40, startupWorks: 100,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	r, err := run(ctx, opts, scale{clusters: 4, configs: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !r.readyDone {
		t.Fatalf("not every ShardingConfig Ready within %s", r.ready)
	}
	if want := 4*3 + 3; r.works != want {
		t.Errorf("%d Works, want one per member and PerCluster config plus one per Fleet member (the ceiling's and the start's deleted): %d", r.works, want)
	}
	if c := r.ceiling; c == nil || c.works != 40 || c.creates <= 0 || c.updates <= 0 || c.statuses <= 0 || c.floor(r.works) <= 0 {
		t.Errorf("the API server's ceiling was not measured with 40 Works: %+v", c)
	} else if c.bytes < 2000 {
		t.Errorf("the ceiling's Works have %d bytes: they are not like the run's (a route of 3 placed pods, the labeler's RBAC and a member's status)", c.bytes)
	}
	if st := r.startup; st == nil || st.works != 100 || st.list.peak <= 0 || st.stream.peak <= 0 || st.list.heap <= 0 || st.stream.heap <= 0 {
		t.Errorf("a hub's start was not measured with 100 Works both ways: %+v", st)
	}
	// The API server's own counts: every Work created, each config's
	// status written, and the watchers sent what was written.
	if a := r.api; a == nil || a.writes["works POST"] < float64(r.works) || a.writes["shardingconfigs/status PATCH"] < 3 ||
		a.bodyBytes["shardingconfigs patch"] <= 0 || a.watchBytes["works"] <= 0 {
		t.Errorf("the API server's traffic during apply misses writes the hub made: %s", a.summary(20))
	}
	if len(r.reconcileErrors) > 0 {
		t.Errorf("the hub's reconciles failed during apply: %v (see its log)", r.reconcileErrors)
	}
	if want := []string{workKeyOf(opts.configKey(0), clusterName(0)).String()}; !slices.Equal(r.podFailureWrites, want) {
		t.Errorf("a pod failure wrote Works %v, want only the affected member's %v", r.podFailureWrites, want)
	}
	if want := []string{workKeyOf(opts.configKey(1), clusterName(1)).String()}; !slices.Equal(r.restartWrites, want) {
		t.Errorf("the new leader wrote Works %v, want only the one of the pod that failed %v", r.restartWrites, want)
	}
	if len(r.restartUnchanged) > 0 {
		t.Errorf("the new leader rewrote Works with the rules they had: %v", r.restartUnchanged)
	}
	if r.steadyWorkWrites > 0 {
		t.Errorf("%d Works written at rest", r.steadyWorkWrites)
	}
	// At rest the hub renews its leader Lease (every 2 s) and reads nothing
	// else: the members' heartbeats land in its watch.
	if perSec, bound := r.steadyRate(), 0.5+r.heartbeatsPerSec; perSec > bound {
		t.Errorf("the hub made %.2f requests/s at rest besides %d Event writes (%v), more than its leader election and the heartbeats (%.2f/s)", perSec, r.steadyEvents, r.steady, bound)
	}
	t.Logf("apply to Ready %s, pod failure %s, restart %s, Fleet member lost %s", r.ready, r.podFailure, r.restartHealed, r.fleetLoss)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

var _ io.Writer = testWriter{}

// TestParseMemoryLimits checks that a GOMEMLIMIT the Go runtime would
// refuse is refused by the benchmark, before it starts processes that
// would not start.
func TestParseMemoryLimits(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{args: nil, ok: true},
		{args: []string{"-hub-gomemlimit=921MiB", "-apiserver-gomemlimit=13GiB"}, ok: true},
		{args: []string{"-apiserver-gomemlimit=1073741824"}, ok: true},
		{args: []string{"-apiserver-gomemlimit=14GB"}},
		{args: []string{"-hub-gomemlimit=1Gi"}},
		{args: []string{"-hub-gomemlimit=-1MiB"}},
	} {
		c, err := parseFlags(append([]string{"-scales="}, tc.args...), io.Discard)
		if tc.ok != (err == nil) {
			t.Errorf("%v: error %v, want ok %v", tc.args, err, tc.ok)
		}
		if tc.ok && c == nil {
			t.Errorf("%v: no config", tc.args)
		}
	}
}
