package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
)

func newJoinCommand() *cobra.Command {
	var hubKubeconfig, memberKubeconfig, cluster string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "join",
		Short: "Register a member cluster on the ctrlmesh hub",
		Long: `join registers a member cluster on the hub as an OCM ManagedCluster, with
claims naming its Kubernetes and ctrlmesh versions and its ID (id.k8s.io: the
UID of its kube-system namespace, as Karmada's Cluster spec.id). The cluster
gets no rules until the hub accepts it (spec.hubAcceptsClient), by an admin
or by the hub's auto-accept policy. The agent joins the same way on start and
then renews its heartbeat Lease managed-cluster-lease in the namespace
<cluster> on the hub, as OCM's agent does.

The hub credentials need the RBAC of deploy/rbac/agent-hub.yaml.`,
		Example: `  ctrlmeshctl join --hub-kubeconfig hub.kubeconfig --cluster-name member1`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			hub, opts, err := membership.Connect(hubKubeconfig, memberKubeconfig)
			if err != nil {
				return err
			}
			opts.ClusterName = cluster
			if err := membership.Join(ctx, hub, opts); err != nil {
				return err
			}
			accepted, err := membership.IsAccepted(ctx, hub, cluster)
			if err != nil {
				return err
			}
			if accepted {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "cluster %s is registered on the hub and accepted\n", cluster)
			} else {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "cluster %s is registered on the hub; it gets rules once the hub accepts it (ManagedCluster %s, spec.hubAcceptsClient)\n", cluster, cluster)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&hubKubeconfig, "hub-kubeconfig", "", "kubeconfig of the hub, with the member's agent credentials (required)")
	f.StringVar(&memberKubeconfig, "kubeconfig", "", "kubeconfig of the member cluster; empty uses $KUBECONFIG, ~/.kube/config or in-cluster credentials")
	f.StringVar(&cluster, "cluster-name", "", "name of the member cluster on the hub: a DNS label (required)")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "how long join may take")
	_ = cmd.MarkFlagRequired("hub-kubeconfig")
	_ = cmd.MarkFlagRequired("cluster-name")
	return cmd
}
