package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
)

// hubNamespace is where the hub runs and holds its leader Lease.
const hubNamespace = "ctrlmesh-system"

// scale is one point of the benchmark: member clusters and PerCluster
// ShardingConfigs, each config selecting every member.
type scale struct {
	clusters, configs int
}

func (s scale) String() string { return fmt.Sprintf("%d clusters x %d configs", s.clusters, s.configs) }

// result is what one run at one scale measured.
type result struct {
	scale
	pods  int
	works int
	// join is from the first Join to every ManagedCluster Available.
	join time.Duration
	// ready is from applying the ShardingConfigs to all of them Ready;
	// cpu and requests are the hub's over that time, rss and peak its
	// memory once Ready.
	ready     time.Duration
	readyDone bool
	cpu       float64
	rss, peak int64
	requests  map[string]float64
	// api is what the API server served meanwhile, by resource;
	// reconcileErrors the hub's failed reconciles by controller.
	api             *apiTraffic
	reconcileErrors map[string]float64
	// steady is the hub's requests per second at rest, over steadyWindow,
	// beside the members' heartbeat renewals per second.
	steadyWindow     time.Duration
	steady           map[string]float64
	heartbeatsPerSec float64
	steadyWorkWrites int
	// steadyEvents are the hub's Event writes at rest (each a POST or a
	// PATCH): the tail of the apply's, which its event broadcaster sends
	// behind its client's rate limit.
	steadyEvents int
	// podFailure is the time from a pod's failure to its config Ready
	// without it; podFailureWrites the Works written meanwhile.
	podFailure       time.Duration
	podFailureWrites []string
	// restart: the leader stopped (SIGTERM) and a pod failed at once: the
	// time until the standby leads and until the failure is healed, the
	// Works written meanwhile and those rewritten with the rules they had.
	restartLeads     time.Duration
	restartHealed    time.Duration
	restartWrites    []string
	restartUnchanged []string
	restartRSS       int64
	// fleetLoss is from a Fleet-scope member's last heartbeat to its
	// buckets served (Ready) by other members' pods.
	fleetLoss time.Duration
	// restHeap is the leader's live heap at rest, restHeapFile its heap
	// profile; leaderHeap and heapFile the new leader's once it healed.
	restHeap, leaderHeap   int64
	restHeapFile, heapFile string
	// ceiling is the API server's, measured before the hub started; nil
	// when not measured.
	ceiling *ceiling
	// startup is a hub's start with many Works, lists read whole and
	// streamed (-startup), or nil.
	startup *startup
}

type options struct {
	assets    string
	pods      int
	fleetSize int
	// namespace holds every PerCluster ShardingConfig; empty puts each
	// in a namespace of its own (configKey).
	namespace   string
	steady      time.Duration
	proxyDelay  time.Duration
	lease       time.Duration
	renew       time.Duration
	readyWithin time.Duration
	stepWithin  time.Duration
	workDir     string
	// ceilingWorks is how many Works the API server's ceiling is measured
	// with; 0 measures none.
	ceilingWorks int
	// startupWorks is how many Works a hub's start is measured with
	// (measureStartup); 0 measures none.
	startupWorks int
	// hubArgs are further flags of both hub replicas, hubMemoryLimit
	// their GOMEMLIMIT.
	hubArgs        []string
	hubMemoryLimit string
	// apiServerMemoryLimit is the GOMEMLIMIT of the hub cluster's
	// kube-apiserver and etcd; empty for none.
	apiServerMemoryLimit string
	log                  io.Writer
}

// bench is one run's hub cluster, hub replicas and simulated members.
type bench struct {
	opts   options
	scale  scale
	group  *controlplane.Group
	admin  client.Client
	cache  client.Reader
	hubBin string
	kubecf string
	hubs   []*hubProcess
	agent  *loadAgent
	kick   chan event.GenericEvent
	writes *workWrites
	logf   func(format string, args ...any)
}

// workWrites records every write of a Work's spec (creation, a new
// generation, deletion) the simulation's informer sees.
type workWrites struct {
	mu  sync.Mutex
	log []workWrite
}

