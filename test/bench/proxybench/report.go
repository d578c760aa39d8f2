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
	p("ctrlmesh-proxy overhead vs direct: one run, direct and proxied requests interleaved; the proxy in its own process, built as its image is")
	p("machine:  %s/%s, NumCPU=%d, GOMAXPROCS=%d, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	p("server:   kube-apiserver %s + etcd on this machine; they, the proxy and the clients share its CPUs", res.apiserverVersion)
	p("mode:     %s: %s", o.mode, res.modeCheck)
	p("policies: %d CircuitBreakers and %d faults in the proxy's rules, matching no request measured (their check's cost per request: go test -bench BenchmarkCheck ./proxy/policy)", o.policies, o.policies)
	p("clients:  typed client-go clientset, %s, no client-side rate limit; direct = HTTPS/HTTP2 to kube-apiserver, proxy = plain HTTP/1.1 on loopback, then the proxy's HTTPS", wire)
	p("data:     %d ConfigMaps (%d namespaces x %d, %d-byte payload, labeled), seeded in %s; the pod owns all %d buckets, so both ways return the same objects",
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
	row("REQUEST", "N", "DIRECT p50", "PROXY p50", "p50 x", "DIRECT mean", "PROXY mean", "mean x", "DIRECT p99", "PROXY p99", "ADDED p99", "PROXY CPU s/1000")
	latencyRow := func(name string, direct, proxied []time.Duration, cost cpuCost) (benchstat.Summary, benchstat.Summary) {
		d, pr := benchstat.Summarize(direct), benchstat.Summarize(proxied)
		row(name, fmt.Sprint(d.N),
			fmtMs(d.P50), fmtMs(pr.P50), fmt.Sprintf("%.2fx", benchstat.Ratio(pr.P50, d.P50)),
			fmtMs(d.Mean), fmtMs(pr.Mean), fmt.Sprintf("%.2fx", benchstat.Ratio(pr.Mean, d.Mean)),
			fmtMs(d.P99), fmtMs(pr.P99), fmtSignedMs(pr.P99-d.P99), fmt.Sprintf("%.3f", cost.perThousand()))
		return d, pr
	}
	getD, getP := latencyRow("GET 1 ConfigMap", res.getDirect, res.getProxied, res.cpuGet)
	list1kD, list1kP := latencyRow(fmt.Sprintf("LIST %d (1 namespace)", res.list1kItems), res.list1kDirect, res.list1kProxied, res.cpuList1k)
	latencyRow(fmt.Sprintf("LIST %d (all namespaces)", res.list10kItems), res.list10kDirect, res.list10kProx, res.cpuList10k)
	_ = tw.Flush()
	p("GET: sequential; LIST: unpaginated, resourceVersion unset (consistent read), label selector %s=%s both ways. Times include client-side decoding.", benchLabel, benchValue)
	p("PROXY CPU s/1000: the proxy process's user+system CPU seconds (/proc/<pid>/stat) over the row's proxied requests, warm-up included, per 1,000.")
	p("")

	concD, concP := throughput(res.concDirect), throughput(res.concProxied)
	concRatio := concP / concD
	row("CONCURRENT", "CLIENTS", "DIRECT", "PROXY", "PROXY/DIRECT", "PROXY CPU s/1000")
	row(fmt.Sprintf("%d GETs + 1 LIST %d, repeated", listEvery-1, perNamespace), fmt.Sprint(o.clients),
		fmt.Sprintf("%.0f req/s", concD), fmt.Sprintf("%.0f req/s", concP), fmt.Sprintf("%.2fx", concRatio), fmt.Sprintf("%.3f", res.cpuConcurrent.perThousand()))
	_ = tw.Flush()
	p("%d runs of %s each way, alternating; every response checked. The proxy's VmRSS: %.1f MiB serving, before the measurements; %.1f MiB after them.",
		len(res.concDirect), o.concurrentFor, float64(res.proxyRSSIdle)/(1<<20), float64(res.proxyRSSLoaded)/(1<<20))
	p("")

	events := o.events
	liveD, liveP := benchstat.PerSecond(events, res.watchLiveDirect), benchstat.PerSecond(events, res.watchLiveProx)
	repD, repP := benchstat.Summarize(res.replayDirect), benchstat.Summarize(res.replayProxied)
	row("WATCH", "EVENTS", "DIRECT", "PROXY", "PROXY/DIRECT")
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

	getRatio := benchstat.Ratio(getP.P50, getD.P50)
	added := getP.P99 - getD.P99
	watchRatio := liveP / liveD
	replayRatio := benchstat.Ratio(repD.P50, repP.P50)
	row("GOAL", "TARGET", "MEASURED", "RESULT")
	row("GET p50 proxy/direct", fmt.Sprintf("<= %.2fx", goalGetP50Ratio), fmt.Sprintf("%.2fx", getRatio), benchstat.Verdict(getRatio <= goalGetP50Ratio))
	row("GET added p99", "<= "+fmtMs(goalAddedP99), fmtSignedMs(added), benchstat.Verdict(added <= goalAddedP99))
	list1kRatio := benchstat.Ratio(list1kP.P50, list1kD.P50)
	row(fmt.Sprintf("LIST %d p50 proxy/direct", res.list1kItems), fmt.Sprintf("<= %.2fx", goalList1kP50Ratio), fmt.Sprintf("%.2fx", list1kRatio), benchstat.Verdict(list1kRatio <= goalList1kP50Ratio))
	row(fmt.Sprintf("concurrent throughput proxy/direct (%d clients)", o.clients), fmt.Sprintf(">= %.2fx", goalConcurrentRate), fmt.Sprintf("%.2fx", concRatio), benchstat.Verdict(concRatio >= goalConcurrentRate))
	row("WATCH live throughput proxy/direct", fmt.Sprintf(">= %.2fx", goalWatchThruRate), fmt.Sprintf("%.2fx", watchRatio), benchstat.Verdict(watchRatio >= goalWatchThruRate))
	row("WATCH replay throughput proxy/direct (capacity)", fmt.Sprintf(">= %.2fx", goalWatchThruRate), fmt.Sprintf("%.2fx", replayRatio), benchstat.Verdict(replayRatio >= goalWatchThruRate))
	_ = tw.Flush()
	p("The live watch rate is bounded by the writers, so it can hardly miss; the replay row is the same goal applied to delivery capacity.")
	p("(a benchmark reports; it does not gate: the exit status is 0 whatever the results)")
}
