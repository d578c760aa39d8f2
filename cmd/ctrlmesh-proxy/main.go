// Command ctrlmesh-proxy is the sidecar that shards an unmodified operator.
package main

import (
	"os"

	"github.com/ctrlmesh/ctrlmesh/pkg/version"
)

func main() {
	cmd := version.NewShellCommand("ctrlmesh-proxy",
		"ctrlmesh proxy: makes one operator pod see, write and lead only its shard",
		`ctrlmesh-proxy runs next to an operator container, between the operator and
kube-apiserver. It injects the shard's selector into list and watch, fences
writes outside the shard, renames the leader-election lock per shard, routes
admission requests to the pod that owns the object, and reloads its rules
without restarts.`,
		"the proxy issue")
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
