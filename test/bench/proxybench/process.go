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

// The commands the benchmark runs in processes of their own.
const (
	proxyPackage = "github.com/ctrlmesh/ctrlmesh/cmd/ctrlmesh-proxy"
	hopPackage   = "github.com/ctrlmesh/ctrlmesh/test/bench/proxybench/barehop"
)

// build builds the command pkg as deploy/docker/Dockerfile builds
// ctrlmesh-proxy (static, trimmed, stripped: test/images.BuildStatic) into
// dir, and returns the binary's path.
func build(ctx context.Context, dir, pkg string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	if err := images.BuildStatic(ctx, "", pkg, out); err != nil {
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

// processWays are the ways whose process (process) is the bare hop's and
// the proxy's own: their CPU costs are kept at these ways.
var processWays = []way{wayHop, wayProxy}

// measureCPU measures the CPU time of the bare hop and of the proxy over
// f, which sends perWay requests each of set's ways: the hop's cost is over
// all the requests of the ways through it.
func (b *bench) measureCPU(perWay int, set []way, f func() error) (costs [numWays]cpuCost, err error) {
	var before [numWays]time.Duration
	for _, p := range processWays {
		if before[p], err = b.process(p).cpu(); err != nil {
			return costs, err
		}
	}
	if err := f(); err != nil {
		return costs, err
	}
	for _, p := range processWays {
		after, err := b.process(p).cpu()
		if err != nil {
			return costs, err
		}
		costs[p].cpu = after - before[p]
		for _, w := range set {
			if b.process(w) == b.process(p) {
				costs[p].requests += perWay
			}
		}
	}
	return costs, nil
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

// measureConcurrent runs the concurrent load o.rounds times each way,
// rotating the order, and times the bare hop's and the proxy's CPU over
// their own runs.
func (b *bench) measureConcurrent(ctx context.Context, res *results) error {
	for round := range b.o.rounds {
		for _, w := range order(round, ways) {
			var run concurrentRun
			cost, err := b.measureCPU(0, []way{w}, func() (err error) {
				run, err = b.concurrent(ctx, b.client(w))
				return err
			})
			if err != nil {
				return fmt.Errorf("concurrent, %s: %w", w, err)
			}
			if w != wayDirect {
				// Only w's process served requests in w's run.
				res.cpuConcurrent[w].cpu += cost[w].cpu
				res.cpuConcurrent[w].requests += int(run.requests)
			}
			res.conc[w] = append(res.conc[w], run)
		}
		b.progress("  concurrent round %d/%d: direct %d, through the bare hop %d, through the proxy %d requests", round+1, b.o.rounds,
			res.conc[wayDirect][round].requests, res.conc[wayHop][round].requests, res.conc[wayProxy][round].requests)
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
