// Command ctrlmesh-agent runs ctrlmesh's agent in a member cluster.
package main

import (
	"flag"
	"os"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ctrlmesh/ctrlmesh/agent"
	"github.com/ctrlmesh/ctrlmesh/agent/join"
	"github.com/ctrlmesh/ctrlmesh/pkg/version"
)

func main() {
	var hubKubeconfig, memberKubeconfig string
	opts := agent.Options{}
	zapOpts := zap.Options{}
	hostname, _ := os.Hostname()
	identity := os.Getenv("POD_NAME")
	if identity == "" {
		identity = hostname
	}
	cmd := &cobra.Command{
		Use:   "ctrlmesh-agent",
		Short: "ctrlmesh agent: the hub's hands in one member cluster",
		Long: `ctrlmesh-agent runs once per member cluster. It joins the cluster to the hub
(an OCM ManagedCluster with version claims; the hub must accept it) and
renews a heartbeat Lease, ctrlmesh-agent, in karmada-es-<cluster> on the hub
(--lease-duration, renewed every --renew-interval); the hub counts the
cluster available while the Lease is fresh.

Not yet run by this binary: applying rules, labelling sharded objects
(agent/labeler), reporting shard health and injecting the proxy.`,
		Version:      version.Version,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Log = zap.New(zap.UseFlagOptions(&zapOpts))
			var err error
			if opts.Hub, opts.Member, err = join.Connect(hubKubeconfig, memberKubeconfig); err != nil {
				return err
			}
			return agent.Run(ctrl.SetupSignalHandler(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&hubKubeconfig, "hub-kubeconfig", "", "kubeconfig of the hub with this agent's credentials (see deploy/rbac/agent-hub.yaml) (required)")
	f.StringVar(&memberKubeconfig, "kubeconfig", "", "kubeconfig of the member cluster; empty uses $KUBECONFIG, ~/.kube/config or in-cluster credentials")
	f.StringVar(&opts.ClusterName, "cluster-name", "", "name of this member cluster on the hub: a DNS label (required)")
	f.StringVar(&opts.Identity, "identity", identity, "holder identity written into the heartbeat Lease (default $POD_NAME, else the host name)")
	f.DurationVar(&opts.LeaseDuration, "lease-duration", join.DefaultLeaseDuration, "heartbeat Lease duration: the hub counts the cluster unavailable once this passes without a renewal")
	f.DurationVar(&opts.RenewInterval, "renew-interval", join.DefaultRenewInterval, "time between heartbeat renewals; must be shorter than --lease-duration")
	_ = cmd.MarkFlagRequired("hub-kubeconfig")
	_ = cmd.MarkFlagRequired("cluster-name")
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	f.AddGoFlagSet(logFlags)
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
