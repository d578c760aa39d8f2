// Package cmd_test checks what the shipped binaries link.
package cmd_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShippedBinariesLinkNoTestCode: the four shipped commands link none of
// the test and demo machinery — the local fleet and its control planes
// (test/...), envtest, the demo operator. The local fleet's demo is the
// localfleet command under test/cmd for that reason.
func TestShippedBinariesLinkNoTestCode(t *testing.T) {
	forbidden := []string{
		"github.com/ctrlmesh/ctrlmesh/test/",
		"github.com/ctrlmesh/ctrlmesh/scenarios/",
		"sigs.k8s.io/controller-runtime/pkg/envtest",
	}
	for _, command := range []string{"ctrlmesh-hub", "ctrlmesh-agent", "ctrlmesh-proxy", "ctrlmeshctl"} {
		out, err := exec.Command("go", "list", "-deps", "./"+command).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps ./%s: %v\n%s", command, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("%s links %s: test and demo code must stay out of the shipped binaries", command, dep)
				}
			}
		}
	}
}
