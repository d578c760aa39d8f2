// Command ctrlmeshctl is the ctrlmesh command-line tool.
package main

import (
	"os"

	"github.com/ctrlmesh/ctrlmesh/pkg/version"
)

func main() {
	cmd := version.NewShellCommand("ctrlmeshctl",
		"ctrlmesh command-line tool",
		`ctrlmeshctl joins member clusters to a ctrlmesh hub, shows the placement of
a ShardingConfig as a table, and starts a local fleet for the demo.`,
		"the agent, hub and end-to-end issues")
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