type workWrite struct {
	at        time.Time
	key       string
	unchanged bool // a new generation carrying the rules hash it had
}

func (w *workWrites) add(key string, unchanged bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, workWrite{at: time.Now(), key: key, unchanged: unchanged})
}

// since returns the Works written since t, and those of them rewritten
// with the rules they had.
func (w *workWrites) since(t time.Time) (written, unchanged []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen, seenU := map[string]bool{}, map[string]bool{}
	for _, e := range w.log {
		if e.at.Before(t) {
			continue
		}
		seen[e.key] = true
		if e.unchanged {
			seenU[e.key] = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), slices.Sorted(maps.Keys(seenU))
}

func clusterName(i int) string { return fmt.Sprintf("m%04d", i) }
func configName(i int) string  { return fmt.Sprintf("op%04d", i) }

// configKey is the namespace and name of PerCluster ShardingConfig i: in
// the namespace of the options, or in one of its own.
func (o options) configKey(i int) types.NamespacedName {
	if o.namespace != "" {
		return types.NamespacedName{Namespace: o.namespace, Name: configName(i)}
	}
	return types.NamespacedName{Namespace: configName(i), Name: configName(i)}
}

// fleetConfig is the one Fleet-scope ShardingConfig, over the first
// fleetSize members.
var fleetConfig = types.NamespacedName{Namespace: "fleet-op", Name: "fleet-op"}

// startHubCluster starts the hub cluster's kube-apiserver and etcd with
// GOMEMLIMIT set to memoryLimit, unless empty. They inherit the
// benchmark's environment (envtest sets none of its own), so the variable
// is set only while they start. kube-apiserver holds every Work decoded
// (about 150 KB a Work of a few KB): at 100,000 Works the collector's
// default headroom of twice the live heap outgrew the machine's memory.
func startHubCluster(ctx context.Context, opts controlplane.Options, memoryLimit string) (*controlplane.Group, error) {
	if memoryLimit != "" {
		before, had := os.LookupEnv(memoryLimitEnv)
		if err := os.Setenv(memoryLimitEnv, memoryLimit); err != nil {
			return nil, err
		}
		defer func() {
			if had {
				_ = os.Setenv(memoryLimitEnv, before)
			} else {
				_ = os.Unsetenv(memoryLimitEnv)
			}
		}()
	}
	return controlplane.Start(ctx, opts)
}

// run measures one scale from a fresh hub cluster.
func run(ctx context.Context, opts options, s scale) (_ *result, err error) {
	b := &bench{opts: opts, scale: s, kick: make(chan event.GenericEvent, 1024), writes: &workWrites{}}
	b.logf = func(format string, args ...any) {
		fmt.Fprintf(opts.log, "%s [%s] %s\n", time.Now().Format("15:04:05"), s, fmt.Sprintf(format, args...))
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(opts.workDir, fmt.Sprintf("scale-%d-%d-", s.clusters, s.configs))
	if err != nil {
		return nil, err
	}
	if b.hubBin, err = buildHub(ctx, root, dir); err != nil {
		return nil, err
	}
	b.group, err = startHubCluster(ctx, controlplane.Options{
		Clusters:  []controlplane.Spec{{Name: "hub"}},
		AssetsDir: opts.assets, CRDDirs: controlplane.CRDDirs(root), WorkDir: dir,
	}, opts.apiServerMemoryLimit)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, b.group.Stop()) }()
	// The members' clients and the hub replicas end before the API server.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hubCluster := b.group.Cluster("hub")
	b.admin = hubCluster.Client
	var ceil *ceiling
	if opts.ceilingWorks > 0 {
		if ceil, err = measureCeiling(ctx, hubCluster.Config, b.group.Scheme, opts.ceilingWorks, opts.pods); err != nil {
			return nil, fmt.Errorf("the API server's ceiling: %w", err)
		}
		b.logf("API server ceiling, %d Works of %d bytes: %.0f creations/s, %.0f updates/s, %.0f status writes/s",
			ceil.works, ceil.bytes, ceil.creates, ceil.updates, ceil.statuses)
	}
	defer func() {
		for _, h := range b.hubs {
			_ = h.stop(30 * time.Second)
		}
	}()
	if err := b.startHubIdentity(ctx, hubCluster, dir); err != nil {
		return nil, err
	}
	var start *startup
	if opts.startupWorks > 0 {
		if start, err = b.measureStartup(ctx, opts.startupWorks, dir); err != nil {
			return nil, err
		}
	}
	if err := b.startHub(filepath.Join(dir, "hub-0.log")); err != nil {
		return nil, err
	}
	if err := b.startMembersSide(ctx, hubCluster.Config); err != nil {
		return nil, err
	}
	r := &result{scale: s, pods: opts.pods, ceiling: ceil, startup: start}
	if err := b.joinAll(ctx, r); err != nil {
		return r, err
	}
	if err := b.applyConfigs(ctx, r); err != nil {
		return r, err
	}
	if !r.readyDone {
		return r, nil
	}
	if err := b.steadyState(ctx, r); err != nil {
		return r, err
	}
	r.restHeapFile = filepath.Join(dir, "hub-0-rest.heap")
	if r.restHeap, err = b.hubs[0].heapProfile(ctx, r.restHeapFile); err != nil {
		b.logf("heap profile: %v", err)
		r.restHeapFile = ""
	}
	if err := b.podFailure(ctx, r); err != nil {
		return r, err
	}
	if err := b.restart(ctx, r, filepath.Join(dir, "hub-1.log")); err != nil {
		return r, err
	}
	r.heapFile = filepath.Join(dir, "hub-1.heap")
	if r.leaderHeap, err = b.hubs[1].heapProfile(ctx, r.heapFile); err != nil {
		b.logf("heap profile: %v", err)
		r.heapFile = ""
	}
	if err := b.fleetLoss(ctx, r); err != nil {
		return r, err
	}
	return r, nil
}

