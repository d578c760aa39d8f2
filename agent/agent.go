// Package agent is ctrlmesh's agent in one member cluster: the hub's hands
// there. One controller-runtime manager on the member cluster runs
//
//   - membership (elected replica): joins the cluster to the hub, renews the
//     heartbeat Lease and, once the hub accepted the cluster, starts taking
//     rules from it;
//   - in standalone mode, the Work applier (agent/workapply, elected): it
//     applies the ShardRoutes the hub's Works carry and reflects their status
//     into the Works, as Karmada would; in Karmada mode Karmada does that;
//   - the ShardRoute status controller (agent/routestatus, elected);
//   - labeling (agent/labeler): the targets on every replica, for the
//     webhook; sweeps and the webhook configuration on the elected one;
//   - the proxy injection webhook (agent/inject, every replica); the Events
//     on pods it could not serve and on pods whose ShardRoute was deleted,
//     and the replacement of pods created before a ShardRoute selected
//     them (elected).
package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	"github.com/ctrlmesh/ctrlmesh/agent/routestatus"
	"github.com/ctrlmesh/ctrlmesh/agent/workapply"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/leaderelection"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
	"github.com/ctrlmesh/ctrlmesh/pkg/webhookutil"
	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// LeaderElectionID is the Lease the agent's replicas elect their leader with,
// in Options.Namespace of the member cluster.
const LeaderElectionID = "ctrlmesh-agent"

// Options of a running agent.
type Options struct {
	// Member is the member cluster, with the agent's credentials.
	Member *rest.Config
	// Hub is the hub, with the agent's hub credentials (see
	// membership.AgentHubRBAC).
	Hub *rest.Config
	// ClusterName is the member's name on the hub.
	ClusterName string
	// Identity is this agent's heartbeat holder identity, such as its pod name.
	Identity string
	// LeaseDuration and RenewInterval of the heartbeat; zero for defaults.
	LeaseDuration, RenewInterval time.Duration
	// Clock is the agent's clock: the heartbeat's renewTime and the judging
	// of shard leases' expiry read it. Nil for the real clock; the local
	// fleet's chaos tests skew it, as a member node's clock may be.
	Clock clock.PassiveClock
	// ApplyWorks selects standalone mode: the agent applies the Works of its
	// execution namespace on the hub itself. False is Karmada mode: Karmada's
	// controllers apply them, and the agent only reads the ShardRoutes.
	ApplyWorks bool
	// SelectorMode fixes how proxies narrow lists: rules.ModeLabel needs
	// labels, rules.ModeRange none; "" asks the member API server.
	SelectorMode rules.Mode
	// Namespace the agent runs in: its leader-election Lease lives there,
	// and the hub binds the labeler's rights to the ServiceAccount
	// ctrlmesh-agent there (membership.ClaimAgentNamespace); without it the
	// labeler gets no rights.
	Namespace string
	// LeaderElection among the agent's replicas; off only for tests and
	// single-replica local runs.
	LeaderElection bool
	// MetricsAddress serves Prometheus metrics; "0" disables.
	MetricsAddress string
	// HealthAddress serves /healthz and /readyz; "0" disables.
	HealthAddress string
	// Webhook serves the labeling and injection webhooks.
	Webhook WebhookOptions
	// LabelPeriod is the time between labeling sweeps; zero for
	// labeler.DefaultPeriod.
	LabelPeriod time.Duration
	// Proxy is what the injection webhook injects.
	Proxy inject.Options
	// ReplacePace is the least time between two evictions of one owner's
	// pods created without the proxy; zero for inject.DefaultPace.
	ReplacePace time.Duration
	Log         logr.Logger
}

// WebhookOptions say where the agent serves its admission webhooks and how
// the member API server reaches them.
type WebhookOptions struct {
	// Host and Port the webhook server listens on.
	Host string
	Port int
	// CertDir holds the serving certificate, tls.crt and tls.key.
	CertDir string
	// ClientConfig is how the API server reaches the webhook server: a
	// service or a URL, without a path (the agent appends each webhook's),
	// and the caBundle that verifies the serving certificate. The elected
	// agent writes the webhook configurations with it.
	ClientConfig admissionregistrationv1.WebhookClientConfig
}

// Names of the proxy injection webhook: its MutatingWebhookConfiguration,
// the webhook in it, and the path the agent serves it on.
const (
	InjectWebhookConfigurationName = "ctrlmesh-agent-inject"
	InjectWebhookName              = "inject.agent.ctrlmesh.io"
	InjectWebhookPath              = "/inject"
)

