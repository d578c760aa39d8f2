// Package hub is ctrlmesh's hub: on the control cluster it keeps the member
// clusters (hub/clusters), places every ShardingConfig's shards and
// publishes their rules as Karmada Works (hub/shardingconfig, with
// hub/placement and hub/propagation), in one controller-runtime manager
// whose replicas elect a leader. Its working model (hub/state) is an
// in-memory go-memdb database rebuilt from the API objects at every start.
package hub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/clusters"
	"github.com/ctrlmesh/ctrlmesh/hub/placementmap"
	"github.com/ctrlmesh/ctrlmesh/hub/policystatus"
	"github.com/ctrlmesh/ctrlmesh/hub/propagation"
	"github.com/ctrlmesh/ctrlmesh/hub/shardingconfig"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/leaderelection"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
)

// WatchListEnv is client-go's environment variable for its WatchListClient
// feature: ctrlmesh-hub turns the feature on, its informers streaming their
// lists, unless the variable is set.
const WatchListEnv = "KUBE_FEATURE_" + string(clientfeatures.WatchListClient)

// LeaderElectionID is the Lease the hub's replicas elect their leader with.
const LeaderElectionID = "ctrlmesh-hub"

// Defaults of Options.QPS and Options.Burst. The hub writes one Work per
// ShardingConfig and member, and each placement change of a config
// rewrites the Works of the members it touches: client-go's own default (5
// requests per second, bursts of 10) made 100 configs over 100 members
// (10,000 Works) take most of an hour to place (make bench-scale).
const (
	DefaultQPS   = 200
	DefaultBurst = 400
)

// clientConfig is the hub's client configuration: opts.Config with the
// client-side limits of opts.
func clientConfig(opts Options) *rest.Config {
	cfg := rest.CopyConfig(opts.Config)
	cfg.QPS, cfg.Burst = opts.QPS, opts.Burst
	if cfg.QPS == 0 {
		cfg.QPS = DefaultQPS
	}
	if cfg.Burst == 0 {
		cfg.Burst = DefaultBurst
	}
	return cfg
}

// Options of a running hub.
type Options struct {
	// Config is the hub cluster, with the hub's credentials.
	Config *rest.Config
	// AutoAccept accepts every member that joins; otherwise an admin sets
	// spec.hubAcceptsClient of its ManagedCluster.
	AutoAccept bool
	// KarmadaFinalizer puts Karmada's execution finalizer on the Works, as
	// Karmada does; only where Karmada's controllers run (see
	// propagation.Writer).
	KarmadaFinalizer bool
	// RulesValidity is the validity of Fleet-scope rules (see
	// route.FleetValidity, the default): whole seconds from 5 s to 1 h.
	// Shorter moves a lost member's buckets sooner; longer lets members
	// ride out longer hub or network outages without their proxies
	// stopping.
	RulesValidity time.Duration
	// LeaderElection among replicas, with the Lease in Namespace.
	LeaderElection bool
	Namespace      string
	// LeaseDuration, RenewDeadline and RetryPeriod of the leader election;
	// zero takes controller-runtime's (15 s, 10 s, 2 s: those of Kubernetes'
	// own components). The leader steps down when it could not renew
	// within RenewDeadline, each request timing out after half of it: a
	// longer one rides out a slower API server, a longer LeaseDuration
	// makes a crashed leader's successor wait longer.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// MetricsAddress and HealthAddress; "0" disables.
	MetricsAddress, HealthAddress string
	// QPS and Burst limit the hub's requests to the hub cluster on its
	// side (client-go's rate limiter); zero takes DefaultQPS and
	// DefaultBurst, a negative QPS sets no limit (the API server's
	// priority and fairness still applies).
	QPS   float32
	Burst int
	// PprofAddress serves Go's profiles (net/http/pprof) when set; empty
	// or "0" serves none.
	PprofAddress string
	// PlacementMap serves the read-only placement map (hub/placementmap)
	// at placementmap.Path on MetricsAddress.
	PlacementMap bool
	Log          logr.Logger
}

