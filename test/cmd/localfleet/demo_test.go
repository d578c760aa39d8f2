package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// demoBinDir builds ctrlmesh-proxy and demo-operator from this checkout into
// a temporary directory, next to links to kube-apiserver, etcd and Karmada's
// components: make test builds those (make tools) but not the ctrlmesh
// binaries, and bin/ may hold stale ones.
func demoBinDir(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	assets := os.Getenv(env.AssetsEnv)
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	tools := []string{"kube-apiserver", "etcd", controlplane.KarmadaAggregatedAPIServerBinary, controlplane.KarmadaControllerManagerBinary, controlplane.KarmadaAgentBinary}
	if err := controlplane.CheckBinaries(assets, "run 'make tools'", tools...); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range tools {
		if err := os.Symlink(filepath.Join(assets, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/ctrlmesh-proxy", "./scenarios/demo-operator")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the demo's binaries: %v\n%s", err, out)
	}
	return dir
}

// TestDemo runs localfleet demo end to end, standalone and with --karmada
// (member1 joined to Karmada push, member2 pull): the placement Ready, both
// canary steps, and a killed pod's buckets moved to the other pod; with
// --karmada each member's sync mode beside every placement.
func TestDemo(t *testing.T) {
	binDir := demoBinDir(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{name: "standalone"},
		{name: "karmada", args: []string{"--karmada"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			karmada := len(tc.args) > 0
			var out bytes.Buffer
			cmd := newRootCommand()
			cmd.SetArgs(append([]string{"demo", "--bin-dir", binDir}, tc.args...))
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			err := cmd.Execute()
			t.Logf("output:\n%s", out.String())
			if err != nil {
				t.Fatal(err)
			}
			text := out.String()
			sections := map[string]string{}
			for _, what := range []string{"Ready", "Ready at canary step 1", "Ready at canary step 2", "healed"} {
				section, ok := sectionAfter(text, what+":")
				if !ok {
					t.Fatalf("no table after %q", what)
				}
				sections[what] = section
			}
			for what, want := range map[string][]string{
				// Which pod gets which shard depends on which proxy reports first:
				// a pod is placed only once its proxy has.
				"Ready": {
					`0\s+member1\s+demo-operator-[01]\s+demo-operator-[01]\s+0-15\s`, `1\s+member1\s+demo-operator-[01]\s+demo-operator-[01]\s+16-31\s`,
					`0\s+member2\s+demo-operator-[01]\s+demo-operator-[01]\s+0-15\s`, `1\s+member2\s+demo-operator-[01]\s+demo-operator-[01]\s+16-31\s`,
				},
				"Ready at canary step 1": {`canary\s+member1\s+demo-operator-canary\s+demo-operator-canary\s+-\s+team-a\s+yes\s+Serving\s+Healthy`},
				"Ready at canary step 2": {`canary\s+member1\s+demo-operator-canary\s+demo-operator-canary\s+0-3\s+team-a\s+yes\s+Serving\s+Healthy`},
				"healed":                 {`[01]\s+member2\s+demo-operator-1\s+demo-operator-1\s+0-31\s+-\s+-\s+Serving\s+Healthy`},
			} {
				for _, pattern := range want {
					if !regexp.MustCompile(pattern).MatchString(sections[what]) {
						t.Errorf("the table after %q has no line matching %q", what, pattern)
					}
				}
			}
			if regexp.MustCompile(`\smember2\s+demo-operator-0\s`).MatchString(sections["healed"]) {
				t.Error("the killed pod is still placed after healing")
			}
			// Each member's sync mode, as Karmada's Cluster has it, beside
			// every placement; none without Karmada.
			for what, section := range sections {
				for _, pattern := range []string{`(?m)^member1\s+Push\s+karmada-controller-manager$`, `(?m)^member2\s+Pull\s+karmada-agent in member2$`} {
					if got := regexp.MustCompile(pattern).MatchString(section); got != karmada {
						t.Errorf("the section after %q has a line matching %q: %t, want %t", what, pattern, got, karmada)
					}
				}
			}
		})
	}
}

// sectionAfter is the text from the progress line ending in marker to the
// next progress line.
func sectionAfter(text, marker string) (string, bool) {
	_, rest, ok := strings.Cut(text, "] "+marker+"\n")
	if !ok {
		return "", false
	}
	section, _, _ := strings.Cut(rest, "==> ")
	return section, true
}

// TestDemoNamesMissingBinaries: without its binaries the demo says which
// are missing and how to build them, before starting anything.
func TestDemoNamesMissingBinaries(t *testing.T) {
	// withFiles is a directory with empty executables of those names.
	withFiles := func(names ...string) string {
		dir := t.TempDir()
		for _, name := range names {
			if err := os.WriteFile(filepath.Join(dir, name), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	for _, tc := range []struct {
		dir  string
		args []string
		want string
	}{
		{dir: withFiles(), want: "etcd and kube-apiserver not found in "},
		{dir: withFiles("kube-apiserver", "etcd"), want: "ctrlmesh-proxy and demo-operator not found in "},
		{dir: withFiles("kube-apiserver", "etcd", "ctrlmesh-proxy", "demo-operator"), args: []string{"--karmada"},
			want: "karmada-agent and karmada-aggregated-apiserver and karmada-controller-manager not found in "},
	} {
		cmd := newRootCommand()
		cmd.SetArgs(append([]string{"demo", "--bin-dir", tc.dir}, tc.args...))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "run 'make ") {
			t.Errorf("demo %v: error = %v, want it to say %q and which make target builds them", tc.args, err, tc.want)
		}
	}
}
