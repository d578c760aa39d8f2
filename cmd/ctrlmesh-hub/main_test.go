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
	"testing"
	"time"

	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
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
	bin := filepath.Join(t.TempDir(), "ctrlmesh-hub")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building the hub: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	})
	nobody, err := fleet.Cluster("hub").AddUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := controlplane.WriteKubeconfig(nobody, kubeconfig); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig="+kubeconfig, "--leader-elect=false", "--metrics-bind-address=0", "--health-probe-bind-address=0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	found := make(chan string, 1)
	var seen bytes.Buffer
	go func() {
		s := bufio.NewScanner(stderr)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		for s.Scan() {
			line := s.Text()
			seen.WriteString(line + "\n")
			if strings.Contains(line, "failed to list") && strings.Contains(line, `User \"nobody\" cannot list`) {
				found <- line
				return
			}
		}
		close(found)
	}()
	select {
	case line, ok := <-found:
		if !ok {
			t.Fatalf("the hub exited without logging a refused list; its output:\n%s", seen.String())
		}
		if !json.Valid([]byte(line)) {
			t.Errorf("the refused list is not logged as the hub logs (JSON): %s", line)
		}
	case <-time.After(45 * time.Second):
		_ = cmd.Process.Kill()
		<-found
		t.Fatalf("the hub logged no refused list within 45 s; its output:\n%s", seen.String())
	}
}
