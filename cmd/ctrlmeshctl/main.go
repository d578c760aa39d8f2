// Command ctrlmeshctl is the ctrlmesh command-line tool.
package main

import (
	"os"

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
	root.AddCommand(newJoinCommand(), newStatusCommand())
	return root
}