// Run runs the agent until ctx ends.
func Run(ctx context.Context, opts Options) error {
	if opts.Member == nil || opts.Hub == nil || opts.ClusterName == "" || opts.Identity == "" {
		return errors.New("agent: member and hub configs, cluster name and identity are all required")
	}
	if opts.LeaderElection && opts.Namespace == "" {
		return errors.New("agent: leader election needs the agent's namespace")
	}
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		return err
	}
	hub, err := client.New(opts.Hub, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("agent: hub client: %w", err)
	}
	memberDiscovery, err := discovery.NewDiscoveryClientForConfig(opts.Member)
	if err != nil {
		return fmt.Errorf("agent: member discovery: %w", err)
	}
	mgr, err := manager.New(opts.Member, manager.Options{
		Scheme: scheme,
		Logger: opts.Log,
		// Pods are cached lean: the status controller and the injection
		// Events read only their labels, status and ctrlmesh annotations.
		Cache:                   cache.Options{ByObject: routestatus.CacheByObject()},
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: opts.Namespace,
		// Renewals wait on neither the controllers' limit nor their
		// connection to the member API server.
		LeaderElectionConfig: leaderelection.Config(opts.Member, ctrlmeshv1alpha1.AgentComponent),
		// A new leader must not act before the old one stopped: the
		// labeler and the Work applier write to the cluster.
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: opts.MetricsAddress},
		// controller-runtime keeps controller names in a process-wide
		// registry; they are unique within one agent, and Run may run
		// again in the same process (a restart, or tests).
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		HealthProbeBindAddress: opts.HealthAddress,
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: opts.Webhook.Host, Port: opts.Webhook.Port, CertDir: opts.Webhook.CertDir,
		}),
	})
	if err != nil {
		return fmt.Errorf("agent: manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return err
	}
	mode, err := selectorMode(ctx, opts, mgr.GetRESTMapper())
	if err != nil {
		return err
	}
	opts.Log.Info("Selector mode of the member API server", "mode", mode)
	recorder := mgr.GetEventRecorderFor(ctrlmeshv1alpha1.AgentComponent)

	// Rules in: in standalone mode from the hub's Works, once the hub has
	// accepted the cluster; in Karmada mode Karmada applies them.
	onAccepted := func(context.Context) error { return nil }
	if opts.ApplyWorks {
		onAccepted = func(context.Context) error {
			applier := &workapply.Applier{
				HubConfig: opts.Hub, ClusterName: opts.ClusterName, Recorder: recorder, Log: opts.Log.WithName("workapply"),
			}
			return applier.SetupWithManager(mgr)
		}
	}
	// The proxies' rule renewals are granted in step with the heartbeat.
	grants := &routestatus.ValidityGrants{
		Member: mgr.GetClient(), MemberReader: mgr.GetAPIReader(), Hub: hub, Cluster: opts.ClusterName, Log: opts.Log.WithName("validity-grants"),
	}
	heartbeat := &membership.Heartbeat{
		Hub: hub, ClusterName: opts.ClusterName, Identity: opts.Identity,
		LeaseDuration: opts.LeaseDuration, RenewInterval: opts.RenewInterval, Witness: grants.Collect, Clock: opts.Clock,
		Log: opts.Log.WithName("heartbeat"),
	}
	if err := mgr.Add(&hubMembership{
		hub: hub, member: memberDiscovery, memberReader: mgr.GetAPIReader(), namespace: opts.Namespace, heartbeat: heartbeat, onAccepted: onAccepted, log: opts.Log.WithName("membership"),
	}); err != nil {
		return err
	}

	// Rules out: the status of every ShardRoute.
	if err := (&routestatus.Reconciler{Mode: mode, Clock: opts.Clock}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := labeler.AddToManager(mgr, labeler.ManagerOptions{
		Member: opts.Member, Mode: mode, Discovery: memberDiscovery, ClientConfig: opts.Webhook.ClientConfig,
		Period: opts.LabelPeriod, Registerer: ctrlmetrics.Registry, Log: opts.Log,
	}); err != nil {
		return err
	}
	if err := addInjection(mgr, opts); err != nil {
		return err
	}
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// selectorMode is opts.SelectorMode, or else the member API server's answer.
// The feature is the API server's, so any resource tells: Pods, which the
// agent's standing RBAC lists anyway (for the route status); it has no
// rights on the objects it labels before the hub grants them.
func selectorMode(ctx context.Context, opts Options, mapper meta.RESTMapper) (rules.Mode, error) {
	if opts.SelectorMode != "" {
		return opts.SelectorMode, nil
	}
	mode, err := proxy.DetectMode(ctx, opts.Member, mapper, schema.GroupResource{Resource: "pods"})
	if err != nil {
		return "", fmt.Errorf("agent: asking the member API server for its selector mode: %w", err)
	}
	return mode, nil
}

// addInjection serves the proxy injection webhook (every replica), records
// Events on the pods it skipped and on those whose ShardRoute was deleted,
// replaces the pods created without the proxy and writes its configuration
// (elected).
func addInjection(mgr manager.Manager, opts Options) error {
	proxyOpts := opts.Proxy
	proxyOpts.APIServer = mgr.GetAPIReader()
	handler, err := inject.NewHandler(mgr.GetCache(), proxyOpts, opts.Log.WithName("inject"))
	if err != nil {
		return err
	}
	mgr.GetWebhookServer().Register(InjectWebhookPath, handler)
	if err := (&inject.EventReconciler{}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&inject.Replacer{Pace: opts.ReplacePace, Registerer: ctrlmetrics.Registry}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&inject.RouteDeletedReconciler{}).SetupWithManager(mgr); err != nil {
		return err
	}
	cc := *opts.Webhook.ClientConfig.DeepCopy()
	if err := webhookutil.SetPath(&cc, InjectWebhookPath); err != nil {
		return err
	}
	want, err := inject.WebhookConfiguration(inject.WebhookOptions{
		ConfigurationName: InjectWebhookConfigurationName, WebhookName: InjectWebhookName, ClientConfig: cc,
	})
	if err != nil {
		return err
	}
	clientset, err := kubernetes.NewForConfig(opts.Member)
	if err != nil {
		return fmt.Errorf("agent: member clientset: %w", err)
	}
	keeper := webhookutil.NewConfigurationKeeper(InjectWebhookConfigurationName, clientset, opts.Log.WithName("inject"))
	keeper.Set(want)
	return mgr.Add(keeper)
}
