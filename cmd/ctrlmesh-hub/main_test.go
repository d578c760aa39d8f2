package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/promscrape"
)

// TestMemoryLimitFromCgroup: the hub started in a memory cgroup sets the
// Go runtime's soft memory limit to 90% of the cgroup's, as in a pod with
// a memory limit; GOMEMLIMIT, where set, wins. It builds the hub and runs
// it in a cgroup of its own (cgroup v1 or v2; root), without credentials:
// the limit is set before the hub reads them.
func TestMemoryLimitFromCgroup(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ctrlmesh-hub")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building the hub: %v\n%s", err, out)
	}
	const limit = 512 << 20
	procs := memoryCgroup(t, limit)
	for _, tc := range []struct {
		name string
		env  []string
		want int64 // the GOMEMLIMIT the hub logs setting; 0: none
	}{
		{name: "90% of the cgroup's limit", want: limit * 9 / 10},
		{name: "GOMEMLIMIT set wins", env: []string{"GOMEMLIMIT=300MiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The shell moves itself into the cgroup, then becomes the hub.
			cmd := exec.Command("sh", "-c", `echo $$ > "$0" && exec "$1" --kubeconfig=/nonexistent`, procs, bin)
			cmd.Env = append(os.Environ(), tc.env...)
			out, _ := cmd.CombinedOutput()
			got, set := loggedLimit(t, out)
			if tc.want == 0 {
				if set {
					t.Fatalf("the hub set GOMEMLIMIT to %d with GOMEMLIMIT in its environment; output:\n%s", got, out)
				}
				if !bytes.Contains(out, []byte("GOMEMLIMIT is already set")) {
					t.Fatalf("the hub did not log keeping GOMEMLIMIT; output:\n%s", out)
				}
				return
			}
			// The provider rounds 90% down to a whole byte.
			if !set || got < tc.want-1 || got > tc.want {
				t.Fatalf("GOMEMLIMIT set %v to %d, want %d (90%% of %d); output:\n%s", set, got, tc.want, limit, out)
			}
		})
	}
}

// loggedLimit is the GOMEMLIMIT the hub's log says it set.
func loggedLimit(t *testing.T, out []byte) (int64, bool) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var line struct {
			Msg   string `json:"msg"`
			Limit int64  `json:"GOMEMLIMIT"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "GOMEMLIMIT is updated" {
			return line.Limit, true
		}
	}
	return 0, false
}

// memoryCgroup makes a memory cgroup limited to limit bytes, removed at the
// test's end, and returns its cgroup.procs file.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	name := fmt.Sprintf("ctrlmesh-test-%d", os.Getpid())
	dir, limitFile := filepath.Join("/sys/fs/cgroup/memory", name), "memory.limit_in_bytes" // cgroup v1
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		dir, limitFile = filepath.Join("/sys/fs/cgroup", name), "memory.max" // cgroup v2
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("making a memory cgroup (the test runs as root, with cgroups mounted at /sys/fs/cgroup, as the real nodes' tests do): %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("removing the cgroup: %v", err)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatalf("limiting the cgroup's memory: %v", err)
	}
	return filepath.Join(dir, "cgroup.procs")
}

// TestInformerErrorsLogged: the hub's informers' errors reach its log. Its
// informers log through controller-runtime's global logger, which drops
// every message while unset; the hub sets it to its own. Run against a real
// API server with an identity that may read nothing, the hub must log its
// informers' refused lists. Before it set the logger it logged none, and
// after 30 s that the logger was never set.
func TestInformerErrorsLogged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildHub(t)
	c := env.StartCluster(t, ctx, "hub")
	nobody, err := c.AddUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	h := startHub(t, ctx, bin, nobody, nil)
	line, err := h.await(45*time.Second, func(line string) bool {
		return strings.Contains(line, "failed to list") && strings.Contains(line, `User \"nobody\" cannot list`)
	})
	if err != nil {
		t.Fatalf("the hub logged no refused list: %v; its output:\n%s", err, h.output())
	}
	if !json.Valid([]byte(line)) {
		t.Errorf("the refused list is not logged as the hub logs (JSON): %s", line)
	}
}

