package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
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

// TestWays is the benchmark's path in small, in make test, against a real
// kube-apiserver in range mode (the default): one namespace's 1,000
// ConfigMaps seeded; ctrlmesh-proxy and the bare hop built and started each
// in its own process as the benchmark starts them; the narrowed ways'
// lists carrying the shardSelector the proxy sends (checkMode); GETs and a
// short concurrent run interleaved the three ways, LISTs of 1,000 the five,
// each response checked, and the hop's and the proxy's CPU time read.
func TestWays(t *testing.T) {
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
	if err := b.startNarrowed(cluster.Config); err != nil {
		t.Fatal(err)
	}
	mode, err := b.checkMode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(mode, "shardSelector shardRange(") {
		t.Errorf("checkMode = %q, want the shardSelector the proxy and the narrowed ways sent", mode)
	}
	// A "narrowed" way that does not narrow stops the run rather than
	// comparing different requests.
	narrowed := b.directNarrowed
	b.directNarrowed = b.direct
	if _, err := b.checkMode(ctx); err == nil || !strings.Contains(err.Error(), "does not narrow as the proxy does") {
		t.Errorf("checkMode with an unnarrowed direct way: %v, want it refused", err)
	}
	b.directNarrowed = narrowed

	ns, name := objectKey(0)
	const rounds = 3
	var gets [numWays][]time.Duration
	cost, err := b.measureCPU(rounds, ways, func() (err error) {
		gets, err = b.interleave(ctx, "GET", ways, 1, rounds, 1, func(ctx context.Context, cs kubernetes.Interface) (time.Duration, int, error) {
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
	var lists [numWays][]time.Duration
	listCost, err := b.measureCPU(2, listWays, func() (err error) {
		lists, err = b.interleave(ctx, "LIST 1k", listWays, 0, 2, perNamespace, func(ctx context.Context, cs kubernetes.Interface) (time.Duration, int, error) {
			start := time.Now()
			l, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: b.selector})
			if err != nil {
				return 0, 0, err
			}
			return time.Since(start), len(l.Items), nil
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range listWays {
		if len(lists[w]) != 2 {
			t.Errorf("%s: %d LISTs timed, want 2", w, len(lists[w]))
		}
	}
	// The hop served both its ways' lists, the proxy its own.
	if listCost[wayHop].requests != 4 || listCost[wayProxy].requests != 2 {
		t.Errorf("LIST CPU over %d requests through the hop and %d through the proxy, want 4 and 2", listCost[wayHop].requests, listCost[wayProxy].requests)
	}
	var res results
	if err := b.measureConcurrent(ctx, &res); err != nil {
		t.Fatal(err)
	}
	for _, w := range ways {
		if len(gets[w]) != rounds {
			t.Errorf("%s: %d GETs timed, want %d", w, len(gets[w]), rounds)
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

// TestOrder: over as many rounds as a set has ways, each of its ways goes
// once in every position.
func TestOrder(t *testing.T) {
	for _, set := range [][]way{ways, listWays} {
		seen := map[way][]int{}
		for i := range set {
			got := order(i, set)
			if len(got) != len(set) {
				t.Fatalf("order(%d, %v) = %v: %d ways, want %d", i, set, got, len(got), len(set))
			}
			for pos, w := range got {
				if seen[w] == nil {
					seen[w] = make([]int, len(set))
				}
				seen[w][pos]++
			}
		}
		for _, w := range set {
			for pos, n := range seen[w] {
				if n != 1 {
					t.Errorf("%v: %s went %d times in position %d over %d rounds, want once", set, w, n, pos, len(set))
				}
			}
		}
		if len(seen) != len(set) {
			t.Errorf("%v: %d ways ordered, want %d", set, len(seen), len(set))
		}
	}
}

// testWriter sends the benchmark's progress to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
