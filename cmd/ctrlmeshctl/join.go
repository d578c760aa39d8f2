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
	install := agentInstall{}
	cmd := &cobra.Command{
		Use:   "join",
		Short: "Join a member cluster to the ctrlmesh hub: register it, or install its agent",
		Long: `join registers a member cluster on the hub as an OCM ManagedCluster, with
claims naming its Kubernetes and ctrlmesh versions and its ID (id.k8s.io: the
UID of its kube-system namespace, as Karmada's Cluster spec.id). The cluster
gets no rules until the hub accepts it (spec.hubAcceptsClient), by an admin
or by the hub's auto-accept policy. The agent joins the same way on start and
then renews its heartbeat Lease managed-cluster-lease in the namespace
<cluster> on the hub, as OCM's agent does. The hub credentials need the RBAC
of deploy/rbac/agent-hub.yaml.

With --agent-chart, join installs the member's agent instead, in one step:
it reads the token of the hub ServiceAccount agent-<cluster> from its Secret
agent-<cluster>-token in --namespace on the hub (the hub chart's members
value makes both; the hub kubeconfig must be able to read it, an admin's),
writes the agent's hub kubeconfig (the hub kubeconfig's server, that token)
into the member as the Secret ctrlmesh-hub-kubeconfig, installs the agent
chart with helm (helm upgrade --install, so running it again upgrades), and
waits until the agent has joined the hub. With --print it writes that
kubeconfig to hub-<cluster>.kubeconfig and prints the commands instead of
running them.`,
		Example: `  ctrlmeshctl join --hub-kubeconfig hub-agent-member1.kubeconfig --cluster-name member1
  ctrlmeshctl join --hub-kubeconfig hub-admin.kubeconfig --kubeconfig member1.kubeconfig --cluster-name member1 \
    --agent-chart deploy/charts/ctrlmesh-agent --set image.repository=registry.example.com/ctrlmesh/ctrlmesh-agent \
    --set proxyImage.repository=registry.example.com/ctrlmesh/ctrlmesh-proxy`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if install.chart != "" {
				hubConfig, memberConfig, err := membership.Configs(hubKubeconfig, memberKubeconfig)
				if err != nil {
					return err
				}
				if err := install.run(ctx, cmd.OutOrStdout(), hubConfig, memberConfig, memberKubeconfig, cluster); err != nil || install.print {
					return err
				}
			} else {
				if install.print {
					return fmt.Errorf("--print prints the agent's install: give --agent-chart")
				}
				hub, opts, err := membership.Connect(hubKubeconfig, memberKubeconfig)
				if err != nil {
					return err
				}
				opts.ClusterName = cluster
				if err := membership.Join(ctx, hub, opts); err != nil {
					return err
				}
			}
			hub, _, err := membership.Connect(hubKubeconfig, memberKubeconfig)
			if err != nil {
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
	f.StringVar(&hubKubeconfig, "hub-kubeconfig", "", "kubeconfig of the hub, with the member's agent credentials; with --agent-chart credentials that read the agent's token Secret on the hub (required)")
	f.StringVar(&memberKubeconfig, "kubeconfig", "", "kubeconfig of the member cluster; empty uses $KUBECONFIG, ~/.kube/config or in-cluster credentials")
	f.StringVar(&cluster, "cluster-name", "", "name of the member cluster on the hub: a DNS label (required)")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "how long join may take (with --agent-chart, give the agent's pods time to start: 5m)")
	f.StringVar(&install.chart, "agent-chart", "", "directory of the agent chart (deploy/charts/ctrlmesh-agent): install the member's agent with it")
	f.StringVar(&install.helm, "helm", "helm", "helm binary, with --agent-chart")
	f.StringVar(&install.namespace, "namespace", membership.AgentNamespace, "with --agent-chart: the namespace ctrlmesh runs in on the hub (where the agent's token Secret is) and the agent's in the member")
	f.StringArrayVar(&install.sets, "set", nil, "with --agent-chart: a value of the agent chart (helm --set), such as image.repository=...; repeat it for more")
	f.BoolVar(&install.print, "print", false, "with --agent-chart: print the install (and write the agent's hub kubeconfig to hub-<cluster>.kubeconfig) instead of running it")
	_ = cmd.MarkFlagRequired("hub-kubeconfig")
	_ = cmd.MarkFlagRequired("cluster-name")
	return cmd
}
