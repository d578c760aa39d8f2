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
	"gonum.org/v1/plot/plotutil"
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
			fmt.Sprintf("%.0f (%.0f/s): %s", total(r.requests), r.applyRate(), methods(r.requests))}
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

// plotCurves draws three panels over the members' count, one curve for
// each count of configs (10 configs at 10, 100 and 1000 members is one
// curve, 100 configs another), so that a reader sees how each cost grows
// with the members and with the configs: apply to every config Ready, the
// hub's RSS at its peak, and its requests a second during the apply. The
// goals of issue 17 are drawn as dashed lines where they apply.
func plotCurves(path string, results []*result) error {
	type panel struct {
		title, y string
		value    func(*result) float64
		goal     float64
		// log draws the values on a log scale, from 1 up: apply to Ready
		// spans 3 s to an hour over the scales measured.
		log bool
	}
	panels := []panel{
		{"apply → all Ready", "seconds", func(r *result) float64 { return r.ready.Seconds() }, goalReady.Seconds(), true},
		{"hub memory (RSS at the peak)", "MiB", func(r *result) float64 { return float64(r.peak >> 20) }, goalRSS >> 20, false},
		{"hub API requests", "per second during apply", (*result).applyRate, 0, false},
	}
	groups := curves(results)
	row := make([]*plot.Plot, len(panels))
	for i, s := range panels {
		p := plot.New()
		p.Title.Text = s.title
		p.X.Label.Text = "member clusters"
		p.Y.Label.Text = s.y
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		p.Legend.Top, p.Legend.Left = true, true
		p.Add(plotter.NewGrid())
		minX, maxX, maxY := 0.0, 0.0, s.goal
		for n, g := range groups {
			var pts plotter.XYs
			var labels []string
			for _, r := range g.results {
				x := float64(r.clusters)
				if minX == 0 || x < minX {
					minX = x
				}
				maxX = max(maxX, x)
				y := s.value(r)
				if s.log {
					// A log scale has no place for 0 (a run whose hub
					// exited before it measured anything).
					y = max(y, 1)
				}
				maxY = max(maxY, y)
				pts = append(pts, plotter.XY{X: x, Y: y})
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
			line.Color = plotutil.Color(n)
			points.Color, points.Shape = plotutil.Color(n), draw.CircleGlyph{}
			lbls, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: labels})
			if err != nil {
				return err
			}
			if n%2 == 0 {
				// Every other curve labelled below its points, so that
				// two curves' labels at one member count do not overlap.
				lbls.Offset = vg.Point{X: vg.Points(3), Y: -vg.Points(12)}
			}
			p.Add(line, points, lbls)
			p.Legend.Add(fmt.Sprintf("%d configs", g.configs), line, points)
		}
		if s.goal > 0 && maxX > 0 {
			goal, err := plotter.NewLine(plotter.XYs{{X: minX, Y: s.goal}, {X: maxX, Y: s.goal}})
			if err != nil {
				return err
			}
			goal.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			p.Add(goal)
			p.Legend.Add(fmt.Sprintf("goal at %d×%d", goalScale.clusters, goalScale.configs), goal)
		}
		// Room on the right for the last run's label, and above the curves
		// for the legend.
		p.X.Max = maxX * 3
		if s.log {
			p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
			p.Y.Min, p.Y.Max = 1, maxY*20
		} else {
			p.Y.Min, p.Y.Max = 0, maxY*1.4
		}
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

// curve is the results of one count of configs, by members.
type curve struct {
	configs int
	results []*result
}

// curves groups results by their count of configs, fewest configs first,
// each curve ordered by members.
func curves(results []*result) []curve {
	var out []curve
	for _, r := range results {
		i := slices.IndexFunc(out, func(c curve) bool { return c.configs == r.configs })
		if i < 0 {
			out = append(out, curve{configs: r.configs})
			i = len(out) - 1
		}
		out[i].results = append(out[i].results, r)
	}
	slices.SortFunc(out, func(a, b curve) int { return a.configs - b.configs })
	for _, c := range out {
		slices.SortStableFunc(c.results, func(a, b *result) int { return a.clusters - b.clusters })
	}
	return out
}

// applyRate is the hub's requests per second from the apply to every
// config Ready.
func (r *result) applyRate() float64 {
	return total(r.requests) / max(r.ready.Seconds(), 1e-3)
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
