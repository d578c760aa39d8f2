// Command ctrlmesh-hub runs ctrlmesh's hub controllers on the control cluster.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/version"
)

func main() {
	var kubeconfig string
	opts := hub.Options{}
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:   "ctrlmesh-hub",
		Short: "ctrlmesh hub: shard placement and rule propagation for a fleet",
		Long: `ctrlmesh-hub manages the control cluster, for example a Karmada control
plane: it runs in that cluster, or, for Karmada's API server (which runs no
pods), in a host cluster with --kubeconfig, as Karmada's own components do.

It keeps the member clusters (OCM ManagedClusters: acceptance, with
--auto-accept; availability from the agents' heartbeat Leases and, where
Karmada runs, its Cluster objects), and for every ShardingConfig
(ctrlmesh.io/v1alpha1) computes which pods in which clusters serve which
namespace buckets, moves buckets revoke-before-grant, and writes one Karmada
Work per ShardingConfig and cluster into karmada-es-<cluster>, carrying that
cluster's ShardRoute. Placement and health are reported in
ShardingConfig.status (see "ctrlmeshctl status").`,
		Version:      version.Version,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Log = zap.New(zap.UseFlagOptions(&zapOpts))
			// The informers, the leader election and client-go log through
			// controller-runtime's and klog's global loggers: unset, the
			// first drops every message (a refused list or watch among them)
			// and the second writes klog's own text beside the JSON.
			ctrl.SetLogger(opts.Log)
			klog.SetLogger(opts.Log)
			streamLists(opts.Log)
			// The Go runtime's soft memory limit, at 90% of the
			// container's (its cgroup's), unless GOMEMLIMIT is set: the
			// collector otherwise lets the heap grow to twice the live
			// data before it collects, and a hub whose live data is
			// past half its limit is killed for memory it does not use.
			// With it the hub's memory stays under the limit until its
			// live data nears the limit; without a cgroup limit it does
			// nothing. A failure to read the limit leaves the runtime as
			// it was, and is logged.
			_, _ = memlimit.Set(memlimit.WithLogger(slog.New(logr.ToSlogHandler(opts.Log.WithName("memory")))))
			loading := clientcmd.NewDefaultClientConfigLoadingRules()
			loading.ExplicitPath = kubeconfig
			cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, &clientcmd.ConfigOverrides{}).ClientConfig()
			if err != nil {
				return fmt.Errorf("hub credentials: %w", err)
			}
			opts.Config = cfg
			return hub.Run(ctrl.SetupSignalHandler(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the hub cluster — on Karmada, of the Karmada API server, the hub running in a host cluster (the chart's target=host mounts it from a Secret); empty uses $KUBECONFIG, ~/.kube/config or in-cluster credentials")
	f.BoolVar(&opts.AutoAccept, "auto-accept", false, "accept every member cluster that joins; otherwise an admin sets spec.hubAcceptsClient of its ManagedCluster")
	f.BoolVar(&opts.KarmadaFinalizer, "karmada-finalizer", false, "put Karmada's execution finalizer on Works, as Karmada does; only where Karmada's controllers run (Karmada mode)")
	f.DurationVar(&opts.RulesValidity, "rules-validity", route.FleetValidity, "how long proxies serve Fleet-scope rules without a renewal, which their agent grants in step with its heartbeat; a lost member's buckets go elsewhere only after 1.1× this plus 2 s past its last heartbeat (whole seconds, 5s to 1h)")
	f.BoolVar(&opts.LeaderElection, "leader-elect", true, "elect a leader among the hub's replicas")
	f.DurationVar(&opts.LeaseDuration, "leader-elect-lease-duration", hub.DefaultLeaseDuration, "how long a standby waits after the leader's last renewal before taking over")
	f.DurationVar(&opts.RenewDeadline, "leader-elect-renew-deadline", hub.DefaultRenewDeadline, "how long the leader tries to renew its lease before it steps down (and exits); each request times out after half of it: longer rides out a slow API server")
	f.DurationVar(&opts.RetryPeriod, "leader-elect-retry-period", hub.DefaultRetryPeriod, "time between the leader's renewals and the standbys' attempts")
	f.StringVar(&opts.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace of the hub, holding its leader-election Lease on the hub cluster (the Karmada API server on Karmada) (default $POD_NAMESPACE)")
	f.StringVar(&opts.MetricsAddress, "metrics-bind-address", ":8080", "address serving Prometheus metrics; 0 disables")
	f.StringVar(&opts.HealthAddress, "health-probe-bind-address", ":8081", "address serving /healthz and /readyz; 0 disables")
	f.Float32Var(&opts.QPS, "kube-api-qps", hub.DefaultQPS, "requests per second the hub may send to the hub cluster's API server (client-side limit; negative: none, leaving it to the API server's priority and fairness)")
	f.IntVar(&opts.Burst, "kube-api-burst", hub.DefaultBurst, "requests the hub may send at once above --kube-api-qps")
	f.StringVar(&opts.PprofAddress, "pprof-bind-address", "", "address serving Go's profiles (/debug/pprof/); empty or 0 serves none")
	f.BoolVar(&opts.PlacementMap, "placement-map", true, "serve the read-only placement map, a web page drawing every ShardingConfig's buckets per cluster from its status, at /placement/ on the metrics address")
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	f.AddGoFlagSet(logFlags)
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}

// streamLists turns on client-go's WatchListClient unless
// hub.WatchListEnv says otherwise: the informers then fill
// their cache from a watch that streams the objects (each through the
// cache's transform as it arrives, so a Work loses its manifests at once)
// rather than from a list read and decoded whole. A relist of 100,000 Works
// held a 475 MB response and its decoded Works, manifests included, beside
// the cache it replaced (make bench-scale: 1960 MiB at the peak under a 921
// MiB GOMEMLIMIT); -startup measures the difference on a hub's start. An API
// server without the feature answers the watch with an error, and client-go
// falls back to the list.
func streamLists(log logr.Logger) {
	if _, set := os.LookupEnv(hub.WatchListEnv); set {
		return
	}
	gates, ok := clientfeatures.FeatureGates().(interface {
		Set(clientfeatures.Feature, bool) error
	})
	if !ok {
		log.Info("client-go's feature gates cannot be set: the informers read their lists whole", "feature", clientfeatures.WatchListClient)
		return
	}
	if err := gates.Set(clientfeatures.WatchListClient, true); err != nil {
		log.Error(err, "the informers read their lists whole", "feature", clientfeatures.WatchListClient)
	}
}
