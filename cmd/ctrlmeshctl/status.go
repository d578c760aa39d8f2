package main

import (
	"fmt"
	"slices"

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
		Short: "Print a ShardingConfig's placement, subsets and traffic policies",
		Long: `status reads a ShardingConfig from the hub and prints what the hub reports
in its status: the conditions, and per shard its cluster, pods, leader,
buckets (compact notation), exact namespaces, canary flag, state and health;
per subset its pod selector, its rules, and per cluster its pods and what
they are served. Then the traffic policies bound to it (the CircuitBreakers
and FaultInjections of its namespace that name it): per member cluster how
many of the operator's proxies enforce each policy's generation, and each
breaker that is not closed, in which pods, since when.`,
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
			var breakers ctrlmeshv1alpha1.CircuitBreakerList
			if err := hub.List(cmd.Context(), &breakers, client.InNamespace(namespace)); err != nil {
				return fmt.Errorf("listing the CircuitBreakers of namespace %s (ctrlmeshctl status needs get and list on shardingconfigs, circuitbreakers and faultinjections there): %w", namespace, err)
			}
			var faults ctrlmeshv1alpha1.FaultInjectionList
			if err := hub.List(cmd.Context(), &faults, client.InNamespace(namespace)); err != nil {
				return fmt.Errorf("listing the FaultInjections of namespace %s (ctrlmeshctl status needs get and list on shardingconfigs, circuitbreakers and faultinjections there): %w", namespace, err)
			}
			out := cmd.OutOrStdout()
			if err := printers.ShardingConfig(out, &sc); err != nil {
				return err
			}
			// Policies of the namespace that name another ShardingConfig are not printed.
			unbound := func(p ctrlmeshv1alpha1.Policy) bool { return p.ShardingConfigName() != sc.Name }
			return printers.Policies(out, slices.DeleteFunc(breakers.Items, func(cb ctrlmeshv1alpha1.CircuitBreaker) bool { return unbound(&cb) }),
				slices.DeleteFunc(faults.Items, func(fi ctrlmeshv1alpha1.FaultInjection) bool { return unbound(&fi) }))
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the hub; empty uses $KUBECONFIG or ~/.kube/config")
	f.StringVarP(&namespace, "namespace", "n", "", "namespace of the ShardingConfig (default: the kubeconfig's)")
	return cmd
}
