// Command scalebench measures the hub at fleet scale: one real hub API
// server (kube-apiserver and etcd, as the envtest suites run them) with the
// shipped ctrlmesh-hub binary, two replicas electing a leader under the
// hub's own RBAC, and simulated members. Each member joins and renews its
// heartbeat Lease with the agent's own code (pkg/membership Join and
// Heartbeat, OCM's Lease convention); a load agent does what the members'
// agents do on the hub side: reflect each member's ShardRoute status — its
// candidate pods, the rules hash each proxy enforces, the shard leaders —
// into the Work's status, in the format the agent and Karmada write
// (routework.ManifestStatus), as soon as a Work changes, its proxies taking
// -proxy-delay to apply new rules.
//
// For each scale (-scales, clusters x PerCluster ShardingConfigs, each
// config selecting every member with -pods pods in each, in a namespace of
// its own or all in the one -namespace names; plus one Fleet-scope config
// over the first -fleet members) it
// reports, from one run:
//
//   - joining: every ManagedCluster Available;
//   - apply to Ready: the time from creating the ShardingConfigs to every
//     one Ready with every shard ready, the hub's CPU seconds and API
//     requests by method over that time (its client-go metrics,
//     rest_client_requests_total), its failed reconciles, its resident
//     memory then, and the API server's own counts over that time: writes
//     by resource and verb, conflicts, request body and watch event bytes;
//   - at rest: the hub's requests per second over -steady, beside the
//     members' heartbeat renewals per second;
//   - a pod failure: the time until its config is Ready without it, and the
//     Works written meanwhile (goal: the one of the affected member);
//   - a hub restart: the leader stopped as Kubernetes stops it, the standby
//     takes over, and a pod failed at once: the time until it leads and
//     until it healed the failure, and the Works it wrote (goal: only the
//     affected one; none rewritten with the rules it had);
//   - a Fleet member lost: the time from its last heartbeat until its
//     buckets are served by the other members' pods;
//   - with -startup, before the hub starts: a hub's start with that many
//     Works on the API server, its informers' lists read whole and
//     streamed (client-go's WatchListClient, as the hub ships): its peak
//     RSS and live heap each way.
//
// With -plot it writes the curves over the scales as an SVG and prints the
// table in Markdown for the README.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := mainErr(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "scalebench:", err)
		os.Exit(1)
	}
}

type config struct {
	options
	scales []scale
	plot   string
	save   string
	load   []string
	total  time.Duration
}