// startHubIdentity gives the hub its shipped RBAC (hub.RBAC, with
// --auto-accept) and a kubeconfig of its ServiceAccount's name.
func (b *bench) startHubIdentity(ctx context.Context, c *controlplane.Cluster, dir string) error {
	if err := b.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: hubNamespace}}); err != nil {
		return err
	}
	for _, obj := range hub.RBAC(hubNamespace, true) {
		if err := b.admin.Create(ctx, obj); err != nil {
			return fmt.Errorf("hub RBAC %T %s: %w", obj, obj.GetName(), err)
		}
	}
	cfg, err := c.AddUser("system:serviceaccount:"+hubNamespace+":"+hub.ServiceAccount, "system:serviceaccounts", "system:serviceaccounts:"+hubNamespace)
	if err != nil {
		return err
	}
	b.kubecf = filepath.Join(dir, "hub-serviceaccount.kubeconfig")
	return controlplane.WriteKubeconfig(cfg, b.kubecf)
}

func (b *bench) startHub(logPath string) error {
	h, err := startHub(b.hubBin, b.kubecf, hubNamespace, fmt.Sprintf("hub-%d", len(b.hubs)), logPath, b.opts.hubArgs, memoryEnv(b.opts.hubMemoryLimit))
	if err != nil {
		return err
	}
	b.hubs = append(b.hubs, h)
	return nil
}

