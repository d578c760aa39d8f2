// Package promscrape reads a process's Prometheus text endpoint for the
// benchmarks and tests: the hub's and the API server's counters
// (scalebench, the hub binary's tests), an operator's Go runtime memory
// (fleetbench).
package promscrape

import (
	"context"
	"fmt"
	"io"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Scrape reads the metric families a Prometheus text endpoint serves.
func Scrape(ctx context.Context, do func(*http.Request) (*http.Response, error), url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	var parser expfmt.TextParser
	return parser.TextToMetricFamilies(resp.Body)
}

// Gauge is the value of the unlabelled gauge name, or an error naming the
// endpoint's families it is missing from.
func Gauge(families map[string]*dto.MetricFamily, name string) (float64, error) {
	f := families[name]
	if f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetGauge() == nil {
		return 0, fmt.Errorf("no single gauge %s among the %d metric families served", name, len(families))
	}
	return f.GetMetric()[0].GetGauge().GetValue(), nil
}

// Label is the value of m's label name, or "".
func Label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// SumBy sums the counter name over its series by the value of one label;
// a family the endpoint does not serve sums to an empty map.
func SumBy(families map[string]*dto.MetricFamily, name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range families[name].GetMetric() {
		out[Label(m, label)] += m.GetCounter().GetValue()
	}
	return out
}
