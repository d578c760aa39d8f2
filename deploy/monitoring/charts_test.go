package monitoring_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// render renders a chart with helm (bin/helm, built by make
// tools) and returns the objects of one of its templates.
func render(t *testing.T, chart, template string, set ...string) []map[string]any {
	t.Helper()
	dir := os.Getenv(env.AssetsEnv)
	if dir == "" {
		dir = filepath.Join("..", "..", "bin")
	}
	helm, err := filepath.Abs(filepath.Join(dir, "helm"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("helm not found at %s: run 'make tools' to build it from source (make test does this for you), or set %s", helm, env.AssetsEnv)
	}
	home := t.TempDir()
	args := []string{"template", "x", filepath.Join("..", "charts", chart), "-n", "ctrlmesh"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm, args...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %v: %v\n%s", args, err, stderr.String())
	}
	var objs []map[string]any
	for _, doc := range strings.Split(string(out), "\n---\n") {
		// helm -s refuses a template that renders nothing; the objects
		// of the template are those under its "# Source:" comment.
		if !strings.Contains(doc, "# Source: "+chart+"/"+template+"\n") {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("rendered %s: %v", template, err)
		}
		if obj != nil {
			objs = append(objs, obj)
		}
	}
	return objs
}

// TestChartsRenderMonitoring: off by default; when on, the PrometheusRules
// hold the rule files' groups and the ConfigMap the dashboard, labelled for
// Grafana's sidecar.
func TestChartsRenderMonitoring(t *testing.T) {
	for _, c := range []struct{ chart, rules string }{{"ctrlmesh-hub", "hub-alerts.yaml"}, {"ctrlmesh-agent", "member-alerts.yaml"}} {
		base := []string{"clusterName=member1"}
		if objs := render(t, c.chart, "templates/monitoring.yaml", base...); len(objs) != 0 {
			t.Errorf("%s renders %d monitoring objects by default, want none", c.chart, len(objs))
		}
		objs := render(t, c.chart, "templates/monitoring.yaml", append(base, "monitoring.prometheusRule.enabled=true", "monitoring.prometheusRule.labels.release=kps")...)
		if len(objs) != 1 || objs[0]["kind"] != "PrometheusRule" {
			t.Fatalf("%s with monitoring.prometheusRule.enabled renders %v, want one PrometheusRule", c.chart, objs)
		}
		var want map[string]any
		readYAML(t, c.rules, &want)
		if got := objs[0]["spec"]; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the PrometheusRule's spec is not %s:\n%v", c.chart, c.rules, got)
		}
		if l := objs[0]["metadata"].(map[string]any)["labels"].(map[string]any)["release"]; l != "kps" {
			t.Errorf("%s: the PrometheusRule lacks the label of monitoring.prometheusRule.labels", c.chart)
		}
	}
	objs := render(t, "ctrlmesh-hub", "templates/monitoring.yaml", "monitoring.dashboard.enabled=true")
	if len(objs) != 1 || objs[0]["kind"] != "ConfigMap" {
		t.Fatalf("monitoring.dashboard.enabled renders %v, want one ConfigMap", objs)
	}
	if l := objs[0]["metadata"].(map[string]any)["labels"].(map[string]any)["grafana_dashboard"]; l != "1" {
		t.Errorf("the dashboard ConfigMap's grafana_dashboard label is %v, want \"1\"", l)
	}
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	got := objs[0]["data"].(map[string]any)["ctrlmesh.json"].(string)
	if !json.Valid([]byte(got)) || strings.TrimSpace(got) != strings.TrimSpace(string(data)) {
		t.Errorf("the dashboard ConfigMap does not hold %s", dashboardFile)
	}
	// The target=karmada release runs no pods: nothing to scrape there.
	if objs := render(t, "ctrlmesh-hub", "templates/monitoring.yaml", "target=karmada", "monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true"); len(objs) != 0 {
		t.Errorf("target=karmada renders %d monitoring objects, want none", len(objs))
	}
}