// startMembersSide starts the simulation's own client: the load agent's
// controller over every Work, and an informer counting Work writes.
func (b *bench) startMembersSide(ctx context.Context, cfg *rest.Config) error {
	cfg = rest.CopyConfig(cfg)
	// A thousand agents, each with its own client: no client-side limit.
	cfg.QPS, cfg.Burst = -1, 0
	cfg.UserAgent = "scalebench-members"
	mgr, err := manager.New(cfg, manager.Options{
		Scheme: b.group.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		return err
	}
	b.agent = &loadAgent{client: mgr.GetClient(), reader: mgr.GetAPIReader(), pods: b.opts.pods, proxyDelay: b.opts.proxyDelay,
		members: map[string]*member{}, failed: map[string]bool{}, proxies: map[types.NamespacedName]*proxyState{}}
	err = builder.ControllerManagedBy(mgr).Named("load-agent").
		// One worker per member at least: each member's agent writes its
		// own Works' status, in parallel with the others. At 100 x 100 the
		// proxies' acknowledgements of 10,000 Works waited on 16 workers,
		// 26 status writes a second on the loaded API server.
		WithOptions(controller.Options{MaxConcurrentReconciles: max(16, b.scale.clusters), SkipNameValidation: ptrTrue()}).
		For(&workv1alpha1.Work{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(b.kick, &handler.EnqueueRequestForObject{})).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			after, err := b.agent.reconcile(ctx, req.NamespacedName)
			return reconcile.Result{RequeueAfter: after}, err
		}))
	if err != nil {
		return err
	}
	informer, err := mgr.GetCache().GetInformer(ctx, &workv1alpha1.Work{})
	if err != nil {
		return err
	}
	var synced atomic.Bool
	_, err = informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if synced.Load() {
				w := obj.(*workv1alpha1.Work)
				b.writes.add(w.Namespace+"/"+w.Name, false)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(*workv1alpha1.Work), newObj.(*workv1alpha1.Work)
			if o.Generation != n.Generation {
				b.writes.add(n.Namespace+"/"+n.Name, o.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation] == n.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation])
			}
		},
		DeleteFunc: func(obj any) {
			if w, ok := obj.(*workv1alpha1.Work); ok {
				b.writes.add(w.Namespace+"/"+w.Name, false)
			}
		},
	})
	if err != nil {
		return err
	}
	if _, err := mgr.GetCache().GetInformer(ctx, &ctrlmeshv1alpha1.ShardingConfig{}); err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			b.logf("members' manager: %v", err)
		}
	}()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return errors.New("the members' cache did not sync")
	}
	synced.Store(true)
	b.cache = mgr.GetCache()
	return nil
}

func ptrTrue() *bool { t := true; return &t }

// joinAll joins every member, 32 at a time, and waits for the hub to take
// them all as available.
func (b *bench) joinAll(ctx context.Context, r *result) error {
	start := time.Now()
	sem := make(chan struct{}, 32)
	errs := make(chan error, b.scale.clusters)
	var wg sync.WaitGroup
	for i := range b.scale.clusters {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			m, err := joinMember(ctx, b.admin, clusterName(i), i < b.opts.fleetSize, b.opts.lease, b.opts.renew)
			if err != nil {
				errs <- err
				return
			}
			b.agent.mu.Lock()
			b.agent.members[m.name] = m
			b.agent.mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	err := b.await(ctx, b.opts.readyWithin, "every ManagedCluster Available", func() (bool, string, error) {
		var list clusterv1.ManagedClusterList
		if err := b.cache.List(ctx, &list); err != nil {
			return false, "", err
		}
		n := 0
		for _, mc := range list.Items {
			if meta.IsStatusConditionTrue(mc.Status.Conditions, clusterv1.ManagedClusterConditionAvailable) {
				n++
			}
		}
		return n == b.scale.clusters, fmt.Sprintf("%d of %d available", n, b.scale.clusters), nil
	})
	r.join = time.Since(start)
	b.logf("%d members joined and available in %s", b.scale.clusters, r.join.Round(time.Millisecond))
	return err
}

// await polls check every 250 ms until it holds or within ends; a timeout is
// errTimeout with the last progress.
func (b *bench) await(ctx context.Context, within time.Duration, what string, check func() (bool, string, error)) error {
	deadline := time.Now().Add(within)
	lastLog := time.Now()
	for {
		// A replica that exits on its own (it lost its leader Lease, say)
		// ends the step: nothing restarts it here.
		if leader := b.hubs[len(b.hubs)-1]; leader.exited() != nil {
			return fmt.Errorf("%s: %w", what, leader.exited())
		}
		ok, progress, err := check()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %s: %s: %s", errTimeout, within, what, progress)
		}
		if time.Since(lastLog) > 30*time.Second {
			// The leader's memory beside the progress: a replica that
			// exits mid-step leaves its trajectory in the log, /proc no
			// longer has it.
			rss, peak, err := b.hubs[len(b.hubs)-1].memory()
			memory := fmt.Sprintf("hub RSS %d MiB (peak %d MiB)", rss>>20, peak>>20)
			if err != nil {
				memory = fmt.Sprintf("hub RSS not read: %v", err)
			}
			b.logf("waiting for %s: %s; %s", what, progress, memory)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

var errTimeout = errors.New("timed out")

func newConfig(ns, name string, scope ctrlmeshv1alpha1.ShardingScope, clusterLabel string) *ctrlmeshv1alpha1.ShardingConfig {
	return &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
			}}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{clusterLabel: "true"}}},
			Scope:    scope,
		},
	}
}