func parseFlags(args []string, out io.Writer) (*config, error) {
	fs := flag.NewFlagSet("scalebench", flag.ContinueOnError)
	fs.SetOutput(out)
	c := &config{}
	scales := fs.String("scales", "10x10,100x100,1000x100", "scales to measure, each CLUSTERSxCONFIGS, in this order")
	fs.IntVar(&c.pods, "pods", 4, "pods of each ShardingConfig in each member")
	fs.IntVar(&c.fleetSize, "fleet", 8, "members the Fleet-scope ShardingConfig selects (at most the clusters); 0 for none")
	fs.StringVar(&c.namespace, "namespace", "", "namespace of every PerCluster ShardingConfig, as operators sharing one; empty for a namespace of its own each")
	fs.DurationVar(&c.steady, "steady", 30*time.Second, "time at rest over which the hub's requests are counted")
	fs.DurationVar(&c.proxyDelay, "proxy-delay", 200*time.Millisecond, "time a simulated proxy takes to apply new rules")
	fs.DurationVar(&c.lease, "lease", membership.DefaultLeaseDuration, "members' heartbeat lease duration")
	fs.DurationVar(&c.renew, "renew", membership.DefaultRenewInterval, "members' heartbeat renewal interval")
	fs.DurationVar(&c.readyWithin, "ready-within", 10*time.Minute, "bound on joining and on apply to Ready at each scale: past it the scale is reported as not Ready and the next one runs")
	fs.DurationVar(&c.stepWithin, "step-within", 5*time.Minute, "bound on each later step (pod failure, restart, lost member)")
	fs.DurationVar(&c.total, "total", 90*time.Minute, "bound on the whole run")
	fs.StringVar(&c.plot, "plot", "", "write the curves over the scales to this SVG file")
	fs.StringVar(&c.save, "save", "", "save the results as JSON to this file")
	loads := fs.String("load", "", "comma-separated JSON files of -save: report and plot their results, measured before, with this run's (-scales= measures nothing new)")
	fs.IntVar(&c.ceilingWorks, "ceiling", 2000, "Works to measure the API server's write ceiling with at each scale, before the hub starts; 0 for none")
	fs.IntVar(&c.startupWorks, "startup", 0, "Works to measure a hub's start with at each scale, before the hub starts: its peak RSS with lists read whole and streamed (client-go's WatchListClient, as the hub ships); 0 for none")
	fs.StringVar(&c.workDir, "work-dir", "", "directory for the hub's logs and heap profiles (default: a temporary one, kept)")
	fs.StringVar(&c.hubMemoryLimit, "hub-gomemlimit", "", "GOMEMLIMIT of both hub replicas: in a container the hub sets it to 90% of its memory limit (921MiB under the chart's 1Gi); empty leaves the Go runtime without one, as the hub outside a memory cgroup")
	fs.StringVar(&c.apiServerMemoryLimit, "apiserver-gomemlimit", "", "GOMEMLIMIT of the hub cluster's kube-apiserver and etcd (for example 14GiB at 100,000 Works on a machine of 24 GiB); empty for none")
	hubArgs := fs.String("hub-args", "", "further flags of both hub replicas, space-separated (for example --leader-elect-renew-deadline=40s on a loaded machine)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var err error
	if *scales != "" {
		if c.scales, err = parseScales(*scales); err != nil {
			return nil, err
		}
	}
	c.hubArgs = strings.Fields(*hubArgs)
	if *loads != "" {
		c.load = strings.Split(*loads, ",")
	}
	for name, limit := range map[string]string{"-hub-gomemlimit": c.hubMemoryLimit, "-apiserver-gomemlimit": c.apiServerMemoryLimit} {
		if limit != "" && !memoryLimitPattern.MatchString(limit) {
			return nil, fmt.Errorf("%s=%q: want a GOMEMLIMIT, bytes with an optional unit B, KiB, MiB, GiB or TiB (for example 921MiB)", name, limit)
		}
	}
	if c.pods < 2 {
		return nil, fmt.Errorf("-pods=%d: a pod failure needs a survivor; give at least 2", c.pods)
	}
	if c.renew <= 0 || c.renew >= c.lease {
		return nil, fmt.Errorf("-renew=%s must be positive and shorter than -lease=%s", c.renew, c.lease)
	}
	return c, nil
}

// memoryLimitPattern is what the Go runtime accepts as GOMEMLIMIT, besides
// "off"; a process given anything else does not start.
var memoryLimitPattern = regexp.MustCompile(`^[0-9]+(B|KiB|MiB|GiB|TiB)?$`)

func parseScales(s string) ([]scale, error) {
	var out []scale
	for _, part := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(part), "x")
		clusters, err1 := strconv.Atoi(a)
		configs, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || clusters < 2 || configs < 2 {
			return nil, fmt.Errorf("scale %q: want CLUSTERSxCONFIGS, each at least 2", part)
		}
		out = append(out, scale{clusters: clusters, configs: configs})
	}
	return out, nil
}

func mainErr(ctx context.Context, args []string, out io.Writer) error {
	c, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	c.assets = os.Getenv(env.AssetsEnv)
	if c.assets == "" && len(c.scales) > 0 {
		return fmt.Errorf("%s is not set: run make bench-scale, which builds the API server and etcd", env.AssetsEnv)
	}
	c.log = out
	// The members' manager logs nothing worth the benchmark's output.
	ctrllog.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(ctx, c.total)
	defer cancel()
	var results []*result
	for _, path := range c.load {
		loaded, err := load(path)
		if err != nil {
			return err
		}
		results = append(results, loaded...)
	}
	// A saved file holds what its run loaded too: one result per scale,
	// the last read.
	results = dedupe(results)
	for _, s := range c.scales {
		opts := c.options
		opts.fleetSize = min(opts.fleetSize, s.clusters)
		r, err := run(ctx, opts, s)
		if r != nil {
			results = append(results, r)
		}
		if err != nil {
			fmt.Fprintf(out, "scale %s: %v\n", s, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	slices.SortStableFunc(results, func(a, b *result) int { return a.clusters*100000 + a.configs - b.clusters*100000 - b.configs })
	report(out, results, c.options)
	if c.save != "" {
		loadavg, _ := os.ReadFile("/proc/loadavg")
		if err := save(c.save, results, strings.TrimSpace(string(loadavg))); err != nil {
			return err
		}
	}
	if c.plot != "" && len(results) > 0 {
		if err := plotCurves(c.plot, results); err != nil {
			return err
		}
		fmt.Fprintf(out, "curves written to %s\n", c.plot)
	}
	return nil
}

func dedupe(results []*result) []*result {
	var out []*result
	for i, r := range results {
		if !slices.ContainsFunc(results[i+1:], func(o *result) bool { return o.scale == r.scale }) {
			out = append(out, r)
		}
	}
	return out
}
