package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestReportRSSVerdict checks the RSS goal's verdict: a run whose hub
// exited during the apply read no memory, and the report must not call
// the goal met on it.
func TestReportRSSVerdict(t *testing.T) {
	opts := options{pods: 4, proxyDelay: 200 * time.Millisecond, renew: time.Minute, lease: 2 * time.Minute}
	for _, tc := range []struct {
		name       string
		r          result
		want, cell string
	}{
		{name: "the hub exited during the apply", r: result{scale: scale{1000, 100}, ready: 15 * time.Minute},
			want: "hub RSS within 1024 MiB: not measured", cell: "| 0.0 s | – |"},
		{name: "within the goal", r: result{scale: scale{1000, 20}, readyDone: true, ready: 13 * time.Minute, rss: 700 << 20, peak: 936 << 20},
			want: "hub RSS within 1024 MiB: met", cell: "| 700 MiB (936 MiB) |"},
		{name: "past the goal", r: result{scale: scale{1000, 20}, readyDone: true, ready: 13 * time.Minute, rss: 700 << 20, peak: 1026 << 20},
			want: "hub RSS within 1024 MiB: missed", cell: "| 700 MiB (1026 MiB) |"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			report(&out, []*result{&tc.r}, opts)
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("the report does not say %q:\n%s", tc.want, out.String())
			}
			if !strings.Contains(out.String(), tc.cell) {
				t.Errorf("the report's row has no %q:\n%s", tc.cell, out.String())
			}
		})
	}
}

// TestCurves checks that the plot draws one curve for each count of
// configs, each ordered by members, whatever order the runs came in.
func TestCurves(t *testing.T) {
	run := func(clusters, configs int) *result { return &result{scale: scale{clusters, configs}} }
	for _, tc := range []struct {
		name    string
		results []*result
		want    map[int][]int // configs: members in order
		order   []int         // configs, curve by curve
	}{
		{name: "none", want: map[int][]int{}},
		{name: "one run", results: []*result{run(10, 10)}, want: map[int][]int{10: {10}}, order: []int{10}},
		{name: "two curves, runs out of order",
			results: []*result{run(1000, 100), run(100, 10), run(10, 100), run(1000, 10), run(10, 10), run(100, 100)},
			want:    map[int][]int{10: {10, 100, 1000}, 100: {10, 100, 1000}}, order: []int{10, 100}},
		{name: "configs grow alone", results: []*result{run(10, 1000), run(10, 100), run(10, 10)},
			want: map[int][]int{10: {10}, 100: {10}, 1000: {10}}, order: []int{10, 100, 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := curves(tc.results)
			var order []int
			for _, c := range got {
				order = append(order, c.configs)
				var members []int
				for _, r := range c.results {
					if r.configs != c.configs {
						t.Errorf("the curve of %d configs holds a run of %d", c.configs, r.configs)
					}
					members = append(members, r.clusters)
				}
				if !slices.Equal(members, tc.want[c.configs]) {
					t.Errorf("the curve of %d configs has members %v, want %v", c.configs, members, tc.want[c.configs])
				}
			}
			if !slices.Equal(order, tc.order) {
				t.Errorf("curves in the order %v, want %v", order, tc.order)
			}
		})
	}
}

// TestPlotCurves checks that the plot names each curve and the goals in
// its legend and marks runs that did not reach Ready.
func TestPlotCurves(t *testing.T) {
	results := []*result{
		{scale: scale{10, 10}, readyDone: true, ready: 30 * time.Second, peak: 60 << 20, requests: map[string]float64{"POST": 100}},
		{scale: scale{100, 10}, readyDone: true, ready: 2 * time.Minute, peak: 120 << 20, requests: map[string]float64{"POST": 1000}},
		{scale: scale{1000, 100}, ready: 75 * time.Minute, peak: 1100 << 20, requests: map[string]float64{"POST": 100000}},
		// The hub exited before anything was measured: nothing to draw on
		// a log scale, which must not fail the plot.
		{scale: scale{1000, 10}},
	}
	path := filepath.Join(t.TempDir(), "scale.svg")
	if err := plotCurves(path, results); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"10 configs", "100 configs", "goal at 1000×100", "1000×100 (not Ready)", "100×10"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("the plot does not show %q", want)
		}
	}
}
