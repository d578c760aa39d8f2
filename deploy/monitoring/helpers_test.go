package monitoring_test

import (
	"os"
	"testing"

	"sigs.k8s.io/yaml"
)

// alertNames are the alerts of a Prometheus rule file.
func alertNames(t *testing.T, path string) []string {
	t.Helper()
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	readYAML(t, path, &file)
	var names []string
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				names = append(names, r.Alert)
			}
		}
	}
	return names
}

// coverage is whether a promtool test file has a case where an alert
// fires and one where it must not.
type coverage struct{ fires, quiet bool }

// testedAlerts reads the alert_rule_test cases of a promtool test file.
func testedAlerts(t *testing.T, path string) map[string]coverage {
	t.Helper()
	var file struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	readYAML(t, path, &file)
	out := map[string]coverage{}
	for _, tc := range file.Tests {
		for _, a := range tc.AlertRuleTest {
			c := out[a.Alertname]
			if len(a.ExpAlerts) > 0 {
				c.fires = true
			} else {
				c.quiet = true
			}
			out[a.Alertname] = c
		}
	}
	return out
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
