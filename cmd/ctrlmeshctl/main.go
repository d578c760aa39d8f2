// Command ctrlmeshctl is the ctrlmesh command-line tool.
package main

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/ctrlmesh/ctrlmesh/pkg/version"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "ctrlmeshctl",
		Short: "ctrlmesh command-line tool",
		Long: `ctrlmeshctl works with a ctrlmesh fleet: it joins member clusters to the hub
and shows where a ShardingConfig's shards run.`,
		Version:      version.Version,
		SilenceUsage: true,
	}
	if filepath.Base(os.Args[0]) == kubectlPlugin {
		// Help and usage say "kubectl ctrlmesh ...", as kubectl's plugin
		// convention asks.
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl ctrlmesh"}
	}
	root.AddCommand(newJoinCommand(), newStatusCommand(), newExplainCommand())
	return root
}

// kubectlPlugin is the name kubectl runs ctrlmeshctl by as a plugin
// ("kubectl ctrlmesh ..."): make build links it to ctrlmeshctl.
const kubectlPlugin = "kubectl-ctrlmesh"
