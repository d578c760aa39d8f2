package main

import (
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
