package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/pprof/profile"

	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/promscrape"
)

// hubProcess is one ctrlmesh-hub replica: the shipped binary, run with the
// flags its chart gives it (--leader-elect, --auto-accept) under a
// kubeconfig with exactly the hub's RBAC.
type hubProcess struct {
	name    string
	cmd     *exec.Cmd
	metrics string // host:port
	pprof   string
	log     string
	// done is closed when the process exited, with err its exit.
	done chan struct{}
	err  error
}

// buildHub builds cmd/ctrlmesh-hub into dir.
func buildHub(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "ctrlmesh-hub")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/ctrlmesh-hub")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building ctrlmesh-hub: %w\n%s", err, out)
	}
	return bin, nil
}

// startHub starts a replica with environ added to this process's environment;
// its log goes to logPath.
func startHub(bin, kubeconfig, namespace, name, logPath string, extra, environ []string) (*hubProcess, error) {
	metrics, err := env.FreeAddress()
	if err != nil {
		return nil, err
	}
	pprof, err := env.FreeAddress()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := append([]string{"--kubeconfig=" + kubeconfig, "--namespace=" + namespace, "--leader-elect=true", "--auto-accept",
		"--metrics-bind-address=" + metrics, "--health-probe-bind-address=0", "--pprof-bind-address=" + pprof}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), environ...)
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	h := &hubProcess{name: name, cmd: cmd, metrics: metrics, pprof: pprof, log: logPath, done: make(chan struct{})}
	go func() {
		h.err = cmd.Wait()
		logFile.Close()
		close(h.done)
	}()
	return h, nil
}

// memoryEnv is the environment that gives a replica the GOMEMLIMIT limit,
// none for "".
func memoryEnv(limit string) []string {
	if limit == "" {
		return nil
	}
	return []string{memoryLimitEnv + "=" + limit}
}

// memoryLimitEnv is the Go runtime's soft memory limit, which the hub
// replicas and the hub cluster's API server are given (memoryEnv,
// startHubCluster).
const memoryLimitEnv = "GOMEMLIMIT"

// stop ends the replica as Kubernetes does: SIGTERM (the hub releases its
// leader Lease on the way out), SIGKILL after grace.
func (h *hubProcess) stop(grace time.Duration) error {
	select {
	case <-h.done:
		return nil
	default:
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
		return h.err
	case <-time.After(grace):
		_ = h.cmd.Process.Kill()
		<-h.done
		return fmt.Errorf("%s did not stop within %s; killed", h.name, grace)
	}
}

// exited returns why the replica exited on its own, or nil while it runs.
func (h *hubProcess) exited() error {
	select {
	case <-h.done:
		data, _ := os.ReadFile(h.log)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		return fmt.Errorf("%s exited (%v): %s", h.name, h.err, strings.Join(lines[max(len(lines)-3, 0):], " | "))
	default:
		return nil
	}
}

// memory is the replica's resident memory now and at its peak (VmRSS,
// VmHWM of /proc/<pid>/status), in bytes.
func (h *hubProcess) memory() (rss, peak int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.cmd.Process.Pid))
	if err != nil {
		return 0, 0, err
	}
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		name, value, ok := strings.Cut(s.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc status %s: %w", name, err)
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			peak = kb << 10
		}
	}
	return rss, peak, nil
}

// cpuSeconds is the replica's user and system CPU time so far
// (/proc/<pid>/stat; clock ticks of 1/100 s, as on every Linux the
// benchmark runs on).
func (h *hubProcess) cpuSeconds() (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may hold spaces.
	_, rest, ok := strings.Cut(string(data), ") ")
	if !ok {
		return 0, fmt.Errorf("/proc stat: %q", data)
	}
	fields := strings.Fields(rest)
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc stat: %q", data)
	}
	utime, err1 := strconv.ParseFloat(fields[11], 64)
	stime, err2 := strconv.ParseFloat(fields[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc stat: %q", data)
	}
	return (utime + stime) / 100, nil
}

// hubCounters are a hub replica's counters so far, from one scrape of its
// metrics.
type hubCounters struct {
	// requests are its API requests by HTTP method, from client-go's
	// rest_client_requests_total; watches are GETs.
	requests map[string]float64
	// reconcileErrors are its failed reconciles by controller, from
	// controller_runtime_reconcile_errors_total: a write the API server
	// refuses shows there and in the hub's log only.
	reconcileErrors map[string]float64
}

func (h *hubProcess) counters(ctx context.Context) (hubCounters, error) {
	families, err := promscrape.Scrape(ctx, http.DefaultClient.Do, "http://"+h.metrics+"/metrics")
	if err != nil {
		return hubCounters{}, err
	}
	return hubCounters{
		requests:        promscrape.SumBy(families, "rest_client_requests_total", "method"),
		reconcileErrors: promscrape.SumBy(families, "controller_runtime_reconcile_errors_total", "controller"),
	}, nil
}

// leads reports whether the replica holds the hub's leader Lease, by its
// leader-election metric.
func (h *hubProcess) leads(ctx context.Context) bool {
	families, err := promscrape.Scrape(ctx, http.DefaultClient.Do, "http://"+h.metrics+"/metrics")
	if err != nil {
		return false
	}
	f := families["leader_election_master_status"]
	if f == nil {
		return false
	}
	for _, m := range f.GetMetric() {
		if m.GetGauge().GetValue() == 1 {
			return true
		}
	}
	return false
}

// heapProfile saves the replica's heap profile, taken after a collection,
// to path, and returns the live heap it holds (in-use bytes, as the
// runtime's sampling estimates them).
func (h *hubProcess) heapProfile(ctx context.Context, path string) (live int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.pprof+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return 0, err
	}
	p, err := profile.ParseData(data)
	if err != nil {
		return 0, fmt.Errorf("parsing the heap profile of %s: %w", h.name, err)
	}
	index := slices.IndexFunc(p.SampleType, func(t *profile.ValueType) bool { return t.Type == "inuse_space" })
	if index < 0 {
		return 0, fmt.Errorf("the heap profile of %s has no inuse_space", h.name)
	}
	for _, s := range p.Sample {
		live += s.Value[index]
	}
	return live, nil
}
