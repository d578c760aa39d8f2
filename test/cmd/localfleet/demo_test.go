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
// a temporary directory, next to links to kube-apiserver and etcd: make
// test builds those (make tools) but not the ctrlmesh binaries, and bin/
// may hold stale ones.
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
	if err := controlplane.CheckBinaries(assets, "run 'make tools'", "kube-apiserver", "etcd"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"kube-apiserver", "etcd"} {
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

// TestDemo runs localfleet demo end to end: the placement Ready, both
// canary steps, and a killed pod's buckets moved to the other pod.
func TestDemo(t *testing.T) {
	binDir := demoBinDir(t)
	var out bytes.Buffer
	cmd := newRootCommand()
	cmd.SetArgs([]string{"demo", "--bin-dir", binDir})
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
	noProxy := t.TempDir()
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if err := os.WriteFile(filepath.Join(noProxy, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for dir, want := range map[string]string{
		t.TempDir(): "etcd and kube-apiserver not found in ",
		noProxy:     "ctrlmesh-proxy and demo-operator not found in ",
	} {
		cmd := newRootCommand()
		cmd.SetArgs([]string{"demo", "--bin-dir", dir})
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "run 'make ") {
			t.Errorf("error = %v, want it to say %q and which make target builds them", err, want)
		}
	}
}
