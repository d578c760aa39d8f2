package labeler

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/webhookutil"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// Names of the labeling webhook: its MutatingWebhookConfiguration, which
// the elected agent writes from the targets, the webhook in it, and the path
// the agent serves it on.
const (
	WebhookConfigurationName = "ctrlmesh-agent-labeler"
	WebhookName              = "agent.ctrlmesh.io"
	WebhookPath              = "/label"
)

// targetsVersion is one state of the labeling targets.
type targetsVersion struct {
	targets Targets
	ok      bool
	refused []Refusal
	// routes maps each route the targets serve to the target resources its
	// limits name: those whose sweep its Labeled condition reports.
	routes map[types.NamespacedName][]schema.GroupVersionResource
	// changed is closed when a newer version replaces this one.
	changed chan struct{}
}

// targetWatcher keeps the labeling targets the member's ShardRoutes imply, on
// every agent replica: each serves the labeling webhook. It recomputes them
// when a ShardRoute changes and every period, since wildcards in the targets
// may match resources (CRDs) that appear later.
type targetWatcher struct {
	routes    cache.Cache
	discovery discovery.CachedDiscoveryInterface
	scopes    rules.Scopes
	period    time.Duration
	log       logr.Logger

	mu      sync.Mutex
	current *targetsVersion
	handler atomic.Pointer[Handler]
}

func newTargetWatcher(routes cache.Cache, d discovery.CachedDiscoveryInterface, scopes rules.Scopes, period time.Duration, log logr.Logger) *targetWatcher {
	return &targetWatcher{
		routes: routes, discovery: d, scopes: scopes, period: period, log: log,
		current: &targetsVersion{changed: make(chan struct{})},
	}
}

// NeedLeaderElection is false: every replica serves the webhook.
func (l *targetWatcher) NeedLeaderElection() bool { return false }

// Start follows the ShardRoutes until ctx ends.
func (l *targetWatcher) Start(ctx context.Context) error {
	informer, err := l.routes.GetInformer(ctx, &ctrlmeshv1alpha1.ShardRoute{})
	if err != nil {
		return fmt.Errorf("labeling: ShardRoute informer: %w", err)
	}
	kick := make(chan struct{}, 1)
	signal := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	reg, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { signal() },
		UpdateFunc: func(any, any) { signal() },
		DeleteFunc: func(any) { signal() },
	})
	if err != nil {
		return fmt.Errorf("labeling: ShardRoute handler: %w", err)
	}
	defer func() { _ = informer.RemoveEventHandler(reg) }()
	if !l.routes.WaitForCacheSync(ctx) {
		return nil
	}
	ticker := time.NewTicker(l.period)
	defer ticker.Stop()
	for {
		if err := l.recompute(ctx); err != nil {
			l.log.Error(err, "Computing the labeling targets failed; the previous targets stay")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		case <-ticker.C:
			// New CRDs may match wildcards.
			l.discovery.Invalidate()
		}
	}
}

func (l *targetWatcher) recompute(ctx context.Context) error {
	var routes ctrlmeshv1alpha1.ShardRouteList
	if err := l.routes.List(ctx, &routes); err != nil {
		return fmt.Errorf("listing ShardRoutes: %w", err)
	}
	served, err := ServedResources(l.discovery)
	if err != nil {
		if len(served) == 0 {
			return err
		}
		l.log.V(1).Info("Some API groups failed discovery", "error", err.Error())
	}
	next, ok, refused := TargetsForRoutes(routes.Items, served, l.scopes)
	byRoute := routeResources(routes.Items, refused, next.Resources, l.scopes)
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok == l.current.ok && reflect.DeepEqual(next, l.current.targets) && sameRefusals(refused, l.current.refused) &&
		reflect.DeepEqual(byRoute, l.current.routes) {
		return nil
	}
	var handler *Handler
	if ok {
		if handler, err = NewHandler(next, l.log.WithName("webhook")); err != nil {
			return err
		}
	}
	l.handler.Store(handler)
	previous := l.current
	l.current = &targetsVersion{targets: next, ok: ok, refused: refused, routes: byRoute, changed: make(chan struct{})}
	close(previous.changed)
	l.log.V(1).Info("Labeling targets changed", "resources", len(next.Resources), "buckets", next.Space.Buckets(), "refused", len(refused))
	return nil
}

// sameRefusals compares refusals by route identity, generation and reason.
func sameRefusals(a, b []Refusal) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Route.UID != b[i].Route.UID || a[i].Route.Generation != b[i].Route.Generation || a[i].Reason != b[i].Reason {
			return false
		}
	}
	return true
}

// Current returns the targets now in force.
func (l *targetWatcher) Current() *targetsVersion {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.current
}

// ServeHTTP serves the labeling webhook with the current targets. Without
// targets the elected agent has removed the webhook configuration; a request
// that still arrives fails, and the API server, whose failurePolicy for this
// webhook is Ignore, admits the object unlabeled for the sweep to mend.
func (l *targetWatcher) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := l.handler.Load()
	if h == nil {
		http.Error(w, "no labeling targets in this cluster yet", http.StatusServiceUnavailable)
		return
	}
	h.ServeHTTP(w, r)
}

// labelSweeper runs on the elected agent: it sweeps with the current targets
// in label mode, keeps the labeling webhook's configuration equal to the
// targets, and records an Event on every refused ShardRoute.
type labelSweeper struct {
	targets *targetWatcher
	dynamic dynamic.Interface
	// routes writes the Labeled condition of the ShardRoutes, read fresh
	// from routesReader.
	routes       client.Client
	routesReader client.Reader
	// webhook keeps the labeling webhook configuration.
	webhook  *webhookutil.ConfigurationKeeper
	recorder record.EventRecorder
	// mode is the member API server's selector mode: labels are written in
	// rules.ModeLabel only.
	mode         rules.Mode
	clientConfig admissionregistrationv1.WebhookClientConfig
	period       time.Duration
	registerer   prometheus.Registerer
	log          logr.Logger

	// refusalsRecorded holds the refusals already recorded as Events.
	refusalsRecorded map[refusalKey]bool
}