// configs are every ShardingConfig of the run: the PerCluster ones, each
// in a namespace of its own or all in one (-namespace), and the Fleet one.
func (b *bench) configs() []*ctrlmeshv1alpha1.ShardingConfig {
	var out []*ctrlmeshv1alpha1.ShardingConfig
	for i := range b.scale.configs {
		key := b.opts.configKey(i)
		out = append(out, newConfig(key.Namespace, key.Name, ctrlmeshv1alpha1.ScopePerCluster, memberLabel))
	}
	if b.opts.fleetSize > 0 {
		out = append(out, newConfig(fleetConfig.Namespace, fleetConfig.Name, ctrlmeshv1alpha1.ScopeFleet, fleetLabel))
	}
	return out
}

// isReady: Ready for its generation with every shard ready, and, when
// without is set, no shard on that pod (cluster/namespace/pod) or, for a
// cluster (cluster//), with buckets on that cluster.
func isReady(sc *ctrlmeshv1alpha1.ShardingConfig, without func(p ctrlmeshv1alpha1.ShardPlacement) bool) bool {
	if sc.Status.ObservedGeneration != sc.Generation || sc.Status.Shards == 0 || sc.Status.ReadyShards != sc.Status.Shards ||
		!meta.IsStatusConditionTrue(sc.Status.Conditions, ctrlmeshv1alpha1.ConditionReady) {
		return false
	}
	if without != nil {
		for _, p := range sc.Status.Placement {
			if without(p) {
				return false
			}
		}
	}
	return true
}

