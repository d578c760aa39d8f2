package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    options // checked when wantErr is false
		wantErr bool
	}{
		{"defaults", nil, options{mode: "range", content: "protobuf", gets: 2000, lists: 20, events: 5000, writers: 8, replays: 5, clients: 64, concurrentFor: 10 * time.Second, rounds: 3, policies: 20, timeout: 20 * time.Minute}, false},
		{"label json", []string{"-mode=label", "-content=json", "-gets=10", "-cpuprofile=/tmp/x", "-proxy-cpuprofile=/tmp/p", "-policies=0"}, options{mode: "label", content: "json", gets: 10, lists: 20, events: 5000, writers: 8, replays: 5, clients: 64, concurrentFor: 10 * time.Second, rounds: 3, timeout: 20 * time.Minute, cpuProfile: "/tmp/x", proxyCPUProfile: "/tmp/p"}, false},
		{"too many policies", []string{"-policies=65"}, options{}, true},
		{"unknown mode", []string{"-mode=detect"}, options{}, true},
		{"unknown content", []string{"-content=cbor"}, options{}, true},
		{"no gets", []string{"-gets=0"}, options{}, true},
		{"too many events", []string{"-events=10001"}, options{}, true},
		{"stray argument", []string{"extra"}, options{}, true},
		{"zero timeout", []string{"-timeout=0s"}, options{}, true},
		{"no clients", []string{"-clients=0"}, options{}, true},
		{"zero concurrent duration", []string{"-concurrent-duration=0s"}, options{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseFlags(tc.args, io.Discard)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("parseFlags(%v) accepted, want an error", tc.args)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%v): %v", tc.args, err)
			}
			if got != tc.want {
				t.Errorf("parseFlags(%v) = %+v, want %+v", tc.args, got, tc.want)
			}
		})
	}
	if _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: got %v, want flag.ErrHelp", err)
	}
}

// TestThreeWays is the benchmark's path in small, in make test, against a
// real kube-apiserver in range mode (the default): one namespace's 1,000
// ConfigMaps seeded; ctrlmesh-proxy and the bare hop built and started each
// in its own process as the benchmark starts them; GETs, LISTs of 1,000 and
// a short concurrent run interleaved the three ways, each response checked,
// and the hop's and the proxy's CPU time read.
func TestThreeWays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	o, err := parseFlags([]string{"-clients=4", "-concurrent-duration=500ms", "-rounds=3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "bench", FeatureGates: []string{env.FeatureShardedListAndWatch}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	})
	cluster := fleet.Cluster("bench")
	b := &bench{o: o, log: testWriter{t}, start: time.Now(), selector: benchLabel + "=" + benchValue}
	if b.direct, err = kubernetes.NewForConfig(tune(rest.CopyConfig(cluster.Config), o.content)); err != nil {
		t.Fatal(err)
	}
	if err := b.seed(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for _, start := range []func(context.Context, string) (func() error, error){b.startProxy, b.startHop} {
		stop, err := start(ctx, cluster.KubeconfigPath)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Error(err)
			}
		})
	}
	if _, err := b.checkMode(ctx); err != nil {
		t.Fatal(err)
	}

	ns, name := objectKey(0)
	const rounds = 3
	var gets [numWays][]time.Duration
	cost, err := b.measureCPU(rounds, func() (err error) {
		gets, err = b.interleave(ctx, "GET", 1, rounds, 1, func(ctx context.Context, cs kubernetes.Interface) (time.Duration, int, error) {
			start := time.Now()
			cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
			if err == nil && cm.Labels[benchLabel] != benchValue {
				t.Errorf("GET %s/%s returned %v, not the seeded object", ns, name, cm.ObjectMeta)
			}
			return time.Since(start), 1, err
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	lists, err := b.interleave(ctx, "LIST 1k", 0, 2, perNamespace, func(ctx context.Context, cs kubernetes.Interface) (time.Duration, int, error) {
		start := time.Now()
		l, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: b.selector})
		if err != nil {
			return 0, 0, err
		}
		return time.Since(start), len(l.Items), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var res results
	if err := b.measureConcurrent(ctx, &res); err != nil {
		t.Fatal(err)
	}
	for _, w := range ways {
		if len(gets[w]) != rounds || len(lists[w]) != 2 {
			t.Errorf("%s: %d GETs and %d LISTs timed, want %d and 2", w, len(gets[w]), len(lists[w]), rounds)
		}
		if len(res.conc[w]) != o.rounds || throughput(res.conc[w]) <= 0 {
			t.Errorf("%s: concurrent runs %+v, want %d with requests", w, res.conc[w], o.rounds)
		}
		if w == wayDirect {
			continue
		}
		if cost[w].requests != rounds || cost[w].cpu < 0 || res.cpuConcurrent[w].requests <= 0 || res.cpuConcurrent[w].cpu < 0 {
			t.Errorf("%s: CPU %+v over the GETs, %+v over the concurrent runs", w, cost[w], res.cpuConcurrent[w])
		}
	}
}

// TestOrder: over numWays rounds, every way goes once in every position.
func TestOrder(t *testing.T) {
	var seen [numWays][numWays]int
	for i := range int(numWays) {
		for pos, w := range order(i) {
			seen[w][pos]++
		}
	}
	for w, positions := range seen {
		for pos, n := range positions {
			if n != 1 {
				t.Errorf("%s went %d times in position %d over %d rounds, want once", way(w), n, pos, numWays)
			}
		}
	}
}

// testWriter sends the benchmark's progress to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
