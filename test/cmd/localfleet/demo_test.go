package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// demoBinDir builds ctrlmeshctl, ctrlmesh-proxy and demo-operator from
// this checkout into a temporary directory, next to links to
// kube-apiserver, etcd, the node components, helm and Karmada's components:
// make test builds those (make tools) but not the ctrlmesh binaries, and
// bin/ may hold stale ones.
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
	tools := []string{"kube-apiserver", "etcd", "helm", controlplane.KubeletBinary, controlplane.KubeControllerManagerBinary,
		controlplane.KubeSchedulerBinary, controlplane.KubeProxyBinary,
		controlplane.KarmadaAggregatedAPIServerBinary, controlplane.KarmadaControllerManagerBinary, controlplane.KarmadaAgentBinary}
	if err := controlplane.CheckBinaries(assets, "run 'make tools'", tools...); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range tools {
		if err := os.Symlink(filepath.Join(assets, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/ctrlmeshctl", "./cmd/ctrlmesh-proxy", "./scenarios/demo-operator")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the demo's binaries: %v\n%s", err, out)
	}
	return dir
}

// runDemo runs localfleet demo with args and returns its output and the
// sections after the progress lines "<what>:" of whats.
func runDemo(t *testing.T, binDir string, args []string, whats ...string) (string, map[string]string) {
	t.Helper()
	var out bytes.Buffer
	cmd := newRootCommand()
	cmd.SetArgs(append([]string{"demo", "--bin-dir", binDir}, args...))
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.Execute()
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	text := out.String()
	sections := map[string]string{}
	for _, what := range whats {
		section, ok := sectionAfter(text, what+":")
		if !ok {
			t.Fatalf("no table after %q", what)
		}
		sections[what] = section
	}
	return text, sections
}

// checkSections checks that each section has a line matching each of its
// patterns.
func checkSections(t *testing.T, sections map[string]string, want map[string][]string) {
	t.Helper()
	for what, patterns := range want {
		for _, pattern := range patterns {
			if !regexp.MustCompile(pattern).MatchString(sections[what]) {
				t.Errorf("the table after %q has no line matching %q", what, pattern)
			}
		}
	}
}

var demoPhases = []string{"Ready", "Ready at canary step 1", "Ready at canary step 2", "healed"}

// TestDemo runs localfleet demo end to end on real nodes (the default):
// the hub installed by its chart, the members joined by ctrlmeshctl join
// with the agent's chart, the ShardingConfig applied, the demo operator's
// Deployments with their injected proxies Ready; the placement Ready on the
// operator's pods (named by their ReplicaSets, on their nodes), both
// canary steps of a canary Deployment, and a deleted pod's buckets moved
// and its replacement placed; the proxies' memory read from their cgroups.
func TestDemo(t *testing.T) {
	binDir := demoBinDir(t)
	text, sections := runDemo(t, binDir, nil, demoPhases...)
	const pod = `demo-operator-[a-z0-9]+-[a-z0-9]+`
	const canary = `demo-operator-canary-[a-z0-9]+-[a-z0-9]+`
	// Every pod of the operator and the canary, on its member's node, its
	// proxy and manager Ready.
	running := func(cluster, pod string) string {
		return `(?m)^` + cluster + `\s+` + cluster + `-node\s+` + pod + `\s+Running, ctrlmesh-proxy ready=true restarts=\d+, manager ready=true restarts=\d+$`
	}
	checkSections(t, sections, map[string][]string{
		"Ready": {
			`0\s+member1\s+` + pod + `\s+` + pod + `\s+0-15\s`, `1\s+member1\s+` + pod + `\s+` + pod + `\s+16-31\s`,
			`0\s+member2\s+` + pod + `\s+` + pod + `\s+0-15\s`, `1\s+member2\s+` + pod + `\s+` + pod + `\s+16-31\s`,
			running("member1", pod), running("member2", pod),
		},
		"Ready at canary step 1": {`canary\s+member1\s+` + canary + `\s+` + canary + `\s+-\s+team-a\s+yes\s+Serving\s+Healthy`, running("member1", canary)},
		"Ready at canary step 2": {`canary\s+member1\s+` + canary + `\s+` + canary + `\s+0-3\s+team-a\s+yes\s+Serving\s+Healthy`},
		"healed":                 {running("member2", pod)},
	})
	for _, what := range []string{"Ready", "healed"} {
		if n := len(regexp.MustCompile(`(?m)^[01]\s+member2\s+`).FindAllString(sections[what], -1)); n != 2 {
			t.Errorf("the table after %q places %d shards in member2, want 2", what, n)
		}
	}
	// The deleted pod is no longer placed; its replacement is.
	deleted := regexp.MustCompile(`deleting pod member2/(` + pod + `) on node member2-node`).FindStringSubmatch(text)
	if deleted == nil {
		t.Fatal("no pod deleted in member2")
	}
	if strings.Contains(sections["healed"], deleted[1]) {
		t.Errorf("the deleted pod %s is still in the table after healing", deleted[1])
	}
	// The user's steps, in order, each done by what ships.
	var last int
	for _, step := range []string{"1. install the hub: helm install ctrlmesh-hub", "2. join member1: ctrlmeshctl join", "2. join member2: ctrlmeshctl join",
		"3. apply ShardingConfig", "4. observe the placement"} {
		i := strings.Index(text, step)
		if i < last {
			t.Errorf("step %q not after the previous one", step)
		}
		last = i
	}
	for _, pattern := range []string{`pod ctrlmesh/ctrlmesh-hub-\S+ on node hub-node: Running, hub ready=true`,
		`pod ctrlmesh/ctrlmesh-agent-\S+ on node member1-node: Running, agent ready=true`, `pod ctrlmesh/ctrlmesh-agent-\S+ on node member2-node: Running, agent ready=true`,
		`(?m)^member2\s+` + pod + `\s+\d+\.\d MiB\s+\d+\.\d MiB\s+\d+\.\d MiB$`} {
		if !regexp.MustCompile(pattern).MatchString(text) {
			t.Errorf("the output has no line matching %q", pattern)
		}
	}
}