// applyConfigs creates the ShardingConfigs and waits until all are Ready.
func (b *bench) applyConfigs(ctx context.Context, r *result) error {
	configs := b.configs()
	for _, sc := range configs {
		if err := b.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sc.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	h := b.hubs[0]
	cpu0, err := h.cpuSeconds()
	if err != nil {
		return err
	}
	counts0, err := h.counters(ctx)
	if err != nil {
		return err
	}
	apiConfig := b.group.Cluster("hub").Config
	api0, err := scrapeAPITraffic(ctx, apiConfig)
	if err != nil {
		return err
	}
	start := time.Now()
	for _, sc := range configs {
		if err := b.admin.Create(ctx, sc); err != nil {
			return err
		}
	}
	err = b.await(ctx, b.opts.readyWithin, "every ShardingConfig Ready", func() (bool, string, error) {
		var list ctrlmeshv1alpha1.ShardingConfigList
		if err := b.cache.List(ctx, &list); err != nil {
			return false, "", err
		}
		n := 0
		for i := range list.Items {
			if isReady(&list.Items[i], nil) {
				n++
			}
		}
		return n == len(configs), fmt.Sprintf("%d of %d Ready", n, len(configs)), nil
	})
	r.ready = time.Since(start)
	r.readyDone = err == nil
	if errors.Is(err, errTimeout) {
		b.logf("%v", err)
		err = nil
	}
	if err != nil {
		return err
	}
	if r.cpu, err = h.cpuSeconds(); err != nil {
		return err
	}
	r.cpu -= cpu0
	if r.rss, r.peak, err = h.memory(); err != nil {
		return err
	}
	counts1, err := h.counters(ctx)
	if err != nil {
		return err
	}
	r.requests = diff(counts1.requests, counts0.requests)
	r.reconcileErrors = diff(counts1.reconcileErrors, counts0.reconcileErrors)
	api1, err := scrapeAPITraffic(ctx, apiConfig)
	if err != nil {
		return err
	}
	r.api = api1.since(api0)
	var works workv1alpha1.WorkList
	if err := b.cache.List(ctx, &works); err != nil {
		return err
	}
	r.works = len(works.Items)
	b.logf("Ready: %v after %s (%d Works), hub CPU %.1f s, RSS %d MiB (peak %d MiB), requests %v, failed reconciles %v; the API server: %s",
		r.readyDone, r.ready.Round(time.Millisecond), r.works, r.cpu, r.rss>>20, r.peak>>20, r.requests, r.reconcileErrors, r.api.summary(6))
	return nil
}

func diff(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range a {
		if d := v - b[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func total(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}

// steadyState counts the hub's requests at rest.
func (b *bench) steadyState(ctx context.Context, r *result) error {
	h := b.hubs[0]
	counts0, err := h.counters(ctx)
	if err != nil {
		return err
	}
	ev0, err := b.hubEventWrites(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(b.opts.steady):
	}
	counts1, err := h.counters(ctx)
	if err != nil {
		return err
	}
	r.steadyWindow = time.Since(start)
	r.steady = diff(counts1.requests, counts0.requests)
	r.heartbeatsPerSec = float64(b.scale.clusters) / b.opts.renew.Seconds()
	written, _ := b.writes.since(start)
	r.steadyWorkWrites = len(written)
	if ev1, err := b.hubEventWrites(ctx); err == nil {
		r.steadyEvents = ev1 - ev0
	}
	b.logf("at rest for %s: hub requests %v (%.2f/s), of them Event writes %d, heartbeats %.1f/s, Works written %d",
		r.steadyWindow.Round(time.Millisecond), r.steady, total(r.steady)/r.steadyWindow.Seconds(), r.steadyEvents, r.heartbeatsPerSec, r.steadyWorkWrites)
	return nil
}

// failPod fails pod 0 of config ci in cluster mi and tells the load agent.
func (b *bench) failPod(ci, mi int) (config types.NamespacedName, cluster, pod string) {
	config = b.opts.configKey(ci)
	cluster, pod = clusterName(mi), podName(config.Name, 0)
	b.agent.fail(cluster, config.Namespace, pod)
	work := &workv1alpha1.Work{}
	key := workKeyOf(config, cluster)
	work.Namespace, work.Name = key.Namespace, key.Name
	b.kick <- event.GenericEvent{Object: work}
	return config, cluster, pod
}

// awaitHealed waits until config is Ready with no shard on pod of cluster.
func (b *bench) awaitHealed(ctx context.Context, config types.NamespacedName, cluster, pod string) error {
	return b.await(ctx, b.opts.stepWithin, fmt.Sprintf("%s Ready without %s/%s", config, cluster, pod), func() (bool, string, error) {
		var sc ctrlmeshv1alpha1.ShardingConfig
		if err := b.cache.Get(ctx, config, &sc); err != nil {
			return false, "", err
		}
		return isReady(&sc, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
			return p.Cluster == cluster && slices.Contains(p.Pods, pod)
		}), fmt.Sprintf("ready shards %d of %d", sc.Status.ReadyShards, sc.Status.Shards), nil
	})
}

func (b *bench) podFailure(ctx context.Context, r *result) error {
	start := time.Now()
	config, cluster, pod := b.failPod(0, 0)
	if err := b.awaitHealed(ctx, config, cluster, pod); err != nil {
		return err
	}
	r.podFailure = time.Since(start)
	// Writes that follow the heal count too.
	time.Sleep(2 * time.Second)
	r.podFailureWrites, _ = b.writes.since(start)
	b.logf("pod failure healed in %s; Works written: %v", r.podFailure.Round(time.Millisecond), r.podFailureWrites)
	return nil
}

// restart starts a second replica, stops the leader (SIGTERM: it releases
// the Lease) and fails a pod at once: the new leader rebuilds its model
// from the Works and must heal the failure writing that one Work.
func (b *bench) restart(ctx context.Context, r *result, logPath string) error {
	if err := b.startHub(logPath); err != nil {
		return err
	}
	standby := b.hubs[1]
	if err := b.await(ctx, b.opts.stepWithin, "the standby replica serving metrics", func() (bool, string, error) {
		_, err := standby.counters(ctx)
		return err == nil, fmt.Sprint(err), nil
	}); err != nil {
		return err
	}
	start := time.Now()
	if err := b.hubs[0].stop(time.Minute); err != nil {
		b.logf("stopping the leader: %v", err)
	}
	config, cluster, pod := b.failPod(1%b.scale.configs, 1%b.scale.clusters)
	if err := b.await(ctx, b.opts.stepWithin, "the standby leading", func() (bool, string, error) {
		return standby.leads(ctx), "", nil
	}); err != nil {
		return err
	}
	r.restartLeads = time.Since(start)
	if err := b.awaitHealed(ctx, config, cluster, pod); err != nil {
		return err
	}
	r.restartHealed = time.Since(start)
	// The new leader reconciles every config after its start: let that
	// finish before counting.
	time.Sleep(b.opts.steady / 2)
	r.restartWrites, r.restartUnchanged = b.writes.since(start)
	r.restartRSS, _, _ = standby.memory()
	b.logf("restart: leads after %s, healed after %s; Works written %d %v, of them unchanged %d",
		r.restartLeads.Round(time.Millisecond), r.restartHealed.Round(time.Millisecond), len(r.restartWrites), firstN(r.restartWrites, 5), len(r.restartUnchanged))
	return nil
}

func firstN(s []string, n int) []string { return s[:min(len(s), n)] }

// fleetLoss stops the heartbeat and the reports of the Fleet config's first
// member, and waits until its buckets are served elsewhere.
func (b *bench) fleetLoss(ctx context.Context, r *result) error {
	if b.opts.fleetSize < 2 {
		return nil
	}
	lost := clusterName(0)
	b.agent.lose(lost)
	start := time.Now()
	err := b.await(ctx, b.opts.stepWithin+b.opts.lease*2, "the Fleet config's buckets off the lost member", func() (bool, string, error) {
		var sc ctrlmeshv1alpha1.ShardingConfig
		if err := b.cache.Get(ctx, fleetConfig, &sc); err != nil {
			return false, "", err
		}
		onLost := func(p ctrlmeshv1alpha1.ShardPlacement) bool { return p.Cluster == lost && p.Buckets != "" }
		// Ready stays False while a selected member is unavailable
		// (ClusterUnavailable): served elsewhere is every shard ready and
		// none on the lost member.
		served := sc.Status.ObservedGeneration == sc.Generation && sc.Status.Shards > 0 && sc.Status.ReadyShards == sc.Status.Shards &&
			!slices.ContainsFunc(sc.Status.Placement, onLost)
		return served, progress(&sc, onLost), nil
	})
	r.fleetLoss = time.Since(start)
	b.logf("Fleet member lost: buckets served elsewhere after %s (%v)", r.fleetLoss.Round(time.Millisecond), err)
	return err
}

func workKeyOf(config types.NamespacedName, cluster string) types.NamespacedName {
	return routework.WorkKey(cluster, config.Namespace, config.Name)
}

// progress tells why a ShardingConfig is not what a step waits for.
func progress(sc *ctrlmeshv1alpha1.ShardingConfig, unwanted func(p ctrlmeshv1alpha1.ShardPlacement) bool) string {
	out := fmt.Sprintf("generation %d observed %d, ready shards %d of %d", sc.Generation, sc.Status.ObservedGeneration, sc.Status.ReadyShards, sc.Status.Shards)
	for _, c := range sc.Status.Conditions {
		out += fmt.Sprintf("; %s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, p := range sc.Status.Placement {
		if unwanted(p) {
			out += fmt.Sprintf("; still %+v", p)
		}
	}
	return out
}

// hubEventWrites is the number of Event writes the hub made so far: the
// sum of the counts of its Events, each occurrence a POST or a PATCH.
func (b *bench) hubEventWrites(ctx context.Context) (int, error) {
	var events corev1.EventList
	if err := b.admin.List(ctx, &events); err != nil {
		return 0, err
	}
	n := 0
	for _, e := range events.Items {
		if e.Source.Component == ctrlmeshv1alpha1.HubComponent {
			n += int(e.Count)
		}
	}
	return n, nil
}
