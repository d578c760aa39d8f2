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
	"hash/maphash"
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

	// seed and children find a series by its label values without
	// building its name: every request counts in one, and the name costs
	// allocations.
	seed     maphash.Seed
	mu       sync.RWMutex
	children map[uint64][]child
}

// child is one series: its label values, and its *vm.Counter or *vm.Gauge.
type child struct {
	values []string
	metric any
}

// get is the series of the label values given, made by create (from its
// name) the first time.
func (f *family) get(values []string, create func(set *vm.Set, name string) any) any {
	var h maphash.Hash
	h.SetSeed(f.seed)
	for _, v := range values {
		h.WriteString(v)
		h.WriteByte(0xff) // ("a", "bc") and ("ab", "c") hash apart; equality is checked below
	}
	sum := h.Sum64()
	f.mu.RLock()
	for _, c := range f.children[sum] {
		if slices.Equal(c.values, values) {
			f.mu.RUnlock()
			return c.metric
		}
	}
	f.mu.RUnlock()
	name := f.series(values)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.children[sum] {
		if slices.Equal(c.values, values) {
			return c.metric
		}
	}
	m := create(f.set, name)
	f.children[sum] = append(f.children[sum], child{values: slices.Clone(values), metric: m})
	return m
}

func newCounter(set *vm.Set, name string) any { return set.GetOrCreateCounter(name) }

func newGauge(set *vm.Set, name string) any { return set.GetOrCreateGauge(name, nil) }

func (r *Registry) add(name, help, kind string, labels []string) *family {
	f := &family{name: name, help: help, kind: kind, labels: labels, set: vm.NewSet(), seed: maphash.MakeSeed(), children: map[uint64][]child{}}
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
	return c.f.get(values, newCounter).(*vm.Counter)
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
	return g.f.get(values, newGauge).(*vm.Gauge)
}

// Reset removes every series of the gauge.
func (g *GaugeVec) Reset() {
	g.f.mu.Lock()
	defer g.f.mu.Unlock()
	g.f.set.UnregisterAllMetrics()
	clear(g.f.children)
}

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
