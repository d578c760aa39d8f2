package main

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ctrlmesh/ctrlmesh/test/localfleet"

	"github.com/ctrlmesh/ctrlmesh/test/bench/internal/benchstat"
)

// Goals, as the issue states them.
const (
	goalMemoryRatio = 0.35
	// goalAnonRatio bounds each sharded pod's private memory (RssAnon)
	// against the single pod's: what sharding divides. RSS also counts the
	// operator's own executable's pages (~30 MiB of the demo operator),
	// which no sharding divides, so the RSS goal is stated on a workload
	// heavy enough for them to matter less: heavyObjects of heavyPayload.
	goalAnonRatio = 0.30
	heavyObjects  = 50000
	heavyPayload  = 1024
	// goalProxyRSS bounds each sidecar's RSS beside its loaded operator.
	goalProxyRSS = 25 << 20
	goalEditP99  = time.Second
	// goalKarmadaEditP99 is the same with Karmada applying the Works.
	goalKarmadaEditP99 = 1500 * time.Millisecond
	goalFailover       = localfleet.OperatorLeaseDuration + 3*time.Second
)

func report(w io.Writer, o options, res *results) {
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format+"\n", args...) }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cells ...string) { _, _ = io.WriteString(tw, strings.Join(cells, "\t")+"\t\n") }

	p("")
	p("ctrlmesh on a local fleet: one run, measured (nothing hard-coded)")
	p("machine:  %s/%s, NumCPU=%d, %s; every API server, etcd, hub, agent, proxy and operator shares these CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	if res.apiserver != "" {
		p("clusters: kube-apiserver %s + etcd per cluster, members in range mode (ShardedListAndWatch); hub and agents in this process", res.apiserver)
	}
	p("operator: demo-operator behind ctrlmesh-proxy, leader election lease %s, as localfleet starts it; client limit --kube-api-qps=%d --kube-api-burst=%d (-operator-qps)",
		localfleet.OperatorLeaseDuration, o.operatorQPS, o.operatorBurst())
	var goals [][]string

	if m := res.memory; m != nil {
		p("")
		p("MEMORY: demo operator, 1 member, %d managed ConfigMaps over %d namespaces (%d-%d namespaces per bucket), %d-byte data payload each",
			m.objects, m.namespaces, m.minPerBucket, m.maxPerBucket, m.payload)
		p("created in %.1fs by %d writers; memory read from /proc/<pid>/status once the pod had reconciled every object of its buckets and recorded nothing for %s",
			m.createTime.Seconds(), o.workers, o.settle)
		row("POD", "BUCKETS", "OBJECTS", "RSS", "PEAK RSS (VmHWM)", "ANON (RssAnon)", "FILE (RssFile)", "RSS / SINGLE", "ANON / SINGLE", "PROXY RSS", "SHARE RECONCILED AFTER")
		memRow := func(pm podMemory, label, reconciled string) {
			op := pm.operator
			row(label, pm.buckets, fmt.Sprint(pm.objects), mib(op.rss), mib(op.hwm), mib(op.anon), mib(op.file),
				fmt.Sprintf("%.2fx", ratio(op.rss, m.single.operator.rss)), fmt.Sprintf("%.2fx", ratio(op.anon, m.single.operator.anon)),
				mib(pm.proxy.rss), reconciled)
		}
		memRow(m.idle, m.idle.pod+" (idle: no ConfigMap yet)", "-")
		memRow(m.single, m.single.pod, fmt.Sprintf("%.1fs", m.single.reconciled.Seconds()))
		for _, s := range m.sharded {
			memRow(s, s.pod, fmt.Sprintf("%.1fs", s.reconciled.Seconds()))
		}
		_ = tw.Flush()
		p("RSS = ANON + FILE + shared memory (RssShmem, not shown). ANON is the operator's private memory (Go heap, stacks); FILE is pages mapped from files,")
		p("mostly the operator's own executable, counted in every pod that runs it. PROXY RSS is the pod's ctrlmesh-proxy sidecar, not counted in RSS.")
		p("SHARE RECONCILED AFTER: from the pod's start until every object of its buckets had a reconcile record with outcome written or unchanged.")
		p("The ConfigMaps were created without the operator's annotations: the single pod wrote its reconciled-by and data-hash annotations on all %d (%.0f objects/s from its start),",
			m.single.objects, rate(m.single.objects, m.single.reconciled))
		p("and each of the %d pods rewrote the reconciled-by annotation, which named the single pod, of every object of its buckets.", len(m.sharded))
		if idle, single := m.idle.operator.rss, m.single.operator.rss; single > idle && len(m.sharded) > 0 {
			fixed := ratio(idle, single)
			p("Beyond the idle pod: single +%s; sharded %s.", mib(single-idle), shardedAbove(m))
			p("The idle pod is %.2fx the single pod: a pod holding exactly 1/%d of the objects and nothing else would be at %.2fx + %.2fx / %d = %.2fx.",
				fixed, len(m.sharded), fixed, 1-fixed, len(m.sharded), fixed+(1-fixed)/float64(len(m.sharded)))
		}
		reportGoMemory(p, row, tw, m)
		goals = append(goals, memoryGoals(m)...)
	}

	if len(res.edits) > 0 {
		goals = append(goals, reportEdits(p, row, tw, res.edits)...)
	}

	if f := res.failover; f != nil {
		p("")
		p("FAILOVER: pod killed (SIGKILL proxy, then operator; Pod object deleted), 2 members x %d pods, replacement pod started between kills", o.podsPerMember)
		p("time from just before the kill until the route gives every bucket the pod served to a survivor (ROUTE), that survivor's proxy enforces it (RULES),")
		p("and the survivor's operator holds the shard's lease too (SERVED, the figure against the goal)")
		row("KILL", "POD", "BUCKETS", "ROUTE", "RULES", "SERVED")
		var totals []time.Duration
		for i, k := range f.kills {
			row(fmt.Sprint(i+1), k.member+"/"+k.pod, k.buckets, fmtMs(k.reassigned), fmtMs(k.rules), fmtMs(k.total))
			totals = append(totals, k.total)
		}
		_ = tw.Flush()
		worst := slices.Max(totals)
		goals = append(goals, []string{"failover, max of kills (lease + 3s)", "<= " + fmtMs(goalFailover), fmtMs(worst), benchstat.Verdict(worst <= goalFailover)})
	}

	p("")
	row("GOAL", "TARGET", "MEASURED", "RESULT")
	for _, g := range goals {
		row(g...)
	}
	_ = tw.Flush()
	p("(a benchmark reports; it does not gate: the exit status is 0 whatever the results)")
}

