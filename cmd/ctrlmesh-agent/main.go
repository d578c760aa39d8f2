// Command ctrlmesh-agent runs ctrlmesh's agent in a member cluster.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ctrlmesh/ctrlmesh/agent"
	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/version"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

func main() {
	var hubKubeconfig, memberKubeconfig, selectorMode, webhookURL, webhookService, webhookCAFile string
	var cpuRequest, memoryRequest, memoryLimit string
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
		Long: `ctrlmesh-agent runs in each member cluster (replicas elect a leader).

It joins the cluster to the hub (an OCM ManagedCluster with version and ID
claims; the hub must accept it) and renews OCM's heartbeat Lease,
managed-cluster-lease, in the namespace <cluster> on the hub; once the hub
accepted the cluster it marks it joined (ManagedClusterJoined) and takes
the rules: in standalone mode (--apply-works) it applies the ShardRoute of
each Work in karmada-es-<cluster> itself and reports its status into the
Work as Karmada would; in Karmada mode Karmada does that.

For every ShardRoute in the cluster it reports the candidate pods, the rules
hash each proxy enforces, each shard's leader and the RulesApplied and
ProxiesReady conditions. In label mode it labels the objects of the sharded
resources (sweeps, and a webhook for new objects). It injects the proxy into
pods labeled ctrlmesh.io/enable-proxy=true that a ShardRoute selects.

Its member RBAC is deploy/rbac/agent-member.yaml, its hub RBAC
deploy/rbac/agent-hub.yaml.`,
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
			var err error
			if opts.Hub, opts.Member, err = membership.Configs(hubKubeconfig, memberKubeconfig); err != nil {
				return err
			}
			switch selectorMode {
			case "auto":
			case string(rules.ModeLabel), string(rules.ModeRange):
				opts.SelectorMode = rules.Mode(selectorMode)
			default:
				return fmt.Errorf("--selector-mode must be auto, label or range, not %q", selectorMode)
			}
			if opts.Webhook.ClientConfig, err = webhookClientConfig(webhookURL, webhookService, webhookCAFile, opts.Webhook.CertDir); err != nil {
				return err
			}
			for _, q := range []struct {
				flag, value string
				into        *resource.Quantity
			}{{"proxy-cpu-request", cpuRequest, &opts.Proxy.CPURequest}, {"proxy-memory-request", memoryRequest, &opts.Proxy.MemoryRequest}, {"proxy-memory-limit", memoryLimit, &opts.Proxy.MemoryLimit}} {
				if q.value == "" {
					continue
				}
				if *q.into, err = resource.ParseQuantity(q.value); err != nil {
					return fmt.Errorf("--%s: %w", q.flag, err)
				}
			}
			return agent.Run(ctrl.SetupSignalHandler(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&hubKubeconfig, "hub-kubeconfig", "", "kubeconfig of the hub with this agent's credentials (see deploy/rbac/agent-hub.yaml) (required)")
	f.StringVar(&memberKubeconfig, "kubeconfig", "", "kubeconfig of the member cluster; empty uses $KUBECONFIG, ~/.kube/config or in-cluster credentials")
	f.StringVar(&opts.ClusterName, "cluster-name", "", "name of this member cluster on the hub: a DNS label (required)")
	f.StringVar(&opts.Identity, "identity", identity, "holder identity written into the heartbeat Lease (default $POD_NAME, else the host name)")
	f.DurationVar(&opts.LeaseDuration, "lease-duration", membership.DefaultLeaseDuration, "heartbeat Lease duration: the hub counts the cluster unavailable once this passes without a renewal")
	f.DurationVar(&opts.RenewInterval, "renew-interval", membership.DefaultRenewInterval, "time between heartbeat renewals; must be shorter than --lease-duration")
	f.BoolVar(&opts.ApplyWorks, "apply-works", true, "standalone mode: apply the Works of karmada-es-<cluster> on the hub to this cluster and report their status; false when Karmada's controllers do (Karmada mode)")
	f.StringVar(&selectorMode, "selector-mode", "auto", "how proxies narrow lists, which decides whether objects are labeled: label, range (KEP-5866, no labels), or auto (ask the API server)")
	f.StringVar(&opts.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace the agent runs in, holding its leader-election Lease; the hub binds the labeler's rights to its ServiceAccount ctrlmesh-agent there (default $POD_NAMESPACE)")
	f.BoolVar(&opts.LeaderElection, "leader-elect", true, "elect a leader among the agent's replicas; only the leader joins, applies, labels and reports")
	f.StringVar(&opts.MetricsAddress, "metrics-bind-address", ":8080", "address serving Prometheus metrics; 0 disables")
	f.StringVar(&opts.HealthAddress, "health-probe-bind-address", ":8081", "address serving /healthz and /readyz; 0 disables")
	f.StringVar(&opts.Webhook.Host, "webhook-host", "", "address the webhook server listens on (default all)")
	f.IntVar(&opts.Webhook.Port, "webhook-port", 9443, "port the webhook server listens on")
	f.StringVar(&opts.Webhook.CertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory holding the webhook serving certificate, tls.crt and tls.key")
	f.StringVar(&webhookService, "webhook-service", "", "namespace/name of the Service in front of the agent's webhook server, for the webhook configurations the agent writes")
	f.StringVar(&webhookURL, "webhook-url", "", "base URL of the agent's webhook server, instead of --webhook-service (local clusters)")
	f.StringVar(&webhookCAFile, "webhook-ca-file", "", "CA bundle that verifies the webhook serving certificate (default ca.crt in --webhook-cert-dir)")
	f.DurationVar(&opts.LabelPeriod, "label-period", labeler.DefaultPeriod, "time between labeling sweeps, which label what the webhook missed")
	f.DurationVar(&opts.ReplacePace, "proxy-replace-pace", inject.DefaultPace, "least time between two evictions of one controller's pods that were created without the proxy a ShardRoute now gives them")
	f.StringVar(&opts.Proxy.Image, "proxy-image", "", "image of the proxy sidecar the agent injects (required)")
	f.StringVar(&cpuRequest, "proxy-cpu-request", inject.DefaultCPURequest.String(), "CPU request of the injected proxy")
	f.StringVar(&memoryRequest, "proxy-memory-request", inject.DefaultMemoryRequest.String(), "memory request of the injected proxy")
	f.StringVar(&memoryLimit, "proxy-memory-limit", inject.DefaultMemoryLimit.String(), "memory limit of the injected proxy")
	_ = cmd.MarkFlagRequired("hub-kubeconfig")
	_ = cmd.MarkFlagRequired("cluster-name")
	_ = cmd.MarkFlagRequired("proxy-image")
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	f.AddGoFlagSet(logFlags)
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}

// webhookClientConfig is how the member API server reaches the agent's
// webhooks: exactly one of a Service and a URL, and the CA bundle.
func webhookClientConfig(url, service, caFile, certDir string) (admissionregistrationv1.WebhookClientConfig, error) {
	var cc admissionregistrationv1.WebhookClientConfig
	switch {
	case (url == "") == (service == ""):
		return cc, errors.New("give exactly one of --webhook-service and --webhook-url: the agent writes its webhook configurations with it")
	case url != "":
		cc.URL = &url
	default:
		ns, name, ok := strings.Cut(service, "/")
		if !ok || ns == "" || name == "" {
			return cc, fmt.Errorf("--webhook-service %q: want namespace/name", service)
		}
		cc.Service = &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name}
	}
	if caFile == "" {
		caFile = filepath.Join(certDir, "ca.crt")
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return cc, fmt.Errorf("reading the webhook CA bundle: %w", err)
	}
	cc.CABundle = ca
	return cc, nil
}
