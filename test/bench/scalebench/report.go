package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Goals of issue 17 for the hub, checked in the report.
const (
	goalReady = 60 * time.Second
	goalRSS   = 1 << 30
)

// goalScale is the scale the goals are stated for.
var goalScale = scale{clusters: 1000, configs: 100}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

func methods(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func readyCell(r *result) string {
	if !r.readyDone {
		return "not Ready within " + secs(r.ready)
	}
	return secs(r.ready)
}

// report prints the load the run ran under and one Markdown table row per
// scale, then the goals of the largest scale measured.
func report(out io.Writer, results []*result, opts options) {
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(out, "\n## hub at fleet scale (%d CPUs; load average at the end: %s)\n", runtime.NumCPU(), strings.TrimSpace(string(load)))
	memoryLimit := opts.hubMemoryLimit
	if memoryLimit == "" {
		memoryLimit = "none"
	}
	fmt.Fprintf(out, "this run: pods per config and member %d, proxies apply in %s, heartbeat every %s (lease %s), Fleet config over %d members, the hub's GOMEMLIMIT %s\n\n",
		opts.pods, opts.proxyDelay, opts.renew, opts.lease, opts.fleetSize, memoryLimit)
	fmt.Fprintln(out, "| clusters × configs | Works | apply → Ready | hub CPU | hub RSS (peak) | hub requests during apply | hub req/s at rest, without Events (heartbeats/s) | pod failure healed (Works written) | restart: leads, healed (Works written, unchanged rewritten) | Fleet member lost → served elsewhere |")
	fmt.Fprintln(out, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range results {
		row := []string{fmt.Sprintf("%d × %d", r.clusters, r.configs), fmt.Sprint(r.works), readyCell(r),
			fmt.Sprintf("%.1f s", r.cpu), memoryCell(r),
			fmt.Sprintf("%.0f (%.0f/s): %s", total(r.requests), total(r.requests)/max(r.ready.Seconds(), 1e-3), methods(r.requests))}
		if r.readyDone {
			row = append(row,
				fmt.Sprintf("%.2f (%.1f, each member every %s)", r.steadyRate(), r.heartbeatsPerSec, secs(time.Duration(float64(r.clusters)/r.heartbeatsPerSec*float64(time.Second)))),
				fmt.Sprintf("%s (%d)", secs(r.podFailure), len(r.podFailureWrites)),
				fmt.Sprintf("%s, %s (%d, %d)", secs(r.restartLeads), secs(r.restartHealed), len(r.restartWrites), len(r.restartUnchanged)),
				secs(r.fleetLoss))
		} else {
			row = append(row, "–", "–", "–", "–")
		}
		fmt.Fprintf(out, "| %s |\n", strings.Join(row, " | "))
	}
	for _, r := range results {
		fmt.Fprintf(out, "%s: Ready within %s: %s; hub RSS within %d MiB: %s (the goals are for 1000 clusters x 100 configs)\n",
			r.scale, goalReady, metOrMissed(r.readyDone && r.ready <= goalReady), goalRSS>>20, rssVerdict(r))
	}
	for _, r := range results {
		if c := r.ceiling; c != nil {
			// The Fleet config's Works beside the PerCluster ones'.
			goalWorks := goalScale.clusters*goalScale.configs + r.works - r.clusters*r.configs
			fmt.Fprintf(out, "%s: the API server's ceiling (%d Works of %d bytes, %d writers, before the hub started): %.0f creations/s, %.0f updates/s, %.0f status writes/s; "+
				"the shortest apply -> Ready it allows (each Work created, reported on, updated, reported on): %s here (%d Works), %s at %d clusters x %d configs (%d Works)\n",
				r.scale, c.works, c.bytes, ceilingWriters, c.creates, c.updates, c.statuses, secs(c.floor(r.works)), r.works,
				secs(c.floor(goalWorks)), goalScale.clusters, goalScale.configs, goalWorks)
		}
	}
	for _, r := range results {
		if st := r.startup; st != nil {
			fmt.Fprintf(out, "%s: a hub's start with %d Works, its informers' lists read whole / streamed: peak RSS %d / %d MiB (%.2fx), live heap %.1f / %.1f MB, settled after %s / %s\n",
				r.scale, st.works, st.list.peak>>20, st.stream.peak>>20, float64(st.stream.peak)/float64(max(st.list.peak, 1)),
				float64(st.list.heap)/1e6, float64(st.stream.heap)/1e6, secs(st.list.settle), secs(st.stream.settle))
		}
	}
	for _, r := range results {
		if r.api != nil {
			fmt.Fprintf(out, "%s: the API server during apply, the heaviest: %s; the hub's failed reconciles: %s\n", r.scale, r.api.summary(6), orNone(methods(r.reconcileErrors)))
		}
	}
	for _, r := range results {
		if r.restHeap > 0 {
			fmt.Fprintf(out, "%s: the leader's live heap at rest %.1f MB, %.1f KB a Work%s\n", r.scale, float64(r.restHeap)/1e6, float64(r.restHeap)/1e3/float64(r.works), profileNote(r.restHeapFile))
		}
		if r.leaderHeap > 0 {
			fmt.Fprintf(out, "%s: the new leader's live heap once healed %.1f MB, %.1f KB a Work%s\n", r.scale, float64(r.leaderHeap)/1e6, float64(r.leaderHeap)/1e3/float64(r.works), profileNote(r.heapFile))
		}
	}
}

// plotCurves draws time to Ready, hub memory and hub requests per second
// over the scales, three panels side by side, into an SVG file.
func plotCurves(path string, results []*result) error {
	type series struct {
		title, y string
		value    func(*result) float64
	}
	panels := []series{
		{"apply → all Ready", "seconds", func(r *result) float64 { return r.ready.Seconds() }},
		{"hub memory (RSS)", "MiB", func(r *result) float64 { return float64(r.rss >> 20) }},
		{"hub API requests", "per second during apply", func(r *result) float64 { return total(r.requests) / max(r.ready.Seconds(), 1e-3) }},
	}
	row := make([]*plot.Plot, len(panels))
	for i, s := range panels {
		p := plot.New()
		p.Title.Text = s.title
		p.X.Label.Text = "member clusters (× configs)"
		p.Y.Label.Text = s.y
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		var pts plotter.XYs
		var labels []string
		for _, r := range results {
			pts = append(pts, plotter.XY{X: float64(r.clusters), Y: s.value(r)})
			l := fmt.Sprintf("%d×%d", r.clusters, r.configs)
			if !r.readyDone {
				l += " (not Ready)"
			}
			labels = append(labels, l)
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		points.Shape = draw.CircleGlyph{}
		lbls, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: labels})
		if err != nil {
			return err
		}
		p.Add(line, points, lbls)
		row[i] = p
	}
	const w, h = 15 * vg.Inch, 4 * vg.Inch
	c := vgsvg.New(w, h)
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Inch / 4, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 4}
	canvases := plot.Align([][]*plot.Plot{row}, tiles, dc)
	for i, p := range row {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// steadyRate is the hub's requests per second at rest without its Event
// writes.
func (r *result) steadyRate() float64 {
	return max(total(r.steady)-float64(r.steadyEvents), 0) / max(r.steadyWindow.Seconds(), 1e-3)
}

// memoryCell is the hub's RSS once Ready and at its peak, or a dash
// where the apply ended before they were read (the hub exited).
func memoryCell(r *result) string {
	if r.peak == 0 {
		return "–"
	}
	return fmt.Sprintf("%d MiB (%d MiB)", r.rss>>20, r.peak>>20)
}

// rssVerdict is the RSS goal's verdict on r: a run whose hub exited
// before its memory was read has none, and says so rather than "met".
func rssVerdict(r *result) string {
	if r.peak == 0 {
		return "not measured (the apply ended before the hub's memory was read; the log has its RSS every 30 s)"
	}
	return metOrMissed(r.peak <= goalRSS)
}

func metOrMissed(met bool) string {
	if met {
		return "met"
	}
	return "missed"
}

// profileNote names a heap profile's file; results loaded with -load have
// none.
func profileNote(path string) string {
	if path == "" {
		return ""
	}
	return " (profile " + path + ")"
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
