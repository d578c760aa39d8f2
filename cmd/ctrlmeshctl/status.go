package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
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
			return printStatus(cmd.OutOrStdout(), &sc)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the hub; empty uses $KUBECONFIG or ~/.kube/config")
	f.StringVarP(&namespace, "namespace", "n", "", "namespace of the ShardingConfig (default: the kubeconfig's)")
	return cmd
}

// printStatus prints the status of sc: a summary line, the conditions and
// the placement table.
func printStatus(w io.Writer, sc *ctrlmeshv1alpha1.ShardingConfig) error {
	st := &sc.Status
	fmt.Fprintf(w, "ShardingConfig %s/%s: generation %d, observed %d; %d clusters, %d shards, %d ready\n",
		sc.Namespace, sc.Name, sc.Generation, st.ObservedGeneration, st.Clusters, st.Shards, st.ReadyShards)
	if st.Canary != nil && sc.Spec.Canary != nil {
		since := "not healthy"
		if st.Canary.HealthySince != nil {
			since = "healthy since " + st.Canary.HealthySince.UTC().Format("15:04:05")
		}
		fmt.Fprintf(w, "canary: step %d of %d, %s\n", st.Canary.Step+1, len(sc.Spec.Canary.Steps), since)
	}
	for _, c := range st.Conditions {
		fmt.Fprintf(w, "%s=%s (%s) %s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	if len(st.Placement) == 0 {
		_, err := fmt.Fprintln(w, "no shards placed")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tCLUSTER\tPODS\tLEADER\tBUCKETS\tNAMESPACES\tCANARY\tSTATE\tHEALTH")
	for _, p := range st.Placement {
		canary := ""
		if p.Canary {
			canary = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Shard, p.Cluster, orDash(strings.Join(p.Pods, ",")),
			orDash(p.Leader), orDash(p.Buckets), orDash(strings.Join(p.Namespaces, ",")), orDash(canary), p.State, p.Health)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