// reportEdits prints the edit phase of each fleet (standalone first, then
// Karmada), the ratio of their percentiles, and each member's stages, and
// returns the goal rows.
func reportEdits(p func(string, ...any), row func(...string), tw *tabwriter.Writer, edits []*editResult) (goals [][]string) {
	first := edits[0]
	p("")
	p("EDIT -> ENFORCED: %d ShardingConfig edits per fleet (add/remove secrets in limits[0].relateResources; no bucket moves), 2 members x %d pods, PerCluster",
		len(first.samples), first.podsPerMember)
	if len(edits) > 1 {
		var fleets []string
		for _, e := range edits {
			fleets = append(fleets, e.mode)
		}
		p("on %d fleets running at once (%s), one edit on each in turn, each fleet settled before the next edit", len(edits), strings.Join(fleets, ", "))
	}
	p("time from just before the Update to the ShardRoute watch event in which the last proxy of both members reports the new route's rules hash")
	summaries := map[string]benchstat.Summary{}
	for _, e := range edits {
		var parts []string
		for _, s := range e.totals() {
			parts = append(parts, fmtMs(s))
		}
		p("%s, samples in edit order: %s", e.mode, strings.Join(parts, " "))
		summaries[e.mode] = benchstat.Summarize(e.totals())
	}
	row("FLEET", "N", "MIN", "p50", "p99", "MAX", "MEAN")
	for _, e := range edits {
		sum := summaries[e.mode]
		row(e.mode, fmt.Sprint(sum.N), fmtMs(sum.Min), fmtMs(sum.P50), fmtMs(sum.P99), fmtMs(sum.Max), fmtMs(sum.Mean))
	}
	_ = tw.Flush()
	if n := len(first.samples); n < 100 {
		p("(nearest-rank percentiles: with %d samples, p99 is the maximum)", n)
	}
	if k, ok := summaries[modeKarmada]; ok {
		st := summaries[modeStandalone]
		p("%s / %s, same run: p50 %.2fx, p99 %.2fx", modeKarmada, modeStandalone, benchstat.Ratio(k.P50, st.P50), benchstat.Ratio(k.P99, st.P99))
	}

	p("")
	p("stages of each member, p50 / p99 over the edits, each from the watch event of the one before: the hub's Work for the member carries the new")
	p("route (EDIT -> WORK); the member's ShardRoute does (WORK -> ROUTE: the Work applied); every proxy of the member reports its rules hash in the")
	p("ShardRoute's status (ROUTE -> ENFORCED); the Work's status reports that back to the hub (ENFORCED -> REPORTED: the agent's status writer in")
	p("standalone mode, Karmada's work-status controller in Karmada mode; not part of EDIT -> ENFORCED). ROUTE VERSIONS: how many routing generations")
	p("the member received from one edit until the fleet settled, most of any edit: 1, as these edits move no bucket, unless the hub changed the placement after it")
	row("FLEET", "MEMBER", "WORK APPLIED BY", "EDIT -> WORK", "WORK -> ROUTE", "ROUTE -> ENFORCED", "ENFORCED -> REPORTED", "EDIT -> ENFORCED", "ROUTE VERSIONS")
	for _, e := range edits {
		for _, m := range latencyMembers {
			var work, deliver, enforce, report, total []time.Duration
			var versions int64
			for _, s := range e.samples {
				st := s.members[m]
				versions = max(versions, st.versions)
				work = append(work, st.work)
				deliver = append(deliver, st.route-st.work)
				enforce = append(enforce, st.enforced-st.route)
				report = append(report, st.reported-st.enforced)
				total = append(total, st.enforced)
			}
			row(e.mode, m, e.appliers[m], p50p99(work), p50p99(deliver), p50p99(enforce), p50p99(report), p50p99(total), fmt.Sprint(versions))
		}
	}
	_ = tw.Flush()

	for _, e := range edits {
		var versions int64
		for _, s := range e.samples {
			for _, st := range s.members {
				versions = max(versions, st.versions)
			}
		}
		goals = append(goals, []string{"route versions per edit and member, " + e.mode, "1", fmt.Sprint(versions), benchstat.Verdict(versions <= 1)})
	}
	for _, e := range edits {
		goal := goalEditP99
		if e.mode == modeKarmada {
			goal = goalKarmadaEditP99
		}
		p99 := summaries[e.mode].P99
		goals = append(goals, []string{"edit -> every proxy enforcing, p99, " + e.mode, "<= " + fmtMs(goal), fmtMs(p99), benchstat.Verdict(p99 <= goal)})
	}
	return goals
}

