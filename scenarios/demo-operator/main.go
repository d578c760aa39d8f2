// Command demo-operator is the operator ctrlmesh's tests and demo shard: an
// ordinary controller-runtime operator that reconciles ConfigMaps labeled
// demo.ctrlmesh.io/managed=true, elects a leader with a Lease and serves two
// admission webhooks. See package operator.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ctrlmesh/ctrlmesh/pkg/version"
	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
)

func main() {
	// client-go logs through klog; send it to controller-runtime's logger,
	// which the command fills in once its flags are parsed. klog.SetLogger
	// is not safe for concurrent use, so it is called here, before anything
	// runs, rather than in the command.
	klog.SetLogger(ctrllog.Log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newCommand(operator.Run).ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}

// runFunc runs the operator; operator.Run, or a stand-in in tests of the
// command line.
type runFunc func(context.Context, operator.Options) error

// newCommand builds the command line. Flag defaults that come from the
// environment (POD_NAME, POD_NAMESPACE) are read when it is built.
func newCommand(run runFunc) *cobra.Command {
	var (
		kubeconfig string
		recordFile string
		qps        float32
		burst      int
		opts       operator.Options
		zapOpts    zap.Options
	)
	cmd := &cobra.Command{
		Use:   "demo-operator",
		Short: "The demo operator ctrlmesh shards",
		Long: `demo-operator reconciles ConfigMaps labeled ` + operator.ManagedLabel + `=` + operator.ManagedValue + `
in all namespaces: it annotates each with the pod that reconciled it
(` + operator.ReconciledByAnnotation + `) and a hash of its data
(` + operator.DataHashAnnotation + `), writing only when they are stale.

Replicas elect a leader with a Lease (holder identity: the pod name); only the
leader reconciles. Every replica serves two admission webhooks over TLS:
` + operator.MutatePath + ` stamps managed ConfigMaps with ` + operator.AdmittedByAnnotation + `,
and ` + operator.ValidatePath + ` refuses managed ConfigMaps whose data has the key "` + operator.ForbiddenKey + `".

With --record-file, every reconcile (object, pod, start, end) is appended to a
JSON-lines file, from which a test proves that no two pods ever reconciled the
same object at the same time.`,
		Version:      version.Version,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if opts.PodName == "" {
				return errors.New("no pod name: set --pod-name or the POD_NAME environment variable")
			}
			if opts.LeaderElectionNamespace == "" {
				return errors.New("no leader election namespace: set --leader-election-namespace or the POD_NAMESPACE environment variable")
			}
			logger := zap.New(zap.UseFlagOptions(&zapOpts), zap.WriteTo(cmd.ErrOrStderr()))
			ctrllog.SetLogger(logger)
			opts.Logger = logger.WithValues("pod", opts.PodName)

			if opts.Config, err = loadConfig(kubeconfig); err != nil {
				return err
			}
			opts.Config.QPS, opts.Config.Burst = qps, burst
			if recordFile != "" {
				rec, err := operator.OpenFileRecorder(recordFile)
				if err != nil {
					return err
				}
				defer func() { err = errors.Join(err, rec.Close()) }()
				opts.Recorder = rec
			}
			return run(cmd.Context(), opts)
		},
	}

	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "",
		"kubeconfig file to reach kube-apiserver (or a ctrlmesh proxy); empty: $KUBECONFIG, else the in-cluster config, else ~/.kube/config")
	f.StringVar(&opts.PodName, "pod-name", os.Getenv("POD_NAME"),
		"name of this replica: the leader-election holder identity and the value of the annotations it writes (taken from $POD_NAME when not given)")
	f.StringVar(&opts.LeaderElectionID, "leader-election-id", operator.DefaultLeaderElectionID,
		"name of the Lease lock")
	f.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", os.Getenv("POD_NAMESPACE"),
		"namespace of the Lease lock (taken from $POD_NAMESPACE when not given)")
	f.DurationVar(&opts.LeaseDuration, "lease-duration", operator.DefaultLeaseDuration,
		"how long a non-leader waits after the last renewal before taking the Lease")
	f.DurationVar(&opts.RenewDeadline, "renew-deadline", operator.DefaultRenewDeadline,
		"how long the leader keeps retrying to renew before it gives up leadership (and exits); shorter than --lease-duration")
	f.DurationVar(&opts.RetryPeriod, "retry-period", operator.DefaultRetryPeriod,
		"interval between attempts to acquire or renew the Lease")
	f.IntVar(&opts.WebhookPort, "webhook-port", 9443,
		"port of the admission webhook server (TLS, all interfaces); 0 disables the webhooks")
	f.StringVar(&opts.WebhookCertDir, "webhook-cert-dir", "",
		"directory with the webhook server's tls.crt and tls.key; empty: $TMPDIR/k8s-webhook-server/serving-certs")
	f.StringVar(&opts.HealthAddr, "health-addr", ":8081",
		"address of the /healthz and /readyz endpoints; \"0\" disables them")
	f.StringVar(&opts.MetricsAddr, "metrics-addr", ":8080",
		"address of the Prometheus /metrics endpoint; \"0\" disables it")
	// client-go's own default, 5 requests per second, would bound the
	// operator to about 5 reconciles per second (each writes once).
	f.Float32Var(&qps, "kube-api-qps", 20,
		"requests per second the operator's client sends to the API server at most (client-side rate limit)")
	f.IntVar(&burst, "kube-api-burst", 30,
		"requests the operator's client may send at once above --kube-api-qps")
	f.StringVar(&recordFile, "record-file", "",
		"append a JSON line per reconcile (namespace, name, pod, start, end) to this file; empty records nothing")
	f.DurationVar(&opts.ReconcileDelay, "reconcile-delay", 0,
		"sleep this long at the end of each reconcile, to make overlaps between pods observable")

	// The zap logger's own flags (--zap-log-level=debug shows the V(1)
	// per-reconcile lines).
	goFlags := flag.NewFlagSet("zap", flag.ContinueOnError)
	zapOpts.BindFlags(goFlags)
	f.AddGoFlagSet(goFlags)
	return cmd
}

// loadConfig reads the kubeconfig file, or when none is named, follows
// client-go's usual order: $KUBECONFIG, in-cluster, ~/.kube/config.
func loadConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the client config: %w", err)
	}
	return cfg, nil
}
