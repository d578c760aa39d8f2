// Command ctrlmesh-hub runs ctrlmesh's hub controllers on the control cluster.
package main

import (
	"os"

	"github.com/ctrlmesh/ctrlmesh/pkg/version"
)

func main() {
	cmd := version.NewShellCommand("ctrlmesh-hub",
		"ctrlmesh hub: shard placement and rule propagation for a fleet",
		`ctrlmesh-hub runs on the control cluster (for example a Karmada control plane).

It watches ShardingConfigs (ctrlmesh.io/v1alpha1) and member-cluster
registrations (OCM ManagedCluster plus a heartbeat Lease), computes which pod
in which cluster serves which namespace buckets, and writes one Karmada Work
per ShardingConfig and cluster into karmada-es-<cluster>, carrying that
cluster's ShardRoute rules. Placement and health are reported in
ShardingConfig.status.`,
		"the hub issue")
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
