// Command localfleet runs ctrlmesh on a local fleet — a hub and two member
// clusters, each a real kube-apiserver and etcd, no Docker — for make demo
// and for trying ctrlmesh out. It lives under test/ because it links the
// hub, the agent and the test harness (test/localfleet) into one process:
// none of that belongs in the shipped ctrlmeshctl.
package main

import (
	"github.com/spf13/cobra"

	"github.com/ctrlmesh/ctrlmesh/pkg/version"
)

func main() { cobra.CheckErr(newRootCommand().Execute()) }

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "localfleet",
		Short: "Run ctrlmesh on a local fleet of real API servers",
		Long: `localfleet runs a local fleet (a hub and two members, real API servers, no
Docker) to try ctrlmesh on: demo walks through placement, a canary and a pod
failure; up starts the fleet and stays up.`,
		Version:      version.Version,
		SilenceUsage: true,
		// main prints the error, once.
		SilenceErrors: true,
	}
	root.AddCommand(newDemoCommand(), newUpCommand())
	return root
}
