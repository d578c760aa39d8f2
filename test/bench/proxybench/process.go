package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ctrlmesh/ctrlmesh/test/images"
)

// proxyProcess is the ctrlmesh-proxy under measurement: its own process,
// built as its image builds it, so its CPU time and memory are its own and
// not the benchmark clients'.
type proxyProcess struct {
	cmd  *exec.Cmd
	done chan error
}

// buildProxy builds ctrlmesh-proxy as deploy/docker/Dockerfile does (static,
// trimmed, stripped: test/images.BuildStatic) into dir.
func buildProxy(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "ctrlmesh-proxy")
	if err := images.BuildStatic(ctx, "", "github.com/ctrlmesh/ctrlmesh/cmd/ctrlmesh-proxy", out); err != nil {
		return "", err
	}
	return out, nil
}

// startProcess starts binary with args; every line it logs goes to logLine.
func startProcess(binary string, args []string, logLine func(string)) (*proxyProcess, error) {
	cmd := exec.Command(binary, args...)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proxyProcess{cmd: cmd, done: make(chan error, 1)}
	go func() {
		s := bufio.NewScanner(pipe)
		for s.Scan() {
			logLine(s.Text())
		}
		p.done <- cmd.Wait()
	}()
	return p, nil
}

// stop ends the proxy with SIGTERM, as the kubelet does, and kills it if it
// has not exited within 10s.
func (p *proxyProcess) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		var exit *exec.ExitError
		if errors.As(err, &exit) && !exit.Exited() {
			return nil // ended by the signal
		}
		return err
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return errors.New("proxy: did not stop within 10s of SIGTERM")
	}
}

// clockTick is the unit of utime and stime in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux architecture Go runs on).
const clockTick = 10 * time.Millisecond

// cpu returns the CPU time (user and system) the proxy has used so far.
func (p *proxyProcess) cpu() (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(data))
}

// parseStatCPU reads utime and stime, fields 14 and 15 of /proc/<pid>/stat;
// the command name, field 2, is in parentheses and may hold spaces.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/<pid>/stat %q: no command name", stat)
	}
	fields := strings.Fields(stat[i+1:])
	// fields[0] is field 3 (state): utime is fields[11], stime fields[12].
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/<pid>/stat %q: too few fields", stat)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/<pid>/stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// rss returns the proxy's VmRSS.
func (p *proxyProcess) rss() (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS line in /proc/<pid>/status")
}

func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}

// cpuCost is the proxy's CPU time over a number of requests.
type cpuCost struct {
	requests int
	cpu      time.Duration
}

// perThousand is CPU seconds per 1,000 requests.
func (c cpuCost) perThousand() float64 {
	if c.requests == 0 {
		return 0
	}
	return c.cpu.Seconds() * 1000 / float64(c.requests)
}

// measureCPU measures the proxy's CPU time over f, which sends requests
// requests through it.
func (b *bench) measureCPU(requests int, f func() error) (cpuCost, error) {
	before, err := b.proxy.cpu()
	if err != nil {
		return cpuCost{}, err
	}
	if err := f(); err != nil {
		return cpuCost{}, err
	}
	after, err := b.proxy.cpu()
	if err != nil {
		return cpuCost{}, err
	}
	return cpuCost{requests: requests, cpu: after - before}, nil
}

// concurrentRun is one timed run of the concurrent load, one way.
type concurrentRun struct {
	requests int64
	elapsed  time.Duration
}

// listEvery makes every listEvery-th request of a concurrent client a LIST
// of one namespace's 1,000 ConfigMaps; the others GET one ConfigMap.
const listEvery = 10

// concurrent runs o.clients clients against cs for o.concurrentFor: each
// loops over listEvery-1 GETs and one LIST of 1,000, and every response is
// checked. It returns how many requests completed.
func (b *bench) concurrent(ctx context.Context, cs kubernetes.Interface) (concurrentRun, error) {
	ns, name := objectKey(0)
	ctx, cancel := context.WithTimeout(ctx, b.o.concurrentFor)
	defer cancel()
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, b.o.clients)
	start := time.Now()
	for c := range b.o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; ctx.Err() == nil; i++ {
				var err error
				if i%listEvery == listEvery-1 {
					list, lerr := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: b.selector})
					if err = lerr; err == nil && len(list.Items) != perNamespace {
						err = fmt.Errorf("LIST: %d objects, want %d", len(list.Items), perNamespace)
					}
				} else {
					_, err = cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
				}
				if ctx.Err() != nil {
					return // the run's end cut the request short: not counted
				}
				if err != nil {
					errs <- err
					cancel()
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return concurrentRun{}, err
	}
	return concurrentRun{requests: done.Load(), elapsed: elapsed}, nil
}

// measureConcurrent alternates concurrent runs direct and through the
// proxy, o.rounds each way, and times the proxy's CPU over its runs.
func (b *bench) measureConcurrent(ctx context.Context, res *results) error {
	for round := range b.o.rounds {
		ways := []kubernetes.Interface{b.direct, b.proxied}
		if round%2 == 1 {
			ways[0], ways[1] = ways[1], ways[0]
		}
		for _, cs := range ways {
			if cs == b.direct {
				run, err := b.concurrent(ctx, cs)
				if err != nil {
					return fmt.Errorf("concurrent, direct: %w", err)
				}
				res.concDirect = append(res.concDirect, run)
				continue
			}
			var run concurrentRun
			cost, err := b.measureCPU(0, func() (err error) {
				run, err = b.concurrent(ctx, cs)
				return err
			})
			if err != nil {
				return fmt.Errorf("concurrent, through the proxy: %w", err)
			}
			res.concProxied = append(res.concProxied, run)
			res.cpuConcurrent.cpu += cost.cpu
			res.cpuConcurrent.requests += int(run.requests)
		}
		b.progress("  concurrent round %d/%d: direct %d, through the proxy %d requests", round+1, b.o.rounds,
			res.concDirect[len(res.concDirect)-1].requests, res.concProxied[len(res.concProxied)-1].requests)
	}
	return nil
}

// throughput is requests per second over runs.
func throughput(runs []concurrentRun) float64 {
	var n int64
	var d time.Duration
	for _, r := range runs {
		n, d = n+r.requests, d+r.elapsed
	}
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
