package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/test/promscrape"
)

// apiTraffic is the API server's own count of what it served, by resource,
// from its /metrics: the hub's client counts requests by method only, and
// a write's cost depends on what it writes (a Work of a few KB or a
// ShardingConfig status listing every shard in every member) and on how
// many watchers receive it.
type apiTraffic struct {
	// writes are mutating requests by "resource[/subresource] VERB",
	// every code; conflicts those answered 409.
	writes, conflicts map[string]float64
	// bodyBytes are the bytes of request bodies by "resource verb"
	// (apiserver_request_body_size_bytes, which has no subresource).
	bodyBytes map[string]float64
	// watchBytes are the bytes of watch events sent, by resource.
	watchBytes map[string]float64
}

// scrapeAPITraffic reads the API server's counters so far, as cfg's user
// (the benchmark's admin).
func scrapeAPITraffic(ctx context.Context, cfg *rest.Config) (*apiTraffic, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	families, err := promscrape.Scrape(ctx, hc.Do, strings.TrimSuffix(cfg.Host, "/")+"/metrics")
	if err != nil {
		return nil, fmt.Errorf("the API server's metrics: %w", err)
	}
	t := &apiTraffic{writes: map[string]float64{}, conflicts: map[string]float64{}, bodyBytes: map[string]float64{}, watchBytes: map[string]float64{}}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		verb := promscrape.Label(m, "verb")
		switch verb {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		default:
			continue
		}
		key := promscrape.Label(m, "resource")
		if sub := promscrape.Label(m, "subresource"); sub != "" {
			key += "/" + sub
		}
		key += " " + verb
		t.writes[key] += m.GetCounter().GetValue()
		if promscrape.Label(m, "code") == "409" {
			t.conflicts[key] += m.GetCounter().GetValue()
		}
	}
	for _, m := range families["apiserver_request_body_size_bytes"].GetMetric() {
		t.bodyBytes[promscrape.Label(m, "resource")+" "+promscrape.Label(m, "verb")] += m.GetHistogram().GetSampleSum()
	}
	for _, m := range families["apiserver_watch_events_sizes"].GetMetric() {
		t.watchBytes[promscrape.Label(m, "resource")] += m.GetHistogram().GetSampleSum()
	}
	return t, nil
}

// since is t less the counters of before.
func (t *apiTraffic) since(before *apiTraffic) *apiTraffic {
	return &apiTraffic{
		writes: diff(t.writes, before.writes), conflicts: diff(t.conflicts, before.conflicts),
		bodyBytes: diff(t.bodyBytes, before.bodyBytes), watchBytes: diff(t.watchBytes, before.watchBytes),
	}
}

// summary names the heaviest entries: writes by count, request and watch
// bytes by size, n of each.
func (t *apiTraffic) summary(n int) string {
	if t == nil {
		return "not measured"
	}
	top := func(m map[string]float64, format func(k string, v float64) string) string {
		// The largest first; equal ones by name.
		keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), strings.Compare(a, b)) })
		var parts []string
		for _, k := range keys[:min(n, len(keys))] {
			parts = append(parts, format(k, m[k]))
		}
		return strings.Join(parts, ", ")
	}
	return fmt.Sprintf("writes %s; request bodies %s; watch events sent %s",
		top(t.writes, func(k string, v float64) string {
			if c := t.conflicts[k]; c > 0 {
				return fmt.Sprintf("%s %.0f (%.0f conflicts)", k, v, c)
			}
			return fmt.Sprintf("%s %.0f", k, v)
		}),
		top(t.bodyBytes, func(k string, v float64) string { return fmt.Sprintf("%s %.1f MB", k, v/1e6) }),
		top(t.watchBytes, func(k string, v float64) string { return fmt.Sprintf("%s %.1f MB", k, v/1e6) }))
}