// p50p99 prints the median and the 99th percentile of samples.
func p50p99(samples []time.Duration) string {
	sum := benchstat.Summarize(samples)
	return fmtMs(sum.P50) + " / " + fmtMs(sum.P99)
}

// shardedAbove lists each sharded pod's RSS beyond the idle pod's, and
// that as a fraction of the single pod's.
func shardedAbove(m *memoryResult) string {
	idle := m.idle.operator.rss
	var parts []string
	for _, s := range m.sharded {
		parts = append(parts, fmt.Sprintf("+%s (%.2fx)", mib(s.operator.rss-idle), ratio(s.operator.rss-idle, m.single.operator.rss-idle)))
	}
	return strings.Join(parts, ", ")
}

// reportGoMemory splits each operator's private memory the way its Go
// runtime accounts for it: the live heap, which is what sharding divides,
// and what the runtime keeps whatever the share.
func reportGoMemory(p func(string, ...any), row func(...string), tw *tabwriter.Writer, m *memoryResult) {
	p("")
	p("GO RUNTIME of each operator, from its /metrics right after /proc: LIVE HEAP is what the last collection marked live (mostly the informer's cache);")
	p("HEAP GOAL is where the next collection starts (GOGC=100: about twice live); HEAP is the heap's memory not returned to the OS (objects, garbage not yet")
	p("collected, free pages kept); ANON - HEAP is the private memory outside it (stacks, the runtime's metadata, pages it has not yet returned)")
	row("POD", "LIVE HEAP", "LIVE / SINGLE", "LIVE PER OBJECT ABOVE IDLE", "HEAP GOAL", "HEAP", "ANON - HEAP", "ANON / SINGLE")
	single := m.single.runtime
	for _, pm := range append([]podMemory{m.idle, m.single}, m.sharded...) {
		rt := pm.runtime
		perObject := "-"
		if pm.objects > 0 {
			perObject = fmt.Sprintf("%.2f KiB", float64(rt.live-m.idle.runtime.live)/float64(pm.objects)/1024)
		}
		row(pm.pod, mib(rt.live), fmt.Sprintf("%.2fx", ratio(rt.live, single.live)), perObject, mib(rt.goal), mib(rt.heap),
			mib(pm.operator.anon-rt.heap), fmt.Sprintf("%.2fx", ratio(pm.operator.anon, m.single.operator.anon)))
	}
	_ = tw.Flush()
}

// rate is n per second over d; 0 for no time.
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// fmtMs prints a duration in milliseconds, or seconds from 10 s up.
func fmtMs(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

// memoryGoals are the memory phase's goal rows: every sharded pod's
// private memory against the single pod's; its RSS too on the heavy
// workload; and every loaded pod's sidecar.
func memoryGoals(m *memoryResult) (goals [][]string) {
	heavy := m.objects >= heavyObjects && m.payload >= heavyPayload
	for _, s := range m.sharded {
		r := ratio(s.operator.anon, m.single.operator.anon)
		goals = append(goals, []string{"private memory (RssAnon) " + s.pod + " / single pod", fmt.Sprintf("<= %.2fx", goalAnonRatio), fmt.Sprintf("%.2fx", r), benchstat.Verdict(r <= goalAnonRatio)})
		if heavy {
			r := ratio(s.operator.rss, m.single.operator.rss)
			goals = append(goals, []string{fmt.Sprintf("memory (RSS) %s / single pod, %d objects of %d B", s.pod, m.objects, m.payload), fmt.Sprintf("<= %.2fx", goalMemoryRatio), fmt.Sprintf("%.2fx", r), benchstat.Verdict(r <= goalMemoryRatio)})
		}
	}
	for _, pm := range append([]podMemory{m.single}, m.sharded...) {
		goals = append(goals, []string{"sidecar RSS beside " + pm.pod, "<= " + mib(goalProxyRSS), mib(pm.proxy.rss), benchstat.Verdict(pm.proxy.rss <= goalProxyRSS)})
	}
	return goals
}
