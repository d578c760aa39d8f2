// Command proxybench measures what ctrlmesh-proxy costs an operator: it
// starts a real etcd and kube-apiserver (test/env), seeds 10,000
// ConfigMaps, builds ctrlmesh-proxy as its image does and runs it in its own
// process with rules that give its pod all 32 buckets (so direct and
// proxied requests return the same objects), and a bare hop beside it
// (barehop: ctrlmesh-proxy's forwarding alone, in its own process too). In
// one run it then interleaves the same requests directly, through the bare
// hop and through the proxy: GET of one ConfigMap, LIST of 1,000 and of
// 10,000 ConfigMaps, and 64 concurrent clients of GET and LIST; and WATCH
// event throughput directly and through the proxy. The hop's and the
// proxy's CPU time per 1,000 requests is read from /proc/<pid>/stat. What
// the bare hop costs over direct is the floor of any sidecar's cost. It
// prints a table of the figures and ratios to stdout, progress to stderr,
// and PASS/MISS against the proxy's goals. It exits 0 whatever the figures
// are; only an error exits non-zero.
//
// Run it from the repository root with `make bench-proxy` (which builds the
// control-plane binaries first), passing flags as BENCH_ARGS:
//
//	make bench-proxy BENCH_ARGS='-mode=label -gets=5000'
//
// -proxy-cpuprofile=FILE profiles the proxy (go tool pprof FILE); the
// profiler's own cost is then in the proxy's figures.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/ctrlmesh/ctrlmesh/test/bench/internal/benchstat"
)

// options are the command's flags.
type options struct {
	mode    string // range or label
	content string // protobuf or json
	gets    int
	lists   int
	events  int
	writers int
	replays int
	// clients, concurrentFor and rounds shape the concurrent measurement.
	clients       int
	concurrentFor time.Duration
	rounds        int
	// policies is how many CircuitBreakers the proxy's rules carry.
	policies int
	timeout  time.Duration
	// cpuProfile, when set, receives a CPU profile of the measurements in
	// this process: the benchmark's clients (the proxy runs in its own).
	cpuProfile string
	// proxyCPUProfile, when set, receives the proxy's CPU profile of its
	// whole run (ctrlmesh-proxy --cpu-profile), written when it stops.
	proxyCPUProfile string
}

func parseFlags(args []string, output io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("proxybench", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&o.mode, "mode", "range", "how the proxy narrows list and watch: range (KEP-5866 shardSelector; the API server runs with the ShardedListAndWatch gate and the proxy detects it) or label (ctrlmesh.io/sharding-hash label selector; API server without the gate)")
	fs.StringVar(&o.content, "content", "protobuf", "wire format of the benchmark clients: protobuf or json")
	fs.IntVar(&o.gets, "gets", 2000, "GET requests of one ConfigMap, each way")
	fs.IntVar(&o.lists, "lists", 20, "LIST iterations of each size, each way")
	fs.IntVar(&o.events, "events", 5000, "ConfigMap updates the WATCH measurement generates (at most 10000: one per seeded ConfigMap)")
	fs.IntVar(&o.writers, "writers", 8, "concurrent writers generating the WATCH events")
	fs.IntVar(&o.replays, "replays", 5, "rounds of the WATCH replay measurement, each way")
	fs.IntVar(&o.clients, "clients", 64, "concurrent clients of the concurrent measurement")
	fs.DurationVar(&o.concurrentFor, "concurrent-duration", 10*time.Second, "how long each concurrent run lasts")
	fs.IntVar(&o.rounds, "rounds", 3, "concurrent runs each way, the order of the ways (direct, bare hop, proxy) rotated each round: a multiple of 3 puts each way first, second and last equally often")
	fs.IntVar(&o.policies, "policies", 20, "CircuitBreakers (a rate limit, a breaker and a deny count each) and faults loaded into the proxy's rules, matching none of the benchmark's requests: the cost of checking them is in every proxied figure")
	fs.DurationVar(&o.timeout, "timeout", 20*time.Minute, "bound on the whole run")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the measurement phase of this process (the benchmark's clients; the proxy runs in its own process, see -proxy-cpuprofile) to this file")
	fs.StringVar(&o.proxyCPUProfile, "proxy-cpuprofile", "", "write the proxy's CPU profile (ctrlmesh-proxy --cpu-profile) of its whole run, from its start to its stop after the measurements, to this file; read it with go tool pprof")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(output, "usage: proxybench [flags]\n\nMeasures ctrlmesh-proxy's overhead against a real kube-apiserver: GET, LIST 1k/10k, WATCH.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	switch {
	case o.mode != "range" && o.mode != "label":
		return o, fmt.Errorf("-mode must be range or label, not %q", o.mode)
	case o.content != "protobuf" && o.content != "json":
		return o, fmt.Errorf("-content must be protobuf or json, not %q", o.content)
	case o.policies < 0 || o.policies > 64:
		return o, errors.New("-policies must be between 0 and 64")
	case o.gets < 1 || o.lists < 1 || o.replays < 1 || o.writers < 1 || o.clients < 1 || o.rounds < 1:
		return o, errors.New("-gets, -lists, -replays, -writers, -clients and -rounds must be at least 1")
	case o.concurrentFor <= 0:
		return o, errors.New("-concurrent-duration must be positive")
	case o.events < 1 || o.events > totalObjects:
		return o, fmt.Errorf("-events must be between 1 and %d", totalObjects)
	case o.timeout <= 0:
		return o, errors.New("-timeout must be positive")
	}
	return o, nil
}

func main() { benchstat.Main("proxybench", parseFlags, run) }
