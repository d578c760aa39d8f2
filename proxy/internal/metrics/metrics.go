// Package metrics is the proxy's Prometheus endpoint: counters and gauges
// by label, each family written in the Prometheus text format under its
// HELP and TYPE lines, then the Go runtime's and the process's own
// metrics. The series themselves are VictoriaMetrics' metrics package's.
//
// It is not Prometheus' client_golang, which the hub and the agent use:
// that links Google's protobuf runtime, the Prometheus data model, procfs
// and (through its collectors) database/sql — 4.6 MB of the sidecar's 19.5
// MB binary, nearly all of it resident in every operator pod (the kernel
// maps the executable's pages around each one touched) — for an endpoint
// that only ever writes text.
package metrics

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	vm "github.com/VictoriaMetrics/metrics"
)

// Registry is one proxy's metrics (no process-wide globals, so that
// proxies in one test process keep theirs apart).
type Registry struct {
	mu       sync.Mutex
	families map[string]*family
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{families: map[string]*family{}}
}

// family is one metric: its name, help, type and label names, and its
// series, in a VictoriaMetrics Set of its own so that HELP and TYPE are
// written once above them.
type family struct {
	name, help, kind string
	// labels are the label names in the order values are given; order
	// sorts them by name, as Prometheus writes them.
	labels []string
	order  []int
	set    *vm.Set
}

func (r *Registry) add(name, help, kind string, labels []string) *family {
	f := &family{name: name, help: help, kind: kind, labels: labels, set: vm.NewSet()}
	for i := range labels {
		f.order = append(f.order, i)
	}
	slices.SortFunc(f.order, func(a, b int) int { return strings.Compare(labels[a], labels[b]) })
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.families[name]; dup {
		panic(fmt.Sprintf("metric %s registered twice", name))
	}
	r.families[name] = f
	return f
}

// series is the name of the series with the label values given, in the
// order of f.labels: name{a="x",b="y"}, label names sorted, values escaped
// as the text format needs.
func (f *family) series(values []string) string {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("metric %s has labels %v, given %d values", f.name, f.labels, len(values)))
	}
	if len(values) == 0 {
		return f.name
	}
	var b strings.Builder
	b.WriteString(f.name)
	b.WriteByte('{')
	for n, i := range f.order {
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(f.labels[i])
		b.WriteString(`="`)
		labelValueEscaper.WriteString(&b, values[i])
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

var labelValueEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

func (f *family) write(w io.Writer) {
	if len(f.set.ListMetricNames()) == 0 {
		return // as Prometheus writes a family without series: not at all
	}
	_, _ = fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", f.name, helpEscaper.Replace(f.help), f.name, f.kind)
	f.set.WritePrometheus(w)
}

// CounterVec is a counter by label values.
type CounterVec struct{ f *family }

// NewCounterVec registers a counter with the label names given.
func (r *Registry) NewCounterVec(name, help string, labels ...string) *CounterVec {
	return &CounterVec{r.add(name, help, "counter", labels)}
}

// With is the counter of the label values given, in the order of the
// label names; created at 0 the first time.
func (c *CounterVec) With(values ...string) *vm.Counter {
	return c.f.set.GetOrCreateCounter(c.f.series(values))
}

// NewCounter registers a counter without labels, at 0.
func (r *Registry) NewCounter(name, help string) *vm.Counter {
	return r.NewCounterVec(name, help).With()
}

// GaugeVec is a gauge by label values.
type GaugeVec struct{ f *family }

// NewGaugeVec registers a gauge with the label names given.
func (r *Registry) NewGaugeVec(name, help string, labels ...string) *GaugeVec {
	return &GaugeVec{r.add(name, help, "gauge", labels)}
}

// With is the gauge of the label values given, in the order of the label
// names; created at 0 the first time.
func (g *GaugeVec) With(values ...string) *vm.Gauge {
	return g.f.set.GetOrCreateGauge(g.f.series(values), nil)
}

// Reset removes every series of the gauge.
func (g *GaugeVec) Reset() { g.f.set.UnregisterAllMetrics() }

// NewGauge registers a gauge without labels, at 0.
func (r *Registry) NewGauge(name, help string) *vm.Gauge {
	return r.NewGaugeVec(name, help).With()
}

// WritePrometheus writes every family, by name, then the Go runtime's
// metrics (go_*: memory, GC, goroutines) and the process's (process_*:
// CPU, resident memory, file descriptors).
func (r *Registry) WritePrometheus(w io.Writer) {
	r.mu.Lock()
	families := make([]*family, 0, len(r.families))
	for _, f := range r.families {
		families = append(families, f)
	}
	r.mu.Unlock()
	slices.SortFunc(families, func(a, b *family) int { return strings.Compare(a.name, b.name) })
	for _, f := range families {
		f.write(w)
	}
	vm.WriteProcessMetrics(w)
	vm.WriteFDMetrics(w)
}

// Names are the names of the families registered, series or not, sorted.
func (r *Registry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.families))
	for name := range r.families {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// ServeHTTP serves the metrics in the Prometheus text format.
func (r *Registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	r.WritePrometheus(w)
}
