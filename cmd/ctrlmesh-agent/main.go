// Command ctrlmesh-agent runs ctrlmesh's agent in a member cluster.
package main

import (
	"os"

	"github.com/ctrlmesh/ctrlmesh/pkg/version"
)

func main() {
	cmd := version.NewShellCommand("ctrlmesh-agent",
		"ctrlmesh agent: the hub's hands in one member cluster",
		`ctrlmesh-agent runs once per member cluster.

It joins the cluster to the hub (OCM ManagedCluster and a heartbeat Lease),
receives the cluster's ShardRoute rules (applied by Karmada, or pulled from
its Work when no Karmada controllers run), labels sharded objects with
ctrlmesh.io/sharding-hash, injects the ctrlmesh proxy into operator pods, and
reports shard health back through the ShardRoute status.`,
		"the agent issue")
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
