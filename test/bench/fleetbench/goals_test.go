package main

import (
	"strings"
	"testing"
)

// TestMemoryGoals: private memory is judged on every workload, RSS only on
// the heavy one, and every loaded pod's sidecar against its bound.
func TestMemoryGoals(t *testing.T) {
	pod := func(name string, anon, rss, proxy int64) podMemory {
		return podMemory{pod: name, operator: procMemory{anon: anon << 20, rss: rss << 20}, proxy: procMemory{rss: proxy << 20}}
	}
	sharded := []podMemory{pod("op-0", 10, 40, 21), pod("op-1", 40, 70, 30)}
	for _, tt := range []struct {
		name             string
		objects, payload int
		want             []string
	}{
		{name: "standard workload", objects: 20000, payload: 256, want: []string{
			"private memory (RssAnon) op-0 / single pod|<= 0.30x|0.10x|PASS",
			"private memory (RssAnon) op-1 / single pod|<= 0.30x|0.40x|MISS",
			"sidecar RSS beside single|<= 25.0 MiB|22.0 MiB|PASS",
			"sidecar RSS beside op-0|<= 25.0 MiB|21.0 MiB|PASS",
			"sidecar RSS beside op-1|<= 25.0 MiB|30.0 MiB|MISS",
		}},
		{name: "heavy workload", objects: 50000, payload: 1024, want: []string{
			"private memory (RssAnon) op-0 / single pod|<= 0.30x|0.10x|PASS",
			"memory (RSS) op-0 / single pod, 50000 objects of 1024 B|<= 0.35x|0.20x|PASS",
			"private memory (RssAnon) op-1 / single pod|<= 0.30x|0.40x|MISS",
			"memory (RSS) op-1 / single pod, 50000 objects of 1024 B|<= 0.35x|0.35x|PASS",
			"sidecar RSS beside single|<= 25.0 MiB|22.0 MiB|PASS",
			"sidecar RSS beside op-0|<= 25.0 MiB|21.0 MiB|PASS",
			"sidecar RSS beside op-1|<= 25.0 MiB|30.0 MiB|MISS",
		}},
	} {
		m := &memoryResult{objects: tt.objects, payload: tt.payload, single: pod("single", 100, 200, 22), sharded: sharded}
		var got []string
		for _, g := range memoryGoals(m) {
			got = append(got, strings.Join(g, "|"))
		}
		if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
			t.Errorf("%s:\n%s\nwant\n%s", tt.name, strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
		}
	}
}
