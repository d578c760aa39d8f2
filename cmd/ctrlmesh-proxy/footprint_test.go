package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/images"
)

func init() {
	// The control plane's start logs through controller-runtime.
	ctrllog.SetLogger(logr.Discard())
}

// The idle sidecar's bounds: what one proxy may hold while its operator has
// its informers' watches open and nothing changes. Every operator pod of
// every member cluster pays them, so they are the proxy's fixed cost.
const (
	// maxIdleRSS bounds VmRSS: the heap, stacks and runtime, plus the pages
	// of the executable the process touched (the biggest part: the code and
	// data of every package it links, and what their init functions build;
	// the kernel maps a file's pages around each one touched, so nearly the
	// whole binary is resident). The bound is issue 17's goal, 20 MiB. The
	// proxy measured 20.9-21.0 MiB (6 runs; 20.2-21.3 MiB in 12 earlier)
	// with Prometheus' client and its protobuf runtime linked (a 19.5 MB
	// binary), 16.4-16.5 MiB without (6 runs alternating with those,
	// 2026-11-27; 14.7 MB; RssAnon 3.5-3.7 MiB; see the README's "The
	// sidecar's own cost"), so a regrowth of some 3.5 MiB fails.
	maxIdleRSS = 20 << 20
	// maxIdleHeap bounds the Go heap in use (go_memstats_heap_inuse_bytes).
	maxIdleHeap = 5 << 20
)

// TestIdleFootprint runs the ctrlmesh-proxy binary as a pod runs it (rules
// from its ShardRoute, the selector mode detected, probes and metrics
// served) against a real kube-apiserver, opens what an idle operator keeps
// open through it (a list and a watch of the ConfigMaps it shards, a lease
// get), and checks the process's resident memory and Go heap against the
// bounds above.
func TestIdleFootprint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	binary := buildProxy(ctx, t)
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "footprint"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	})
	cluster := fleet.Cluster("footprint")
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	const namespace, pod = "operators", "op-0"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	route := &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "footprint"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: "footprint", RoutingGeneration: 1, RulesHash: "footprint1", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector:   metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "op-leader"},
			Limits: ctrlmeshv1alpha1.Limits{{
				RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}},
			}},
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: "0-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: pod}}}},
		},
	}
	if err := c.Create(ctx, route); err != nil {
		t.Fatal(err)
	}

	api, health := freeAddress(t), freeAddress(t)
	var logs bytes.Buffer
	cmd := exec.CommandContext(ctx, binary, "--upstream-kubeconfig="+cluster.KubeconfigPath, "--pod-name="+pod, "--pod-namespace="+namespace,
		"--rules-name="+route.Name, "--listen-address="+api, "--health-address="+health)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	env.Eventually(t, time.Minute, "the proxy ready with its rules", func() error {
		_, err := httpGet(ctx, "http://"+health+"/readyz")
		return err
	})

	// What an idle operator keeps: its informer's list and open watch, and
	// a lease renewal now and then.
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: "http://" + api})
	if err != nil {
		t.Fatal(err)
	}
	list, err := cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().ConfigMaps("").Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for range 20 {
		if _, err := cs.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Settled: what the requests left behind is garbage by now.
	time.Sleep(3 * time.Second)

	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	rss, anon := procField(t, status, "VmRSS"), procField(t, status, "RssAnon")
	metrics, err := httpGet(ctx, "http://"+health+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	heap := metricValue(t, metrics, "go_memstats_heap_inuse_bytes")
	t.Logf("idle proxy: VmRSS %.1f MiB (RssAnon %.1f MiB), Go heap in use %.1f MiB", mib(rss), mib(anon), mib(heap))
	if rss > maxIdleRSS {
		t.Errorf("the idle proxy's VmRSS is %.1f MiB, over its bound of %.1f MiB: see what it links (go list -deps ./cmd/ctrlmesh-proxy) and what their init functions build",
			mib(rss), mib(maxIdleRSS))
	}
	if heap > maxIdleHeap {
		t.Errorf("the idle proxy's Go heap in use is %.1f MiB, over its bound of %.1f MiB: profile it (run the proxy in-process, as the proxy package tests do, with a heap profile)",
			mib(heap), mib(maxIdleHeap))
	}
}

func mib(b float64) float64 { return b / (1 << 20) }

// buildProxy builds this command as its image does (deploy/docker/
// Dockerfile: static, trimmed, stripped; test/images.BuildStatic) into a
// temporary directory.
func buildProxy(ctx context.Context, t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "ctrlmesh-proxy")
	if err := images.BuildStatic(ctx, ".", ".", out); err != nil {
		t.Fatal(err)
	}
	return out
}

func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d: %s", url, resp.StatusCode, body)
	}
	return body, nil
}

// procField reads a "Name:   123 kB" line of /proc/<pid>/status, in bytes.
func procField(t *testing.T, status []byte, name string) float64 {
	t.Helper()
	s := bufio.NewScanner(bytes.NewReader(status))
	for s.Scan() {
		rest, ok := strings.CutPrefix(s.Text(), name+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
		if err != nil {
			t.Fatalf("%s: %v", s.Text(), err)
		}
		return kb * 1024
	}
	t.Fatalf("no %s line in /proc/<pid>/status", name)
	return 0
}

// metricValue reads an unlabeled sample of the Prometheus text format.
func metricValue(t *testing.T, metrics []byte, name string) float64 {
	t.Helper()
	s := bufio.NewScanner(bytes.NewReader(metrics))
	for s.Scan() {
		rest, ok := strings.CutPrefix(s.Text(), name+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			t.Fatalf("%s: %v", s.Text(), err)
		}
		return v
	}
	t.Fatalf("no %s sample in the proxy's metrics", name)
	return 0
}
