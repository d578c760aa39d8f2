package main

import (
	"fmt"
	"io"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/ctrlmesh/ctrlmesh/test/bench/internal/benchstat"
)

// Goals of the proxy, as the design states them.
const (
	goalGetP50Ratio    = 1.05
	goalList1kP50Ratio = 1.05
	goalAddedP99       = 500 * time.Microsecond
	goalWatchThruRate  = 0.80
	// goalConcurrentRate bounds the throughput of the concurrent clients
	// through the proxy against direct.
	goalConcurrentRate = 0.90
)

// fmtMs prints a duration in milliseconds with a precision fit for its size.
func fmtMs(d time.Duration) string {
	v := d.Seconds() * 1000
	switch {
	case v < 0 && v > -10, v >= 0 && v < 10:
		return fmt.Sprintf("%.3f ms", v)
	case v < 100 && v > -100:
		return fmt.Sprintf("%.2f ms", v)
	default:
		return fmt.Sprintf("%.1f ms", v)
	}
}

// fmtRatio prints a over b.
func fmtRatio(a, b time.Duration) string { return fmt.Sprintf("%.2fx", benchstat.Ratio(a, b)) }

func fmtSignedMs(d time.Duration) string {
	if d >= 0 {
		return "+" + fmtMs(d)
	}
	return fmtMs(d)
}