// Run runs the hub until ctx ends.
func Run(ctx context.Context, opts Options) error {
	if opts.Config == nil {
		return errors.New("hub: a config of the hub cluster is required")
	}
	if opts.LeaderElection && opts.Namespace == "" {
		return errors.New("hub: leader election needs the hub's namespace")
	}
	if opts.RulesValidity == 0 {
		opts.RulesValidity = route.FleetValidity
	}
	if opts.RulesValidity < 5*time.Second || opts.RulesValidity > time.Hour || opts.RulesValidity%time.Second != 0 {
		return fmt.Errorf("hub: rules validity %s: it must be whole seconds from 5s to 1h (spec.validitySeconds of the ShardRoutes)", opts.RulesValidity)
	}
	if err := checkLeaderElection(opts); err != nil {
		return err
	}
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		return err
	}
	cfg := clientConfig(opts)
	cacheOpts, err := CacheOptions(cfg, scheme)
	if err != nil {
		return err
	}
	mgr, err := manager.New(cfg, manager.Options{
		Scheme: scheme, Logger: opts.Log,
		Cache:          cacheOpts,
		LeaderElection: opts.LeaderElection, LeaderElectionID: LeaderElectionID, LeaderElectionNamespace: opts.Namespace,
		// Renewals wait on neither the controllers' limit nor their
		// connection: at 100 configs over 100 members the hub lost its
		// Lease while writing Works (make bench-scale).
		LeaderElectionConfig: leaderelection.Config(cfg, ctrlmeshv1alpha1.HubComponent),
		LeaseDuration:        nonZero(opts.LeaseDuration), RenewDeadline: nonZero(opts.RenewDeadline), RetryPeriod: nonZero(opts.RetryPeriod),
		// A new leader must not publish before the old one stopped.
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: opts.MetricsAddress},
		HealthProbeBindAddress:        opts.HealthAddress,
		PprofBindAddress:              opts.PprofAddress,
		// Controller names are unique within one hub; Run may run again in
		// the same process (tests).
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return fmt.Errorf("hub: manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	store, err := state.New()
	if err != nil {
		return err
	}
	changes := make(chan event.GenericEvent)
	if err := (&clusters.Reconciler{Store: store, Options: clusters.Options{AutoAccept: opts.AutoAccept, Changes: changes, RulesValidity: opts.RulesValidity}}).SetupWithManager(mgr); err != nil {
		return err
	}
	metrics, err := shardingconfig.NewMetrics(ctrlmetrics.Registry)
	if err != nil {
		return err
	}
	if err := propagation.IndexByConfig(ctx, mgr.GetCache()); err != nil {
		return fmt.Errorf("hub: indexing Works: %w", err)
	}
	writer := &propagation.Writer{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Indexed: true, KarmadaFinalizer: opts.KarmadaFinalizer}
	configs := &shardingconfig.Reconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Writer: writer,
		Store: store, ClusterChanges: changes, Recorder: mgr.GetEventRecorderFor(ctrlmeshv1alpha1.HubComponent), Metrics: metrics,
		RulesValidity: opts.RulesValidity,
	}
	if err := configs.SetupWithManager(mgr); err != nil {
		return err
	}
	if opts.PlacementMap && opts.MetricsAddress != "0" {
		if err := mgr.AddMetricsServerExtraHandler(placementmap.Path, &placementmap.Handler{Reader: mgr.GetAPIReader()}); err != nil {
			return fmt.Errorf("hub: placement map: %w", err)
		}
	}
	if err := policystatus.SetupCircuitBreakers(mgr, store, writer); err != nil {
		return err
	}
	if err := policystatus.SetupFaultInjections(mgr, store, writer); err != nil {
		return err
	}
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	return nil
}

// CacheOptions are the options of the hub's cache. Cached objects are
// without their managedFields: the hub never reads them, and they grow
// with every manager writing an object (the Works' manifests and status
// are tracked field by field). An update from the cache omits them, and
// the API server then keeps its own (TestWriterThroughLeanCache). Works
// are without their manifests either, decoded without them, and with one
// copy of the strings they repeat (propagation.CacheOptions);
// ShardingConfigs without their status's placement
// (shardingconfig.CacheTransform).
func CacheOptions(cfg *rest.Config, scheme *runtime.Scheme) (cache.Options, error) {
	opts, err := propagation.CacheOptions(cfg, scheme)
	if err != nil {
		return cache.Options{}, fmt.Errorf("hub: %w", err)
	}
	opts.ByObject = map[client.Object]cache.ByObject{
		&ctrlmeshv1alpha1.ShardingConfig{}: {Transform: shardingconfig.CacheTransform},
	}
	return opts, nil
}

// Defaults of Options.LeaseDuration, RenewDeadline and RetryPeriod:
// controller-runtime's, and Kubernetes' own components'.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// checkLeaderElection refuses leader-election timing client-go's elector
// would refuse at start, saying which flags to change: the lease must
// outlast the renew deadline (the margin covers clock drift between
// replicas), and the deadline must leave room for retries.
func checkLeaderElection(opts Options) error {
	lease, renew, retry := cmp.Or(opts.LeaseDuration, DefaultLeaseDuration), cmp.Or(opts.RenewDeadline, DefaultRenewDeadline), cmp.Or(opts.RetryPeriod, DefaultRetryPeriod)
	if lease < 0 || renew < 0 || retry < 0 {
		return fmt.Errorf("hub: negative leader-election timing (lease %s, renew deadline %s, retry period %s)", lease, renew, retry)
	}
	if lease <= renew {
		return fmt.Errorf("hub: the leader-election lease duration %s must be longer than the renew deadline %s (--leader-elect-lease-duration, --leader-elect-renew-deadline)", lease, renew)
	}
	if float64(renew) <= leaderelectionJitter*float64(retry) {
		return fmt.Errorf("hub: the leader-election renew deadline %s must be longer than %.1f× the retry period %s (--leader-elect-renew-deadline, --leader-elect-retry-period)", renew, leaderelectionJitter, retry)
	}
	return nil
}

// leaderelectionJitter is client-go's leaderelection.JitterFactor.
const leaderelectionJitter = 1.2

func nonZero(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}
