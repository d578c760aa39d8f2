package monitoring_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The rule files and their promtool tests, and where the charts carry a
// copy of each (helm reads only files inside a chart; make manifests copies
// them).
var ruleFiles = []struct{ rules, tests, chartCopy string }{
	{"hub-alerts.yaml", "hub-alerts_test.yaml", "../charts/ctrlmesh-hub/files/monitoring/hub-alerts.yaml"},
	{"member-alerts.yaml", "member-alerts_test.yaml", "../charts/ctrlmesh-agent/files/monitoring/member-alerts.yaml"},
}

// findPromtool returns bin/promtool ($CTRLMESH_TEST_ASSETS/promtool when
// that is set, as make test sets it to bin/), or an error saying how to
// build it. A missing promtool fails the tests: never a skip.
func findPromtool() (string, error) {
	dir := os.Getenv(env.AssetsEnv)
	if dir == "" {
		dir = filepath.Join("..", "..", "bin")
	}
	path, err := filepath.Abs(filepath.Join(dir, "promtool"))
	if err != nil {
		return "", err
	}
	info, err := os.Stat(path)
	if err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("promtool not found at %s: run 'make tools' to build it from source (make test does this for you), or set %s to a directory that has it", path, env.AssetsEnv)
	}
	return path, nil
}

// TestAlertRules checks every rule file with promtool and runs its unit
// tests: series that fire each alert, and series that must not.
func TestAlertRules(t *testing.T) {
	promtool, err := findPromtool()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range ruleFiles {
		t.Run(f.rules, func(t *testing.T) {
			for _, args := range [][]string{{"check", "rules", "--lint=all", "--lint-fatal", f.rules}, {"test", "rules", f.tests}} {
				out, err := exec.Command(promtool, args...).CombinedOutput()
				if err != nil {
					t.Errorf("promtool %v: %v\n%s", args, err, out)
				}
			}
		})
	}
}

// TestAlertRulesHaveTests: every alert of a rule file is evaluated by its
// promtool test, both firing and not.
func TestAlertRulesHaveTests(t *testing.T) {
	for _, f := range ruleFiles {
		alerts := alertNames(t, f.rules)
		if len(alerts) == 0 {
			t.Fatalf("%s has no alerts", f.rules)
		}
		tested := testedAlerts(t, f.tests)
		for _, a := range alerts {
			switch got := tested[a]; {
			case !got.fires:
				t.Errorf("%s: %s has no promtool test case where it fires", f.tests, a)
			case !got.quiet:
				t.Errorf("%s: %s has no promtool test case where it must not fire", f.tests, a)
			}
		}
	}
}

// TestChartsCarryTheRules: the charts' copies are the rule files.
func TestChartsCarryTheRules(t *testing.T) {
	for _, f := range ruleFiles {
		want, err := os.ReadFile(f.rules)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f.chartCopy)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s: run 'make manifests'", f.chartCopy, f.rules)
		}
	}
}
