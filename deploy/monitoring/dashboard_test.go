package monitoring_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	"github.com/ctrlmesh/ctrlmesh/hub/shardingconfig"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/proxy/webhook"
)

const dashboardFile = "ctrlmesh-dashboard.json"

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Title  string  `json:"title"`
	UID    string  `json:"uid"`
	Panels []panel `json:"panels"`
	// Templating variables' queries name metrics too.
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// expressions are the PromQL expressions of every panel, by panel title.
func (d dashboard) expressions() map[string][]string {
	out := map[string][]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out[p.Title] = append(out[p.Title], tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// exportedMetrics are the metric names the ctrlmesh binaries export, read
// from the descriptors of the collectors their own constructors register:
// the hub's (shardingconfig.NewMetrics on its registry), each proxy's
// (proxy.NewMetrics, its webhook router) and each agent's labeler.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	hub := prometheus.NewRegistry()
	if _, err := shardingconfig.NewMetrics(hub); err != nil {
		t.Fatal(err)
	}
	px := proxy.NewMetrics()
	if _, err := webhook.New(webhook.Options{Rules: func() (*rules.Snapshot, string) { return nil, "" }, Registry: px.Registry}); err != nil {
		t.Fatal(err)
	}
	agent := prometheus.NewRegistry()
	client, err := dynamic.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := labeler.New(labeler.Options{
		Targets:    labeler.Targets{Resources: []schema.GroupVersionResource{{Version: "v1", Resource: "configmaps"}}, Space: sharding.MustSpace(32)},
		Client:     client,
		Registerer: agent,
	}); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, name := range px.Registry.Names() {
		names[name] = true
	}
	for _, reg := range []*prometheus.Registry{hub, agent} {
		ch := make(chan *prometheus.Desc)
		go func() { reg.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no fqName in descriptor %s", d)
			}
			names[m[1]] = true
		}
	}
	return names
}

// promqlWord is a PromQL identifier; strings, label matchers, ranges,
// groupings, numbers and durations are cut out before looking for them.
var (
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlNumber   = regexp.MustCompile(`\b[0-9][0-9a-zA-Z_.]*`)
	promqlWord     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promqlKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan"}
)

// metricNames are the metric names an expression selects.
func metricNames(expr string) []string {
	s := promqlString.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlRange.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	s = promqlNumber.ReplaceAllString(s, " ")
	var names []string
	for _, w := range promqlWord.FindAllString(s, -1) {
		if strings.HasSuffix(strings.TrimSpace(w), "(") || slices.Contains(promqlKeywords, strings.ToLower(w)) {
			// A function or aggregation, or a keyword.
			continue
		}
		names = append(names, w)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (namespace, pod) (rate(ctrlmesh_proxy_fenced_writes_total{namespace=~"$namespace"}[5m])) > 0.05`: {"ctrlmesh_proxy_fenced_writes_total"},
		`histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket[$__range])))`:                               {"a_seconds_bucket"},
		`max by (x) (a) - on (x) group_left (y) b{z="by (q)"} / ignoring (k) c offset 5m`:                        {"a", "b", "c"},
		`label_values(ctrlmesh_hub_clusters_selected{namespace=~"$namespace"}, name)`:                            {"ctrlmesh_hub_clusters_selected", "name"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%s) = %v, want %v", expr, got, want)
		}
	}
}

// TestDashboardMetricsExported: every metric a panel's query names is one
// the binaries export (a histogram's _bucket, _sum and _count series by
// the histogram's name).
func TestDashboardMetricsExported(t *testing.T) {
	d := readDashboard(t)
	exported := exportedMetrics(t)
	exprs := d.expressions()
	if len(exprs) < 10 {
		t.Fatalf("%s has queries in %d panels; the dashboard lost its panels", dashboardFile, len(exprs))
	}
	used := map[string]bool{}
	for title, list := range exprs {
		for _, expr := range list {
			names := metricNames(expr)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no metric", title, expr)
			}
			for _, n := range names {
				base := n
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && exported[b] {
						base = b
					}
				}
				if !exported[base] {
					t.Errorf("panel %q: query %q names %s, which no ctrlmesh binary exports", title, expr, n)
				}
				used[base] = true
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition == "" {
			continue
		}
		// label_values(metric{...}, label): the first argument's metric.
		if names := metricNames(v.Definition); len(names) == 0 || !exported[names[0]] {
			t.Errorf("variable %s: %q names no exported metric", v.Name, v.Definition)
		}
	}
	// The dashboard covers what the issue asks: placement and readiness,
	// request outcomes, relists, handover and failover times.
	for _, m := range []string{"ctrlmesh_hub_shards", "ctrlmesh_hub_unserved_buckets", "ctrlmesh_proxy_requests_total",
		"ctrlmesh_proxy_relists_forced_total", "ctrlmesh_hub_handover_duration_seconds", "ctrlmesh_hub_unserved_duration_seconds"} {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
}

// TestDashboardQueriesParse hands every query, with Grafana's variables
// replaced, to promtool as a recording rule: Prometheus' own parser.
func TestDashboardQueriesParse(t *testing.T) {
	promtool, err := findPromtool()
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$namespace", ".*", "$config", ".*")
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rs []rule
	for _, list := range readDashboard(t).expressions() {
		for _, expr := range list {
			rs = append(rs, rule{Record: fmt.Sprintf("dashboard:query_%d", len(rs)), Expr: vars.Replace(expr)})
		}
	}
	data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rs}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}

// TestChartCarriesTheDashboard: the hub chart's copy is the dashboard.
func TestChartCarriesTheDashboard(t *testing.T) {
	want, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../charts/ctrlmesh-hub/files/monitoring/" + dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the hub chart's copy of %s differs: run 'make manifests'", dashboardFile)
	}
}
