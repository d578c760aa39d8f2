package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/printers"
	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
)

func newStatusCommand() *cobra.Command {
	var kubeconfig, namespace string
	cmd := &cobra.Command{
		Use:   "status <shardingconfig>",
		Short: "Print a ShardingConfig's placement as a table",
		Long: `status reads a ShardingConfig from the hub and prints what the hub reports
in its status: the conditions, and per shard its cluster, pods, leader,
buckets (compact notation), exact namespaces, canary flag, state and health.`,
		Example: `  ctrlmeshctl status demo-op -n ops --kubeconfig hub.kubeconfig`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			loading := clientcmd.NewDefaultClientConfigLoadingRules()
			loading.ExplicitPath = kubeconfig
			clientConfig := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, &clientcmd.ConfigOverrides{})
			if namespace == "" {
				ns, _, err := clientConfig.Namespace()
				if err != nil {
					return fmt.Errorf("the kubeconfig's namespace: %w", err)
				}
				namespace = ns
			}
			cfg, err := clientConfig.ClientConfig()
			if err != nil {
				return fmt.Errorf("hub credentials: %w", err)
			}
			scheme, err := ctrlmeshscheme.New()
			if err != nil {
				return err
			}
			hub, err := client.New(cfg, client.Options{Scheme: scheme})
			if err != nil {
				return fmt.Errorf("hub client: %w", err)
			}
			var sc ctrlmeshv1alpha1.ShardingConfig
			if err := hub.Get(cmd.Context(), client.ObjectKey{Namespace: namespace, Name: args[0]}, &sc); err != nil {
				return fmt.Errorf("reading ShardingConfig %s/%s: %w", namespace, args[0], err)
			}
			return printers.ShardingConfig(cmd.OutOrStdout(), &sc)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the hub; empty uses $KUBECONFIG or ~/.kube/config")
	f.StringVarP(&namespace, "namespace", "n", "", "namespace of the ShardingConfig (default: the kubeconfig's)")
	return cmd
}