func report(w io.Writer, o options, res *results) {
	wire := "protobuf (application/vnd.kubernetes.protobuf)"
	if o.content == "json" {
		wire = "JSON (application/json)"
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format+"\n", args...) }

	p("")
	p("ctrlmesh-proxy overhead vs direct and vs a bare hop: one run, the ways' requests interleaved; the proxy and the hop each in its own process, built as the proxy's image is")
	p("machine:  %s/%s, NumCPU=%d, GOMAXPROCS=%d, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	p("server:   kube-apiserver %s + etcd on this machine; they, the proxy and the clients share its CPUs", res.apiserverVersion)
	p("mode:     %s: %s", o.mode, res.modeCheck)
	p("policies: %d CircuitBreakers and %d faults in the proxy's rules, matching no request measured (their check's cost per request: go test -bench BenchmarkCheck ./proxy/policy)", o.policies, o.policies)
	p("clients:  typed client-go clientset, %s, no client-side rate limit; direct = HTTPS/HTTP2 to kube-apiserver; hop and proxy = plain HTTP/1.1 on loopback, then their HTTPS/HTTP1.1", wire)
	p("hop:      the bare hop (test/bench/proxybench/barehop): ctrlmesh-proxy's forwarding alone (proxy.UpstreamReverseProxy), no rules, no checks: the floor of any sidecar's cost here")
	p("data:     %d ConfigMaps (%d namespaces x %d, %d-byte payload, labeled), seeded in %s; the pod owns all %d buckets, so every way returns the same objects",
		totalObjects, namespaces, perNamespace, payloadBytes, res.seedTime.Round(100*time.Millisecond), buckets)
	p("")

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cells ...string) {
		for i, c := range cells {
			if i > 0 {
				_, _ = io.WriteString(tw, "\t")
			}
			_, _ = io.WriteString(tw, c)
		}
		_, _ = io.WriteString(tw, "\t\n")
	}
	row("REQUEST", "N", "DIRECT p50", "HOP p50", "PROXY p50", "HOP x", "PROXY x", "PROXY/HOP", "DIRECT p99", "HOP +p99", "PROXY +p99", "HOP CPU s/1000", "PROXY CPU s/1000")
	latencyRow := func(name string, latencies [numWays][]time.Duration, cost [numWays]cpuCost) (s [numWays]benchstat.Summary) {
		for _, w := range listWays {
			s[w] = benchstat.Summarize(latencies[w])
		}
		d, h, pr := s[wayDirect], s[wayHop], s[wayProxy]
		row(name, fmt.Sprint(d.N),
			fmtMs(d.P50), fmtMs(h.P50), fmtMs(pr.P50),
			fmtRatio(h.P50, d.P50), fmtRatio(pr.P50, d.P50), fmtRatio(pr.P50, h.P50),
			fmtMs(d.P99), fmtSignedMs(h.P99-d.P99), fmtSignedMs(pr.P99-d.P99),
			fmt.Sprintf("%.3f", cost[wayHop].perThousand()), fmt.Sprintf("%.3f", cost[wayProxy].perThousand()))
		return s
	}
	get := latencyRow("GET 1 ConfigMap", res.get, res.cpuGet)
	list1kName, list10kName := fmt.Sprintf("LIST %d (1 namespace)", res.list1kItems), fmt.Sprintf("LIST %d (all namespaces)", res.list10kItems)
	list1k := latencyRow(list1kName, res.list1k, res.cpuList1k)
	list10k := latencyRow(list10kName, res.list10k, res.cpuList10k)
	_ = tw.Flush()
	p("GET: sequential; LIST: unpaginated, resourceVersion unset (consistent read), label selector %s=%s every way. Times include client-side decoding.", benchLabel, benchValue)
	p("x: p50 over direct's; PROXY/HOP: the proxy's p50 over the bare hop's; +p99: p99 over direct's.")
	p("CPU s/1000: the process's user+system CPU seconds (/proc/<pid>/stat) over the row's measurement, warm-up included, per 1,000 of its requests (the hop's LISTs: both its ways').")
	p("")

	row("LIST, NARROWED AS THE PROXY NARROWS", "N", "DIRECT p50", "NARROWED p50", "HOP NARROWED p50", "PROXY p50", "NARROWED/DIRECT", "PROXY/HOP NARROWED", "PROXY/NARROWED")
	narrowedRow := func(name string, s [numWays]benchstat.Summary) {
		d, dn, hn, pr := s[wayDirect], s[wayDirectNarrowed], s[wayHopNarrowed], s[wayProxy]
		row(name, fmt.Sprint(dn.N), fmtMs(d.P50), fmtMs(dn.P50), fmtMs(hn.P50), fmtMs(pr.P50),
			fmtRatio(dn.P50, d.P50), fmtRatio(pr.P50, hn.P50), fmtRatio(pr.P50, dn.P50))
	}
	narrowedRow(list1kName, list1k)
	narrowedRow(list10kName, list10k)
	_ = tw.Flush()
	p("NARROWED: direct, each list narrowed as the proxy narrows it (mode above); HOP NARROWED: the same lists through the bare hop.")
	p("NARROWED/DIRECT is kube-apiserver's share of a sharded list; PROXY/HOP NARROWED the proxy's own code's, the same requests forwarded bare; PROXY/NARROWED the sidecar's whole cost over a sharded list sent directly.")
	p("")

	var conc [numWays]float64
	for _, w := range ways {
		conc[w] = throughput(res.conc[w])
	}
	hopConc, proxyConc := conc[wayHop]/conc[wayDirect], conc[wayProxy]/conc[wayDirect]
	row("CONCURRENT", "CLIENTS", "DIRECT", "HOP", "PROXY", "HOP/DIRECT", "PROXY/DIRECT", "HOP CPU s/1000", "PROXY CPU s/1000")
	row(fmt.Sprintf("%d GETs + 1 LIST %d, repeated", listEvery-1, perNamespace), fmt.Sprint(o.clients),
		fmt.Sprintf("%.0f req/s", conc[wayDirect]), fmt.Sprintf("%.0f req/s", conc[wayHop]), fmt.Sprintf("%.0f req/s", conc[wayProxy]),
		fmt.Sprintf("%.2fx", hopConc), fmt.Sprintf("%.2fx", proxyConc),
		fmt.Sprintf("%.3f", res.cpuConcurrent[wayHop].perThousand()), fmt.Sprintf("%.3f", res.cpuConcurrent[wayProxy].perThousand()))
	_ = tw.Flush()
	p("%d runs of %s each way, rotating the order; every response checked. The proxy's VmRSS: %.1f MiB serving, before the measurements; %.1f MiB after them.",
		len(res.conc[wayDirect]), o.concurrentFor, float64(res.proxyRSSIdle)/(1<<20), float64(res.proxyRSSLoaded)/(1<<20))
	p("")

	events := o.events
	liveD, liveP := benchstat.PerSecond(events, res.watchLiveDirect), benchstat.PerSecond(events, res.watchLiveProx)
	repD, repP := benchstat.Summarize(res.replayDirect), benchstat.Summarize(res.replayProxied)
	row("WATCH (direct and proxy only)", "EVENTS", "DIRECT", "PROXY", "PROXY/DIRECT")
	row("live (both at once)", fmt.Sprint(events),
		fmt.Sprintf("%.0f ev/s (%s)", liveD, fmtMs(res.watchLiveDirect)),
		fmt.Sprintf("%.0f ev/s (%s)", liveP, fmtMs(res.watchLiveProx)),
		fmt.Sprintf("%.2fx", liveP/liveD))
	row(fmt.Sprintf("replay (median of %d)", repD.N), fmt.Sprint(events),
		fmt.Sprintf("%.0f ev/s (%s)", benchstat.PerSecond(events, repD.P50), fmtMs(repD.P50)),
		fmt.Sprintf("%.0f ev/s (%s)", benchstat.PerSecond(events, repP.P50), fmtMs(repP.P50)),
		fmt.Sprintf("%.2fx", benchstat.Ratio(repD.P50, repP.P50)))
	_ = tw.Flush()
	p("live: %d writers made the %d updates in %s (%.0f writes/s, the ceiling); time = first write to each watcher's last event.",
		o.writers, events, fmtMs(res.watchWrite), benchstat.PerSecond(events, res.watchWrite))
	p("replay: one watcher at a time re-reads the same events from the watch cache (watch from the pre-write resourceVersion), alternating order.")
	p("")

	watchRatio := liveP / liveD
	replayRatio := benchstat.Ratio(repD.P50, repP.P50)
	row("GOAL", "TARGET", "BARE HOP", "PROXY", "PROXY'S RESULT")
	ratioGoal := func(name string, goal float64, s [numWays]benchstat.Summary) {
		hop, proxy := benchstat.Ratio(s[wayHop].P50, s[wayDirect].P50), benchstat.Ratio(s[wayProxy].P50, s[wayDirect].P50)
		row(name, fmt.Sprintf("<= %.2fx", goal), fmt.Sprintf("%.2fx", hop), fmt.Sprintf("%.2fx", proxy), benchstat.Verdict(proxy <= goal))
	}
	ratioGoal("GET p50 over direct", goalGetP50Ratio, get)
	hopAdded, proxyAdded := get[wayHop].P99-get[wayDirect].P99, get[wayProxy].P99-get[wayDirect].P99
	row("GET added p99", "<= "+fmtMs(goalAddedP99), fmtSignedMs(hopAdded), fmtSignedMs(proxyAdded), benchstat.Verdict(proxyAdded <= goalAddedP99))
	ratioGoal(fmt.Sprintf("LIST %d p50 over direct", res.list1kItems), goalList1kP50Ratio, list1k)
	row(fmt.Sprintf("concurrent throughput over direct (%d clients)", o.clients), fmt.Sprintf(">= %.2fx", goalConcurrentRate),
		fmt.Sprintf("%.2fx", hopConc), fmt.Sprintf("%.2fx", proxyConc), benchstat.Verdict(proxyConc >= goalConcurrentRate))
	row("WATCH live throughput over direct", fmt.Sprintf(">= %.2fx", goalWatchThruRate), "-", fmt.Sprintf("%.2fx", watchRatio), benchstat.Verdict(watchRatio >= goalWatchThruRate))
	row("WATCH replay throughput over direct (capacity)", fmt.Sprintf(">= %.2fx", goalWatchThruRate), "-", fmt.Sprintf("%.2fx", replayRatio), benchstat.Verdict(replayRatio >= goalWatchThruRate))
	_ = tw.Flush()
	p("The bare hop has no goal of its own: where it misses one, no sidecar proxy meets it on this machine.")
	p("The live watch rate is bounded by the writers, so it can hardly miss; the replay row is the same goal applied to delivery capacity.")
	p("(a benchmark reports; it does not gate: the exit status is 0 whatever the results)")
}
