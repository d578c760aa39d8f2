package metrics

import (
	"bytes"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// parse reads what r writes with Prometheus' own text parser, so that what
// the proxy serves is what Prometheus scrapes.
func parse(t *testing.T, r *Registry) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	var text bytes.Buffer
	r.WritePrometheus(&text)
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(bytes.NewReader(text.Bytes()))
	if err != nil {
		t.Fatalf("Prometheus cannot parse the metrics: %v\n%s", err, text.String())
	}
	return text.String(), families
}

func TestWritePrometheus(t *testing.T) {
	r := NewRegistry()
	requests := r.NewCounterVec("x_requests_total", "Requests, by verb and outcome.", "verb", "outcome")
	requests.With("get", "passthrough").Inc()
	requests.With("get", "passthrough").Inc()
	requests.With("list", `a "quoted\" value`+"\nand a line").Add(3)
	r.NewCounter("x_fenced_total", "Writes refused.\nSecond line \\ of help.")
	info := r.NewGaugeVec("x_info", "The rules in force.", "hash", "generation")
	info.With("h1", "1").Set(1)
	inside := r.NewGauge("x_namespaces", "Namespaces inside.")
	inside.Set(2)
	r.NewCounterVec("x_unused_total", "A family without series.", "reason")

	text, families := parse(t, r)
	for _, want := range []string{
		"# HELP x_requests_total Requests, by verb and outcome.\n# TYPE x_requests_total counter\n",
		// Label names sorted, as Prometheus' client writes them.
		`x_requests_total{outcome="passthrough",verb="get"} 2` + "\n",
		`x_requests_total{outcome="a \"quoted\\\" value\nand a line",verb="list"} 3` + "\n",
		"# HELP x_fenced_total Writes refused.\\nSecond line \\\\ of help.\n# TYPE x_fenced_total counter\nx_fenced_total 0\n",
		"# TYPE x_info gauge\n" + `x_info{generation="1",hash="h1"} 1` + "\n",
		"# TYPE x_namespaces gauge\nx_namespaces 2\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in\n%s", want, text)
		}
	}
	if strings.Contains(text, "x_unused_total") {
		t.Errorf("a family without series is written (Prometheus' client leaves it out):\n%s", text)
	}
	if got := families["x_requests_total"]; got.GetType() != dto.MetricType_COUNTER || len(got.GetMetric()) != 2 {
		t.Errorf("x_requests_total parsed as %v", got)
	}
	for _, m := range families["x_requests_total"].GetMetric() {
		if m.GetLabel()[1].GetValue() == "list" && m.GetLabel()[0].GetValue() != `a "quoted\" value`+"\nand a line" {
			t.Errorf("the escaped label value reads back as %q", m.GetLabel()[0].GetValue())
		}
	}
	if got := families["x_fenced_total"].GetHelp(); got != "Writes refused.\nSecond line \\ of help." {
		t.Errorf("the help reads back as %q", got)
	}
	// The runtime's and the process's own, which the footprint test and
	// dashboards read.
	for _, name := range []string{"go_memstats_heap_inuse_bytes", "process_resident_memory_bytes", "process_open_fds", "go_goroutines"} {
		if families[name] == nil {
			t.Errorf("no %s in\n%s", name, text)
		}
	}

	info.Reset()
	info.With("h2", "2").Set(1)
	text, _ = parse(t, r)
	if !strings.Contains(text, `x_info{generation="2",hash="h2"} 1`) || strings.Contains(text, `hash="h1"`) {
		t.Errorf("after Reset, the gauge's old series is still written or the new one is not:\n%s", text)
	}

	if got, want := r.Names(), []string{"x_fenced_total", "x_info", "x_namespaces", "x_requests_total", "x_unused_total"}; !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}

	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); expfmt.ResponseFormat(rec.Header()) != expfmt.NewFormat(expfmt.TypeTextPlain) {
		t.Errorf("Content-Type %q is not Prometheus' text format", ct)
	}
	if !strings.Contains(rec.Body.String(), "x_namespaces 2\n") {
		t.Errorf("ServeHTTP wrote\n%s", rec.Body.String())
	}
}

// TestConcurrentCounting: requests counted at once, in one series and in
// series made at the same time, are each counted once.
func TestConcurrentCounting(t *testing.T) {
	v := NewRegistry().NewCounterVec("x_total", "X.", "verb", "outcome")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				v.With("get", "passthrough").Inc()
				v.With("list", strconv.Itoa(i%10)).Inc()
				v.With("watch", strconv.Itoa(g)).Inc()
			}
		}()
	}
	wg.Wait()
	if got := v.With("get", "passthrough").Get(); got != 8000 {
		t.Errorf("get/passthrough counted %d, want 8000", got)
	}
	for i := range 10 {
		if got := v.With("list", strconv.Itoa(i)).Get(); got != 800 {
			t.Errorf("list/%d counted %d, want 800", i, got)
		}
	}
	// Values that join alike are other series.
	v.With("a", "bc").Inc()
	if got := v.With("ab", "c").Get(); got != 0 {
		t.Errorf(`("ab", "c") counted %d, the count of ("a", "bc")`, got)
	}
}

func TestRegisteredTwice(t *testing.T) {
	r := NewRegistry()
	r.NewCounter("x_total", "X.")
	defer func() {
		if recover() == nil {
			t.Error("a second x_total was registered")
		}
	}()
	r.NewGauge("x_total", "X again.")
}

func TestWrongLabelCount(t *testing.T) {
	v := NewRegistry().NewCounterVec("x_total", "X.", "a", "b")
	defer func() {
		if recover() == nil {
			t.Error("a series with one value for two labels was made")
		}
	}()
	v.With("only-one")
}

// BenchmarkCounterWith is the cost of counting one request by its labels,
// as the proxy does for every request.
func BenchmarkCounterWith(b *testing.B) {
	v := NewRegistry().NewCounterVec("x_requests_total", "X.", "verb", "outcome")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			v.With("get", "passthrough").Inc()
		}
	})
}