// TestDemoProcesses runs localfleet demo on the fleet of processes
// (--processes), standalone and with --karmada (member1 joined to Karmada
// push, member2 pull): the placement Ready, both canary steps, and a
// killed pod's buckets moved to the other pod; with --karmada each
// member's sync mode beside every placement.
func TestDemoProcesses(t *testing.T) {
	binDir := demoBinDir(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{name: "standalone", args: []string{"--processes"}},
		{name: "karmada", args: []string{"--karmada"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			karmada := slices.Contains(tc.args, "--karmada")
			_, sections := runDemo(t, binDir, tc.args, demoPhases...)
			checkSections(t, sections, map[string][]string{
				// Which pod gets which shard depends on which proxy reports first:
				// a pod is placed only once its proxy has.
				"Ready": {
					`0\s+member1\s+demo-operator-[01]\s+demo-operator-[01]\s+0-15\s`, `1\s+member1\s+demo-operator-[01]\s+demo-operator-[01]\s+16-31\s`,
					`0\s+member2\s+demo-operator-[01]\s+demo-operator-[01]\s+0-15\s`, `1\s+member2\s+demo-operator-[01]\s+demo-operator-[01]\s+16-31\s`,
				},
				"Ready at canary step 1": {`canary\s+member1\s+demo-operator-canary\s+demo-operator-canary\s+-\s+team-a\s+yes\s+Serving\s+Healthy`},
				"Ready at canary step 2": {`canary\s+member1\s+demo-operator-canary\s+demo-operator-canary\s+0-3\s+team-a\s+yes\s+Serving\s+Healthy`},
				"healed":                 {`[01]\s+member2\s+demo-operator-1\s+demo-operator-1\s+0-31\s+-\s+-\s+Serving\s+Healthy`},
			})
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
		{dir: withFiles(), want: "etcd and helm and kube-apiserver and kube-controller-manager and kube-proxy and kube-scheduler and kubelet not found in "},
		{dir: withFiles("kube-apiserver", "etcd", "helm", "kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"), want: "ctrlmeshctl not found in "},
		{dir: withFiles(), args: []string{"--processes"}, want: "etcd and kube-apiserver not found in "},
		{dir: withFiles("kube-apiserver", "etcd"), args: []string{"--processes"}, want: "ctrlmesh-proxy and demo-operator not found in "},
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