type refusalKey struct {
	uid        types.UID
	generation int64
	reason     string
}

// NeedLeaderElection is true: one sweeper per cluster.
func (s *labelSweeper) NeedLeaderElection() bool { return true }

// Start follows the targets until ctx ends.
func (s *labelSweeper) Start(ctx context.Context) error {
	s.refusalsRecorded = map[refusalKey]bool{}
	var running runningLabeler
	defer running.stop()
	for {
		version := s.targets.Current()
		s.recordRefusals(version.refused)
		running.stop()
		label := version.ok && s.mode == rules.ModeLabel
		if want, err := s.webhookConfiguration(version, label); err != nil {
			s.log.Error(err, "Building the labeling webhook configuration failed; the sweep labels objects meanwhile")
		} else {
			s.webhook.Set(want)
		}
		if label {
			l, err := New(Options{
				Targets: version.targets, Client: s.dynamic, Registerer: s.registerer, Log: s.log, Period: s.period,
				OnSweep: func(res SweepResult) { s.reportSweep(ctx, version.routes, res) },
			})
			if err != nil {
				s.log.Error(err, "Starting the labeler failed")
			} else {
				running.start(ctx, l)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-version.changed:
		}
	}
}

// runningLabeler is the Labeler of the targets in force, if any.
type runningLabeler struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *runningLabeler) start(ctx context.Context, l *Labeler) {
	ctx, r.cancel = context.WithCancel(ctx)
	r.done = make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		_ = l.Run(ctx)
	}(r.done)
}

// stop stops the Labeler and waits for it: two never sweep at once.
func (r *runningLabeler) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.done
	r.cancel, r.done = nil, nil
}

// webhookConfiguration is the labeling webhook configuration for the
// targets, or nil when nothing is labeled.
func (s *labelSweeper) webhookConfiguration(version *targetsVersion, label bool) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	if !label {
		return nil, nil
	}
	cc := *s.clientConfig.DeepCopy()
	if err := webhookutil.SetPath(&cc, WebhookPath); err != nil {
		return nil, err
	}
	return version.targets.WebhookConfiguration(WebhookOptions{
		ConfigurationName: WebhookConfigurationName, WebhookName: WebhookName, ClientConfig: cc,
	})
}

// recordRefusals records each refusal once as a Warning Event on its route.
func (s *labelSweeper) recordRefusals(refused []Refusal) {
	for _, r := range refused {
		key := refusalKey{uid: r.Route.UID, generation: r.Route.Generation, reason: r.Reason}
		if s.refusalsRecorded[key] {
			continue
		}
		s.refusalsRecorded[key] = true
		s.recorder.Event(r.Route, corev1.EventTypeWarning, r.Reason, r.Message)
	}
}

// ManagerOptions configure the labeling parts AddToManager adds.
type ManagerOptions struct {
	// Member is the member cluster, with the agent's credentials: the sweep's
	// dynamic client is made from it.
	Member *rest.Config
	// Mode is the member API server's selector mode: labels are written in
	// rules.ModeLabel only.
	Mode rules.Mode
	// Discovery of the member, for the served resources wildcards expand to.
	Discovery discovery.DiscoveryInterface
	// ClientConfig is how the member API server reaches the agent's webhook
	// server, without a path.
	ClientConfig admissionregistrationv1.WebhookClientConfig
	// Period between sweeps; zero for DefaultPeriod.
	Period     time.Duration
	Registerer prometheus.Registerer
	Log        logr.Logger
}

// AddToManager adds the labeling targets (every replica, serving the
// webhook at WebhookPath) and the sweeper (elected) to mgr.
func AddToManager(mgr manager.Manager, opts ManagerOptions) error {
	// The labeler paces its sweep with its own limiter (DefaultQPS);
	// client-go's default of 5 requests per second under it would make a
	// sweep of a few hundred objects take a minute.
	sweepConfig := rest.CopyConfig(opts.Member)
	sweepConfig.QPS = -1
	dyn, err := dynamic.NewForConfig(sweepConfig)
	if err != nil {
		return fmt.Errorf("labeler: dynamic client: %w", err)
	}
	period := opts.Period
	if period <= 0 {
		period = DefaultPeriod
	}
	watcher := newTargetWatcher(mgr.GetCache(), memory.NewMemCacheClient(opts.Discovery), rules.NewMapperScopes(mgr.GetRESTMapper()), period, opts.Log.WithName("labeling"))
	if err := mgr.Add(watcher); err != nil {
		return err
	}
	mgr.GetWebhookServer().Register(WebhookPath, watcher)
	clientset, err := kubernetes.NewForConfig(opts.Member)
	if err != nil {
		return fmt.Errorf("labeler: clientset: %w", err)
	}
	keeper := webhookutil.NewConfigurationKeeper(WebhookConfigurationName, clientset, opts.Log.WithName("labeler"))
	if err := mgr.Add(keeper); err != nil {
		return err
	}
	return mgr.Add(&labelSweeper{
		targets: watcher, dynamic: dyn, routes: mgr.GetClient(), routesReader: mgr.GetAPIReader(),
		webhook: keeper, recorder: mgr.GetEventRecorderFor(ctrlmeshv1alpha1.AgentComponent),
		mode: opts.Mode, clientConfig: opts.ClientConfig, period: period, registerer: opts.Registerer,
		log: opts.Log.WithName("labeler"),
	})
}