// TestInformersStreamLists: the hub's informers fill their caches from
// streamed watches (client-go's WatchListClient), each object through the
// cache's transform as it arrives, not from lists read whole, unless
// KUBE_FEATURE_WatchListClient=false; the API server's own request
// counters tell which.
func TestInformersStreamLists(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := buildHub(t)
	c := env.StartCluster(t, ctx, "hub")
	for _, tc := range []struct {
		name      string
		env       []string
		wantLists bool
	}{
		{name: "as shipped", wantLists: false},
		{name: hub.WatchListEnv + "=false", env: []string{hub.WatchListEnv + "=false"}, wantLists: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := worksLists(t, ctx, c)
			h := startHub(t, ctx, bin, c.Config, tc.env)
			// controller-runtime starts a controller's workers once its
			// caches are filled.
			if _, err := h.await(60*time.Second, func(line string) bool {
				return strings.Contains(line, `"Starting workers"`) && strings.Contains(line, `"controller":"shardingconfig"`)
			}); err != nil {
				t.Fatalf("the hub's caches did not fill: %v; its output:\n%s", err, h.output())
			}
			h.stop()
			lists := worksLists(t, ctx, c) - before
			if got := lists > 0; got != tc.wantLists {
				t.Errorf("the hub listed Works %v times; want lists %v (watches streaming the objects instead: %v)", lists, tc.wantLists, !tc.wantLists)
			}
		})
	}
}

// worksLists is how many LIST requests of Works the API server has
// answered (apiserver_request_total).
func worksLists(t *testing.T, ctx context.Context, c *controlplane.Cluster) float64 {
	t.Helper()
	hc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	families, err := promscrape.Scrape(ctx, hc.Do, strings.TrimSuffix(c.Config.Host, "/")+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, m := range families["apiserver_request_total"].GetMetric() {
		if promscrape.Label(m, "resource") == "works" && promscrape.Label(m, "verb") == "LIST" {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

func buildHub(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ctrlmesh-hub")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building the hub: %v\n%s", err, out)
	}
	return bin
}

// hubProcess is the built hub running as a test's user, its log read line
// by line.
type hubProcess struct {
	cmd   *exec.Cmd
	lines chan string
	mu    sync.Mutex
	seen  bytes.Buffer
}

// startHub runs bin with identity's credentials, without leader election
// or ports, env added to the environment; the test's end kills it.
func startHub(t *testing.T, ctx context.Context, bin string, identity *rest.Config, env []string) *hubProcess {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := controlplane.WriteKubeconfig(identity, kubeconfig); err != nil {
		t.Fatal(err)
	}
	h := &hubProcess{lines: make(chan string, 1024)}
	h.cmd = exec.CommandContext(ctx, bin, "--kubeconfig="+kubeconfig, "--leader-elect=false", "--metrics-bind-address=0", "--health-probe-bind-address=0")
	h.cmd.Env = append(os.Environ(), env...)
	stderr, err := h.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.stop)
	go func() {
		defer close(h.lines)
		s := bufio.NewScanner(stderr)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		for s.Scan() {
			h.mu.Lock()
			h.seen.WriteString(s.Text() + "\n")
			h.mu.Unlock()
			select {
			case h.lines <- s.Text():
			default: // a line nobody awaits
			}
		}
	}()
	return h
}

// await returns the first line of the hub's log that match accepts, within
// timeout.
func (h *hubProcess) await(timeout time.Duration, match func(string) bool) (string, error) {
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				return "", fmt.Errorf("the hub exited")
			}
			if match(line) {
				return line, nil
			}
		case <-deadline:
			return "", fmt.Errorf("no such line within %s", timeout)
		}
	}
}

func (h *hubProcess) output() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen.String()
}

func (h *hubProcess) stop() {
	_ = h.cmd.Process.Kill()
	_ = h.cmd.Wait()
}
