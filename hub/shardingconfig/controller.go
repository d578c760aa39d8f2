// Package shardingconfig is the hub's ShardingConfig controller: for each
// ShardingConfig it reads its Works back into the hub's working model
// (hub/state) — the rules published to each cluster and what the members'
// agents reflected into the Works' status: candidate pods, the rules each
// proxy enforces, shard leaders — then selects the member clusters, computes
// the desired placement per placement domain (hub/placement), moves buckets
// by revoke-before-grant, publishes the rules as one Work per cluster
// (hub/propagation) and reports placement and health in the ShardingConfig's
// status. Placement, handover and status read their inputs from one
// Snapshot of the working model.
//
// The published Works are the truth about what was published: the working
// model is rebuilt from them at the start of every reconcile, before
// anything is published, so a restarted hub computes the same placement and
// moves nothing.
package shardingconfig

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
	"github.com/ctrlmesh/ctrlmesh/hub/propagation"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// ControllerName names the controller in logs, metrics and Events.
const ControllerName = "shardingconfig"

// Workers is how many ShardingConfigs are reconciled at once. A reconcile
// spends its time waiting on the API server, writing the Works of its
// members one after the other: with one worker, 100 configs over 100
// members queued behind each other for half an hour (make bench-scale).
// Reconciles of one config never overlap (the controller's queue); those
// of different configs share only the working model, whose writes are
// transactions, and the overlap and unproxied-pod records, which lock.
const Workers = 8

// Reconciler reconciles ShardingConfigs.
type Reconciler struct {
	// Client reads ShardingConfigs and Works (from the cache) and writes
	// ShardingConfigs' status and finalizer.
	Client client.Client
	// Reader reads from the API server what the cache does not hold: the
	// placement of a config's status, when the hub did not write it last
	// (CacheTransform).
	Reader client.Reader
	// Writer writes the Works.
	Writer *propagation.Writer
	// Store is the hub's working model: the clusters controller keeps its
	// clusters, this controller the rows of each ShardingConfig.
	Store *state.Store
	// ClusterChanges, when set, receives an event for each cluster whose
	// record changed (see hub/clusters Options.Changes): every
	// ShardingConfig is reconciled then.
	ClusterChanges <-chan event.GenericEvent
	Recorder       record.EventRecorder
	// Clock times the canary's healthy period and the grace of pods whose
	// proxy has not reported.
	Clock clock.PassiveClock
	// RulesValidity is the validity of rules in Fleet scope; default
	// route.FleetValidity. The clusters controller must judge heartbeats
	// by the same (clusters.Options.RulesValidity).
	RulesValidity time.Duration

	// StatusBytesPerSecond is how many bytes of ShardingConfig status are
	// written per second at most, all configs together, but for news;
	// default DefaultStatusBytesPerSecond.
	StatusBytesPerSecond int

	unproxied unproxiedPods
	// overlapsTold is the overlap last told in an Event, by config.
	overlapsTold lastTold[string]
	// peerChanges carries the configs whose view changed to the others of
	// their namespace (tellPeers); peersTold is the view last told.
	peerChanges  chan event.GenericEvent
	peersTold    lastTold[uint64]
	statusWrites statusWrites
	Metrics      *Metrics
}

// SetupWithManager registers the controller with mgr.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil || r.Reader == nil || r.Writer == nil || r.Store == nil || r.Recorder == nil || r.Metrics == nil {
		return errors.New("shardingconfig: client, reader, writer, store, recorder and metrics are required")
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.RulesValidity == 0 {
		r.RulesValidity = route.FleetValidity
	}
	if r.StatusBytesPerSecond == 0 {
		r.StatusBytesPerSecond = DefaultStatusBytesPerSecond
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WithOptions(controller.Options{MaxConcurrentReconciles: Workers}).
		For(&ctrlmeshv1alpha1.ShardingConfig{}).
		Watches(&workv1alpha1.Work{}, handler.EnqueueRequestsFromMapFunc(configOfWork)).
		Watches(&ctrlmeshv1alpha1.CircuitBreaker{}, handler.EnqueueRequestsFromMapFunc(r.configsOfPolicy)).
		Watches(&ctrlmeshv1alpha1.FaultInjection{}, handler.EnqueueRequestsFromMapFunc(r.configsOfPolicy))
	if r.ClusterChanges != nil {
		b = b.WatchesRawSource(source.Channel(r.ClusterChanges, handler.EnqueueRequestsFromMapFunc(r.allConfigs)))
	}
	r.peerChanges = make(chan event.GenericEvent, peerChangesBuffer)
	b = b.WatchesRawSource(source.Channel(r.peerChanges, r.peers()))
	return b.Complete(r)
}

// configOfWork maps a Work to the ShardingConfig it carries rules of. The
// other configs of its namespace, whose overlaps read the pods its status
// reports, learn of them through the model once that config read them
// back (tellPeers).
func configOfWork(_ context.Context, obj client.Object) []reconcile.Request {
	config, ok := propagation.ConfigOf(obj)
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: config}}
}

// peerChangesBuffer is how many configs' changed views wait for the
// controller's queue before their reconciles block on telling.
const peerChangesBuffer = 1024

// allConfigs maps a cluster change to every ShardingConfig: which select the
// cluster is theirs to tell, and they are few. Their statuses are not:
// a status lists every shard in every cluster (660 KB a config at 1000
// clusters), and a cluster changes at every heartbeat. The mappers and
// overlaps read the cache's own objects (UnsafeDisableDeepCopy), never
// writing them, rather than a copy of every status each time
// (TestMappersCopyNoStatus).
func (r *Reconciler) allConfigs(ctx context.Context, _ client.Object) []reconcile.Request {
	var list ctrlmeshv1alpha1.ShardingConfigList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "Listing ShardingConfigs after a cluster change failed")
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, sc := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sc)})
	}
	return out
}

// Reconcile brings one ShardingConfig's Works and status up to date.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var sc ctrlmeshv1alpha1.ShardingConfig
	if err := r.Client.Get(ctx, req.NamespacedName, &sc); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		// Gone without passing finalize (its finalizer was removed by
		// hand): its rows must not outlive it.
		if err := r.Store.DeleteConfig(req.NamespacedName); err != nil {
			return reconcile.Result{}, fmt.Errorf("forgetting the deleted ShardingConfig: %w", err)
		}
		r.statusWrites.forget(req.NamespacedName)
		r.tellPeers(ctx, req.NamespacedName, nil)
		return reconcile.Result{}, nil
	}
	// Whatever the reconcile did to the config's rows, even when it failed
	// halfway, the other configs of its namespace are told.
	defer r.tellPeers(ctx, req.NamespacedName, &sc)
	if !sc.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.finalize(ctx, &sc)
	}
	if controllerutil.AddFinalizer(&sc, ctrlmeshv1alpha1.ShardingConfigFinalizer) {
		if err := r.Client.Update(ctx, &sc); err != nil {
			return reconcile.Result{}, fmt.Errorf("adding the finalizer: %w", err)
		}
	}
	written, err := r.writtenPlacement(ctx, &sc)
	if err != nil {
		return reconcile.Result{}, err
	}
	start := r.Clock.Now()
	// The canary moves on from what the last placement achieved, before
	// this placement, so that the status never shows a step its placement
	// does not serve.
	canary := sc.Status.DeepCopy()
	requeue := r.advanceCanary(&sc, canary, written.canaryHealthy, start)
	outcome, err := r.place(ctx, &sc, canary.Canary)
	if errors.Is(err, errStoreBehind) {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	r.Metrics.observe(&sc, outcome, r.Clock.Since(start))
	if err != nil {
		return reconcile.Result{}, err
	}
	if message := overlapMessage(outcome.overlaps); r.overlapsTold.news(req.NamespacedName, message) && message != "" {
		r.Recorder.Event(&sc, corev1.EventTypeWarning, ctrlmeshv1alpha1.ReasonSelectorOverlap, message)
	}
	overdue, untold, next := r.unproxied.observe(req.NamespacedName, readyWithoutProxy(outcome.members), start)
	outcome.unproxied = overdue
	for _, p := range untold {
		r.Recorder.Eventf(&sc, corev1.EventTypeWarning, ctrlmeshv1alpha1.ReasonPodsWithoutProxy,
			"Pod %s is ready but its ctrlmesh proxy has not reported for %s: it gets no buckets, and without a proxy its operator sees every shard's objects. "+
				"If it was admitted without the sidecar (see its %s annotation), delete it so that it is created again with the proxy.",
			p, proxyReportGrace, ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation)
	}
	for _, at := range []time.Time{next, outcome.recheck} {
		if !at.IsZero() && (requeue == 0 || at.Sub(start) < requeue) {
			requeue = max(at.Sub(start), time.Millisecond)
		}
	}
	status, wait, err := r.writeStatus(ctx, &sc, outcome, canary.Canary, written)
	if err != nil {
		return reconcile.Result{}, err
	}
	if wait > 0 && (requeue == 0 || wait < requeue) {
		requeue = wait
	}
	r.Metrics.serving.observeStatus(&sc, outcome, status, r.Clock.Now())
	return reconcile.Result{RequeueAfter: requeue}, nil
}

// finalize deletes the ShardingConfig's Works and rows and then lets it go.
func (r *Reconciler) finalize(ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig) error {
	// A config being deleted is never placed again: nothing reads its rows.
	r.unproxied.forget(client.ObjectKeyFromObject(sc))
	r.overlapsTold.forget(client.ObjectKeyFromObject(sc))
	r.statusWrites.forget(client.ObjectKeyFromObject(sc))
	if err := r.Store.DeleteConfig(client.ObjectKeyFromObject(sc)); err != nil {
		return fmt.Errorf("forgetting the ShardingConfig being deleted: %w", err)
	}
	if !controllerutil.ContainsFinalizer(sc, ctrlmeshv1alpha1.ShardingConfigFinalizer) {
		return nil
	}
	if _, err := r.Writer.Prune(ctx, sc, nil); err != nil {
		return fmt.Errorf("deleting the Works: %w", err)
	}
	works, err := r.Writer.List(ctx, sc)
	if err != nil {
		return err
	}
	if len(works) > 0 {
		// Karmada's finalizer keeps them until the members let go; their
		// deletion is an event that brings the ShardingConfig back here.
		return nil
	}
	controllerutil.RemoveFinalizer(sc, ctrlmeshv1alpha1.ShardingConfigFinalizer)
	if err := r.Client.Update(ctx, sc); err != nil {
		return fmt.Errorf("removing the finalizer: %w", err)
	}
	r.Metrics.forget(sc)
	return nil
}

// member is what the working model holds of one selected cluster for a
// config, from one Snapshot.
type member struct {
	cluster state.Cluster
	// published is what was published to it; nil before the first publish.
	published *state.Published
	// report is what its agent last reflected into the Work; nil before any.
	report *state.Report
	// leaving: the cluster is no longer selected, but in Fleet scope its
	// pods are in the rules until they let go (see left).
	leaving bool
	// enforcesAtLeast is a generation every proxy of the member that
	// serves at all enforces, or a newer one, whatever its agent reports
	// (see outlived); 0 when the hub knows none.
	enforcesAtLeast int64
}

// usable: the cluster is accepted and its heartbeat is fresh, and it is
// still selected.
func (m *member) usable() bool { return !m.leaving && m.cluster.Usable() }

// left reports whether a leaving cluster is done: the rules published to it
// give its pods no shard, and each of its proxies enforces them — or its
// heartbeat lapsed, so that none serves rules that expire. Its Work can go.
func (m *member) left() bool {
	if m.cluster.HeartbeatLapsed {
		return true
	}
	route := m.route()
	if slices.ContainsFunc(route.Spec.Shards, func(s ctrlmeshv1alpha1.RouteShard) bool { return len(s.Pods) > 0 }) {
		return false
	}
	if m.report == nil {
		// What its proxies enforce is unknown: pruning now would let the
		// buckets they may still serve go elsewhere. Its agent reports, or
		// its heartbeat lapses.
		return false
	}
	for _, p := range m.report.Pods {
		if p.AppliedRulesHash == "" {
			// No proxy: it never served rules.
			continue
		}
		if gen, ok := m.generationOf(p.AppliedRulesHash); !ok || gen < route.Spec.RoutingGeneration {
			return false
		}
	}
	return true
}

// outlived sets enforcesAtLeast of a member outside the domain (unusable,
// or leaving) in Fleet scope whose heartbeat has not lapsed, and returns
// when that will next grow; zero for never. Such a member's agent
// heartbeats, but the member may take no new rules — as when Karmada's
// Cluster for it is not Ready and nothing applies its Work — so its agent's
// report is stale and its proxies may never acknowledge the revocation the
// hub published to it first: their buckets would wait forever.
//
// They need not acknowledge it. An agent grants a renewal of rules only
// after a fresh read of the member's Work on the hub shows the member holds
// the very rules the Work carries (routestatus.ValidityGrants), and a proxy
// renews only the rules in force whose hash the grant came beside
// (proxy.Proxy.Renew). So once the Work carries generation g, every renewal
// granted is of rules of g or newer, and every validity granted before,
// counted from a request sent before the agent read the Work, ends before
// the hub knew the Work to carry g plus the validity. After
// route.LapseBound(validity) from when the hub knew it
// (state.Revision.Since), on the hub's clock with room for clock rates,
// every proxy of the member serves rules of g or newer, or nothing: as good
// as an acknowledgement of g.
func (m *member) outlived(now time.Time, validity time.Duration) time.Time {
	if m.usable() || m.cluster.HeartbeatLapsed || m.published == nil {
		return time.Time{}
	}
	bound := route.LapseBound(validity)
	gen, next := m.published.CarriedAt(now.Add(-bound))
	m.enforcesAtLeast = gen
	if next.IsZero() {
		return next
	}
	return next.Add(bound)
}

// route is the ShardRoute published to the member; nil before the first
// publish.
func (m *member) route() *ctrlmeshv1alpha1.ShardRoute {
	if m.published == nil {
		return nil
	}
	return m.published.Route
}

// pod is the member's report of a pod.
func (m *member) pod(name string) (state.Pod, bool) {
	if m == nil || m.report == nil {
		return state.Pod{}, false
	}
	i := slices.IndexFunc(m.report.Pods, func(p state.Pod) bool { return p.Name == name })
	if i < 0 {
		return state.Pod{}, false
	}
	return m.report.Pods[i], true
}

// leads reports whether the member's agent reports pod holding a shard's
// lock.
func (m *member) leads(pod string) bool {
	return m.report != nil && slices.ContainsFunc(m.report.Leaders, func(l state.Leader) bool { return l.Pod == pod })
}

// generationOf is the generation whose rules hash a proxy of the member
// reports.
func (m *member) generationOf(rulesHash string) (int64, bool) {
	if m == nil || m.published == nil || rulesHash == "" {
		return 0, false
	}
	return m.published.GenerationOf(rulesHash)
}

// domainOutcome is the result of placing one placement domain.
type domainOutcome struct {
	clusters  []string
	published route.Table
	step      placement.Step
	pods      []placement.Pod
}

// outcome is the result of placing a whole ShardingConfig.
type outcome struct {
	members map[string]*member
	domains []domainOutcome
	// invalid is why the spec cannot be placed, if it cannot.
	invalid error
	// unproxied are the ready pods whose proxy has not reported within the
	// grace: they get no buckets.
	unproxied []route.PodID
	// overlaps are the other ShardingConfigs selecting pods this one does.
	overlaps []overlap
	// canaryStep is the canary step in force.
	canaryStep int32
	// recheck is when a member outside the domain will have outlived a
	// newer publication (see outlived); zero for never.
	recheck time.Time
}

// place publishes the next rules of every placement domain of sc.
func (r *Reconciler) place(ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig, canaryStatus *ctrlmeshv1alpha1.CanaryStatus) (*outcome, error) {
	log := logr.FromContextOrDiscard(ctx)
	out := &outcome{members: map[string]*member{}}
	if canaryStatus != nil {
		out.canaryStep = canaryStatus.Step
	}
	space, err := sharding.NewSpace(int(sc.Spec.Sharding.Buckets))
	if err != nil {
		out.invalid = fmt.Errorf("sharding.buckets: %w", err)
		return out, nil
	}
	config := client.ObjectKeyFromObject(sc)
	works, err := r.Writer.List(ctx, sc)
	if err != nil {
		return nil, err
	}
	unreadable := readBack(ctx, r.Store, r.Writer, sc, works, r.Clock.Now())
	// Everything below reads this one snapshot, taken after the read-back.
	snap := r.Store.Snapshot()
	if err := r.storeKnowsClusters(ctx, snap); err != nil {
		return nil, err
	}
	selected, err := selectedClusters(sc, snap.AcceptedClusters())
	if err != nil {
		out.invalid = err
		return out, nil
	}
	for _, c := range selected {
		if err := unreadable[c.Name]; err != nil {
			return nil, err
		}
		out.members[c.Name] = &member{cluster: c}
	}
	// In Fleet scope a cluster no longer selected leaves as its pods let
	// go: its buckets move to other clusters' pods as in any move, revoked
	// through its Work first.
	leaving := map[string]*member{}
	for _, p := range snap.PublishedOf(config) {
		if m, ok := out.members[p.Cluster]; ok {
			m.published = &p
		} else if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet && unreadable[p.Cluster] == nil {
			c, known := snap.Cluster(p.Cluster)
			if !known {
				// Its ManagedCluster is deleted: the admin declared the
				// member gone.
				c = state.Cluster{Name: p.Cluster, HeartbeatLapsed: true}
			}
			leaving[p.Cluster] = &member{cluster: c, published: &p, leaving: true}
		}
	}
	for _, rep := range snap.ReportsOf(config) {
		if m, ok := out.members[rep.Cluster]; ok {
			m.report = &rep
		} else if m, ok := leaving[rep.Cluster]; ok {
			m.report = &rep
		}
	}
	for name, m := range leaving {
		if m.left() {
			delete(leaving, name)
		}
	}
	if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
		now := r.Clock.Now()
		for _, m := range slices.Concat(slices.Collect(maps.Values(out.members)), slices.Collect(maps.Values(leaving))) {
			if next := m.outlived(now, r.RulesValidity); !next.IsZero() && (out.recheck.IsZero() || next.Before(out.recheck)) {
				out.recheck = next
			}
		}
	}
	// Fleet scope places the leaving clusters with the selected ones: their
	// pods are in the rules until they let go.
	all := maps.Clone(out.members)
	maps.Copy(all, leaving)
	keep := slices.Sorted(maps.Keys(all))
	if pruned, err := r.Writer.Prune(ctx, sc, keep); err != nil {
		return nil, err
	} else if len(pruned) > 0 {
		r.Recorder.Eventf(sc, corev1.EventTypeNormal, ctrlmeshv1alpha1.ReasonWorksDeleted, "Deleted the Works of clusters no longer selected: %v", pruned)
	}
	if removed, err := r.Store.RetainClusters(config, keep); err != nil {
		return nil, fmt.Errorf("forgetting the clusters no longer selected: %w", err)
	} else if len(removed) > 0 {
		log.V(1).Info("Forgot the rules and reports of clusters no longer selected", "clusters", removed)
	}

	if out.overlaps, err = r.overlaps(ctx, sc, snap, snap.AcceptedClusters(), out.members); err != nil {
		return nil, err
	}
	excluded := excludedPods(out.overlaps)
	canary, err := canaryStep(sc, space, out.canaryStep)
	if err != nil {
		out.invalid = err
		return out, nil
	}
	subsets, err := subsetRules(sc, space)
	if err != nil {
		out.invalid = err
		return out, nil
	}
	// In PerCluster scope an unusable cluster keeps its last rules: its
	// agent cannot take new ones. Its shards are still reported.
	if sc.Spec.Scope != ctrlmeshv1alpha1.ScopeFleet {
		for _, name := range keep {
			m := out.members[name]
			if m.usable() || m.route() == nil {
				continue
			}
			published, err := route.Merge(space, map[string]*ctrlmeshv1alpha1.ShardRoute{name: m.route()})
			if err != nil {
				out.invalid = err
				return out, nil
			}
			out.domains = append(out.domains, domainOutcome{clusters: []string{name}, published: published, step: placement.Step{Table: published}})
		}
	}
	// Read once for every domain: each reconcile of a config at 100
	// members listed them 100 times.
	policies, err := r.boundPolicies(ctx, sc)
	var invalid *invalidError
	switch {
	case errors.As(err, &invalid):
		out.invalid = invalid
		return out, nil
	case err != nil:
		return nil, err
	}
	placed, errs := r.placeDomains(ctx, sc, space, canary, subsets, policies, domains(sc, out.members), all, excluded)
	for i, d := range placed {
		if err := errs[i]; err != nil {
			var invalid *invalidError
			if errors.As(err, &invalid) {
				out.invalid = invalid
				return out, nil
			}
			return nil, err
		}
		out.domains = append(out.domains, d)
	}
	return out, nil
}

// DomainWorkers is how many domains of one ShardingConfig are placed and
// published at once. In PerCluster scope every member is a domain of its
// own, and publishing waits on the API server for the member's Work: one
// at a time, 100 configs over 100 members took 18.7 min to Ready with 8
// configs reconciled at once (Workers), 20 hub requests a second against
// the 200 or more the API server took from 64 writers (make bench-scale).
// Domains share nothing a placement writes: each has its own route
// table, Works and rows of the working model.
const DomainWorkers = 8

// placeDomains places each domain with placeDomain, DomainWorkers at once,
// and returns their outcomes and errors in the domains' order. A domain
// that fails does not keep the others from being published: each hands
// over on its own.
func (r *Reconciler) placeDomains(ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig, space sharding.Space, canary *placement.CanaryStep, subsets []placement.Subset, policies *ctrlmeshv1alpha1.RoutePolicies, domains [][]string, members map[string]*member, excluded map[route.PodID]bool) ([]domainOutcome, []error) {
	placed := make([]domainOutcome, len(domains))
	errs := make([]error, len(domains))
	sem := make(chan struct{}, DomainWorkers)
	var wg sync.WaitGroup
	for i, domain := range domains {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			placed[i], errs[i] = r.placeDomain(ctx, sc, space, canary, subsets, policies, domain, members, excluded)
		}()
	}
	wg.Wait()
	return placed, errs
}

// readBack brings what config's Works carry and report into the working
// model, before anything is placed: a restarted hub must know what it
// published before it publishes. Every Work is read, selected or not, so
// that the snapshot placement reads next holds the rows of whichever
// clusters it selects; the rows of clusters it does not select go with
// their Works.
//
// works are the Works as cached, which hold no manifests
// (propagation.CacheTransform). Where works says which rules a Work
// carries (propagation.Writer.Known) and the model holds them as the
// latest published, only the Work's status is read; the other Works —
// every one after a start — are read from the API server in one list.
//
// A Work whose rules cannot be read (or stored) is returned in unreadable,
// by cluster: placing its cluster without them could publish an older
// generation, but a cluster no longer selected is pruned all the same. A
// Work whose status cannot be read has its cluster taken as unreported, as
// before any report.
func readBack(ctx context.Context, store *state.Store, source workSource, sc *ctrlmeshv1alpha1.ShardingConfig, works []workv1alpha1.Work, now time.Time) (unreadable map[string]error) {
	log := logr.FromContextOrDiscard(ctx)
	config := client.ObjectKeyFromObject(sc)
	unreadable = map[string]error{}
	unknown := map[string]bool{}
	// Only this reconcile writes the config's rows meanwhile.
	sources := store.Snapshot().ReportSources(config)
	for i := range works {
		work := &works[i]
		cluster, err := routework.ClusterOf(work)
		if err != nil {
			// Labelled as the config's but in no execution namespace:
			// neither the hub nor an agent uses it.
			log.Info("Ignoring a Work of the ShardingConfig outside every execution namespace", "work", client.ObjectKeyFromObject(work))
			continue
		}
		rulesHash, known := source.Known(work)
		if !known {
			unknown[cluster] = true
			continue
		}
		if sources[cluster].Read(rulesHash, work.ResourceVersion) {
			continue
		}
		switch err := store.ReadBackReport(config, cluster, rulesHash, work.ResourceVersion, readReport(log, work)); {
		case errors.Is(err, state.ErrNotLatest):
			unknown[cluster] = true
		case err != nil:
			unreadable[cluster] = unreadableWork(cluster, err)
		}
	}
	if len(unknown) == 0 {
		return unreadable
	}
	read, err := source.ReadFromServer(ctx, sc)
	if err != nil {
		for cluster := range unknown {
			unreadable[cluster] = unreadableWork(cluster, err)
		}
		return unreadable
	}
	for i := range read {
		work := &read[i]
		cluster, err := routework.ClusterOf(work)
		if err != nil || !unknown[cluster] {
			continue
		}
		route, err := routework.Decode(work)
		if err != nil {
			unreadable[cluster] = unreadableWork(cluster, err)
			continue
		}
		behind, err := store.ReadBack(config, cluster, route, readReport(log, work), now)
		if err != nil {
			unreadable[cluster] = unreadableWork(cluster, err)
			continue
		}
		if behind {
			log.V(1).Info("The Work does not show the rules published last yet; keeping those", "work", client.ObjectKeyFromObject(work),
				"generation", route.Spec.RoutingGeneration)
		}
	}
	return unreadable
}

// workSource tells readBack what the Works carry: propagation.Writer.
type workSource interface {
	// Known returns the hash of the rules a cached Work carries, when
	// known without reading them.
	Known(work *workv1alpha1.Work) (rulesHash string, ok bool)
	// ReadFromServer returns the config's Works, manifests included.
	ReadFromServer(ctx context.Context, config *ctrlmeshv1alpha1.ShardingConfig) ([]workv1alpha1.Work, error)
}

// readReport is reportOf, a status that cannot be read taken as no report.
func readReport(log logr.Logger, work *workv1alpha1.Work) *state.Report {
	report, err := reportOf(work)
	if err != nil {
		log.Error(err, "Reading a Work's status failed; taking its cluster as unreported", "work", client.ObjectKeyFromObject(work))
	}
	return report
}

// unreadableWork is why a selected cluster is not placed.
func unreadableWork(cluster string, err error) error {
	return fmt.Errorf("reading back the Work of cluster %s: %w; the cluster is placed again once its Work reads back: repair the Work, or delete it to publish the cluster's rules anew", cluster, err)
}

// reportOf is what a Work's status tells of its member, as a row of the
// working model: nil while the member has reflected nothing into it. The
// row keeps the pods, leaders and condition of work's status, not copies
// (routework.ViewStatus): work is the cache's own, which nobody modifies.
func reportOf(work *workv1alpha1.Work) (*state.Report, error) {
	status, err := routework.ViewStatus(work)
	if err != nil || (work.Status.ManifestStatuses == nil && status.Applied == nil) {
		return nil, err
	}
	out := &state.Report{
		RulesApplied: meta.FindStatusCondition(status.Route.Conditions, ctrlmeshv1alpha1.ConditionRulesApplied),
		Pods:         status.Route.Pods,
		Leaders:      status.Route.Leaders,
	}
	for _, s := range status.Route.Subsets {
		if out.SubsetNamespaces == nil {
			out.SubsetNamespaces = map[string][]string{}
		}
		out.SubsetNamespaces[s.Name] = s.Namespaces
	}
	return out, nil
}

// errStoreBehind makes a reconcile wait for the clusters controller.
var errStoreBehind = errors.New("the working model does not know every ManagedCluster yet")

// storeKnowsClusters returns errStoreBehind unless the working model knows
// every ManagedCluster in the cache. Right after a start it may not:
// placing then would take known clusters for deselected ones and delete
// their Works.
func (r *Reconciler) storeKnowsClusters(ctx context.Context, snap state.Snapshot) error {
	var list clusterv1.ManagedClusterList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing ManagedClusters: %w", err)
	}
	for _, mc := range list.Items {
		if _, ok := snap.Cluster(mc.Name); !ok {
			return errStoreBehind
		}
	}
	return nil
}

// invalidError is a spec that cannot be placed: reported, not retried.
type invalidError struct{ err error }

func (e *invalidError) Error() string { return e.err.Error() }
func (e *invalidError) Unwrap() error { return e.err }

// domains splits the selected clusters into placement domains: each usable
// cluster alone in PerCluster scope (an unusable one keeps its rules: its
// agent cannot take new ones), all usable ones together in Fleet scope.
func domains(sc *ctrlmeshv1alpha1.ShardingConfig, members map[string]*member) [][]string {
	var usable []string
	for _, name := range slices.Sorted(maps.Keys(members)) {
		if members[name].usable() {
			usable = append(usable, name)
		}
	}
	if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
		if len(usable) == 0 {
			return nil
		}
		return [][]string{usable}
	}
	out := make([][]string, 0, len(usable))
	for _, c := range usable {
		out = append(out, []string{c})
	}
	return out
}

// placeDomain computes and publishes the next rules of one domain. The
// excluded pods (shared with an older ShardingConfig) count as not ready:
// given no buckets, and handing over what they hold as any pod does.
func (r *Reconciler) placeDomain(ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig, space sharding.Space, canary *placement.CanaryStep, subsets []placement.Subset, policies *ctrlmeshv1alpha1.RoutePolicies, clusters []string, members map[string]*member, excluded map[route.PodID]bool) (domainOutcome, error) {
	d := domainOutcome{clusters: clusters}
	routes := map[string]*ctrlmeshv1alpha1.ShardRoute{}
	// In Fleet scope the rules also live in the members that left the
	// domain: their pods may still serve under them.
	for name, m := range members {
		if m.route() != nil && (slices.Contains(clusters, name) || sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet) {
			routes[name] = m.route()
		}
	}
	published, err := route.Merge(space, routes)
	if err != nil {
		return d, &invalidError{err}
	}
	d.published = published
	addresses := map[route.PodID]string{}
	for _, name := range clusters {
		if rep := members[name].report; rep != nil {
			for _, p := range rep.Pods {
				if p.Address != "" {
					addresses[route.PodID{Cluster: name, Name: p.Name}] = p.Address
				}
			}
			d.pods = append(d.pods, candidates(name, rep.Pods)...)
		}
	}
	for i := range d.pods {
		if excluded[d.pods[i].PodID] {
			d.pods[i].Ready = false
		}
	}
	if sc.Spec.Scope != ctrlmeshv1alpha1.ScopeFleet && len(clusters) == 1 {
		// PerCluster scope: the subsets' namespace rules as the member's
		// agent resolved them (Fleet scope has none).
		var reported map[string][]string
		if rep := members[clusters[0]].report; rep != nil {
			reported = rep.SubsetNamespaces
		}
		if subsets, err = resolvedSubsets(subsets, canary, reported); err != nil {
			return d, &invalidError{fmt.Errorf("cluster %s: %w", clusters[0], err)}
		}
	}
	desired, err := placement.Compute(placement.Input{
		Space: space, Shards: int(ptrValue(sc.Spec.Sharding.Shards)), PodsPerShard: int(max(sc.Spec.Sharding.PodsPerShard, 1)),
		Pods: d.pods, Canary: canary, Subsets: subsets, Previous: placement.FromTable(space, published),
	})
	if err != nil {
		return d, &invalidError{err}
	}
	// The clusters whose pods' reports count: the domain's own, and in
	// Fleet scope every member's, all of whose pods share one table.
	reporting := clusters
	if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
		reporting = slices.Sorted(maps.Keys(members))
	}
	step, err := placement.Handover(desired, published, acks(published, reporting, members))
	if err != nil {
		return d, fmt.Errorf("handover: %w", err)
	}
	if step.Table.Generation == 0 {
		// The first rules, even without pods: the agents report candidate
		// pods only for a ShardRoute they have.
		step.Table.Generation = 1
	}
	// In Fleet scope the members outside the domain that hold rules get
	// the step too, first: a lost or leaving cluster's pods must find the
	// buckets revoked in their own Work before any other cluster's Work
	// grants them, so that rules they get back later never give them
	// buckets another pod serves.
	publishTo := clusters
	if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
		var outside []string
		for _, name := range slices.Sorted(maps.Keys(members)) {
			if !slices.Contains(clusters, name) && members[name].route() != nil {
				outside = append(outside, name)
			}
		}
		publishTo = slices.Concat(outside, clusters)
	}
	built, err := r.buildRoutes(sc, publishTo, step.Table, addresses, policies)
	if err != nil {
		return d, err
	}
	if !step.Changed && changedInPlace(built, members) {
		// The spec changed (limits, selectors, canary) but no bucket moved:
		// still a new generation, so that the hash a proxy reports names
		// exactly one generation.
		step.Table.Generation++
		step.Changed = true
		if built, err = r.buildRoutes(sc, publishTo, step.Table, addresses, policies); err != nil {
			return d, err
		}
	}
	d.step = step
	config := client.ObjectKeyFromObject(sc)
	for _, name := range publishTo {
		route := built[name]
		if err := r.Writer.Sync(ctx, sc, name, route); err != nil {
			return d, fmt.Errorf("publishing the rules of %s: %w", name, err)
		}
		// Recorded only once written: the next reconcile places from it
		// even if the cache does not show the Work's update yet. Rules the
		// model holds as published already need no write of it.
		if m := members[name]; m != nil && m.published != nil && m.published.Generation == route.Spec.RoutingGeneration && m.published.RulesHash == route.Spec.RulesHash {
			continue
		}
		if err := r.Store.RecordPublish(config, name, route, r.Clock.Now()); err != nil {
			return d, fmt.Errorf("recording the rules published to %s: %w", name, err)
		}
	}
	if step.Changed {
		r.recordMoves(sc, clusters, step)
		if _, unexpressed := routework.NewLabelerRBAC(sc.Namespace, sc.Name, sc.Spec.Limits, ""); len(unexpressed) > 0 {
			r.Recorder.Eventf(sc, corev1.EventTypeWarning, ctrlmeshv1alpha1.ReasonLabelerRightsNotGranted,
				"The limits name %v: RBAC cannot grant the labeler those without a wildcard or a subresource, so in label-mode members their objects stay unlabeled and no shard sees them; name the resources instead (range-mode members need no labels)", unexpressed)
		}
	}
	return d, nil
}

// buildRoutes builds the ShardRoute of each cluster of a domain, carrying
// the traffic policies bound to the ShardingConfig.
func (r *Reconciler) buildRoutes(sc *ctrlmeshv1alpha1.ShardingConfig, clusters []string, table route.Table, addresses map[route.PodID]string, policies *ctrlmeshv1alpha1.RoutePolicies) (map[string]*ctrlmeshv1alpha1.ShardRoute, error) {
	out := make(map[string]*ctrlmeshv1alpha1.ShardRoute, len(clusters))
	for _, name := range clusters {
		shardRoute, err := route.Build(sc, name, table, addresses, r.RulesValidity)
		if err != nil {
			return nil, fmt.Errorf("building the rules of %s: %w", name, err)
		}
		route.SetPolicies(shardRoute, policies)
		out[name] = shardRoute
	}
	return out, nil
}

// changedInPlace reports whether a built route differs from the one its
// cluster holds at the same generation.
func changedInPlace(built map[string]*ctrlmeshv1alpha1.ShardRoute, members map[string]*member) bool {
	for name, route := range built {
		held := members[name].published
		if held != nil && held.Generation == route.Spec.RoutingGeneration && held.RulesHash != route.Spec.RulesHash {
			return true
		}
	}
	return false
}

// recordMoves records what a published step revoked and granted.
func (r *Reconciler) recordMoves(sc *ctrlmeshv1alpha1.ShardingConfig, clusters []string, step placement.Step) {
	for _, c := range step.Revoked {
		r.Recorder.Eventf(sc, corev1.EventTypeNormal, ctrlmeshv1alpha1.ReasonRevoked, "Generation %d in %v: shard %s stops serving buckets %s namespaces %v",
			step.Table.Generation, clusters, c.Shard, c.Buckets, c.Namespaces)
	}
	for _, c := range step.Granted {
		r.Recorder.Eventf(sc, corev1.EventTypeNormal, ctrlmeshv1alpha1.ReasonGranted, "Generation %d in %v: shard %s starts serving buckets %s namespaces %v",
			step.Table.Generation, clusters, c.Shard, c.Buckets, c.Namespaces)
		r.Metrics.bucketsMoved.WithLabelValues(sc.Namespace, sc.Name).Add(float64(c.Buckets.Len()))
	}
}

// acks tells Handover, for every pod the published rules list and every pod
// a reporting member reports, the generation its proxy enforces and whether
// it is gone. A pod is gone when its cluster's heartbeat lapsed (beyond the
// bound of any rules validity granted there; a cluster unavailable for
// another reason may still have pods serving, and their buckets wait for
// their acknowledgement, or for the member to outlive its rules: see
// outlived), or when its agent no longer reports it — the pod object is
// deleted, which happens once its containers stopped — and it leads no
// shard (a force-deleted pod may still run: its lease must have expired
// first).
func acks(published route.Table, reporting []string, members map[string]*member) []placement.PodAck {
	byPod := map[route.PodID]*placement.PodAck{}
	ack := func(id route.PodID) *placement.PodAck {
		a, ok := byPod[id]
		if !ok {
			a = &placement.PodAck{Pod: id}
			byPod[id] = a
		}
		return a
	}
	for _, rs := range published.Shards {
		for _, id := range rs.Pods {
			a := ack(id)
			m, ok := members[id.Cluster]
			switch {
			case !ok || m.cluster.HeartbeatLapsed:
				// Its proxies serve none of it: rules in Fleet scope
				// expire where the hub sees no heartbeat, and in
				// PerCluster scope no other cluster's pod serves it.
				a.Gone = true
			case m.report != nil:
				_, reported := m.pod(id.Name)
				a.Gone = !reported && !m.leads(id.Name)
			}
		}
	}
	// The pods the reporting members report; pods of other domains enforce
	// other rules (PerCluster scope) and do not count.
	for _, name := range reporting {
		m := members[name]
		if m.report == nil {
			continue
		}
		for _, p := range m.report.Pods {
			if gen, ok := m.generationOf(p.AppliedRulesHash); ok {
				a := ack(route.PodID{Cluster: name, Name: p.Name})
				a.Acked = max(a.Acked, gen)
			}
		}
	}
	// A shard leader the agent still reports but that neither the rules
	// list nor the agent counts among the pods (a crashed pod whose lease
	// has not expired, of a shard already revoked) may still serve what it
	// served: it counts as live and unacknowledged until its lease expires.
	for _, name := range reporting {
		if m := members[name]; m.report != nil {
			for _, l := range m.report.Leaders {
				ack(route.PodID{Cluster: name, Name: l.Pod})
			}
		}
	}
	out := make([]placement.PodAck, 0, len(byPod))
	for _, a := range byPod {
		if m, ok := members[a.Pod.Cluster]; ok {
			a.Acked = max(a.Acked, m.enforcesAtLeast)
		}
		out = append(out, *a)
	}
	slices.SortFunc(out, func(a, b placement.PodAck) int { return route.ComparePodIDs(a.Pod, b.Pod) })
	return out
}

// candidates are the pods a member's agent reports as candidates: those
// with a shard-worthy readiness (the agent also lists pods that only
// reported a hash; they are not ready) whose proxy has reported. A pod
// whose proxy never reported may run without one (admitted without the
// sidecar): given buckets, it would never acknowledge a change and stall
// every handover, so it counts as not ready (see unproxiedPods).
func candidates(cluster string, pods []state.Pod) []placement.Pod {
	var out []placement.Pod
	for _, p := range pods {
		out = append(out, placement.Pod{PodID: route.PodID{Cluster: cluster, Name: p.Name}, Ready: p.Ready && p.AppliedRulesHash != "", Canary: p.Canary, Subset: p.Subset})
	}
	return out
}

// selectedClusters are the accepted clusters the config selects by name or
// by labels.
func selectedClusters(sc *ctrlmeshv1alpha1.ShardingConfig, all []state.Cluster) ([]state.Cluster, error) {
	sel := labels.Nothing()
	if s := sc.Spec.Clusters.Selector; s != nil {
		var err error
		if sel, err = metav1.LabelSelectorAsSelector(s); err != nil {
			return nil, fmt.Errorf("clusters.selector: %w", err)
		}
	}
	var out []state.Cluster
	for _, c := range all {
		if c.Accepted && (slices.Contains(sc.Spec.Clusters.Names, c.Name) || sel.Matches(labels.Set(c.Labels))) {
			out = append(out, c)
		}
	}
	return out, nil
}

// canaryStep is the canary step in force, nil without a canary.
func canaryStep(sc *ctrlmeshv1alpha1.ShardingConfig, space sharding.Space, step int32) (*placement.CanaryStep, error) {
	if sc.Spec.Canary == nil || len(sc.Spec.Canary.Steps) == 0 {
		return nil, nil
	}
	steps := sc.Spec.Canary.Steps
	// The status's step, clamped: the steps may have been edited since.
	i := min(max(int(step), 0), len(steps)-1)
	s := steps[i]
	buckets, err := space.ParseSet(s.Buckets)
	if err != nil {
		return nil, fmt.Errorf("canary step %d buckets: %w", i, err)
	}
	return &placement.CanaryStep{Buckets: buckets, Namespaces: slices.Clone(s.Namespaces)}, nil
}

// maxShardNamespaces is the most namespaces a route shard may serve
// exactly (RouteShard.namespaces).
const maxShardNamespaces = 64

// resolvedSubsets adds to each subset the namespaces its namespace rules
// matched in the member (reported, by subset), except those another
// subset or the canary step names by name, or an earlier subset matched:
// labels are the member's data, not the spec's, so an overlap there is
// settled by order rather than refused.
func resolvedSubsets(subsets []placement.Subset, canary *placement.CanaryStep, reported map[string][]string) ([]placement.Subset, error) {
	if len(reported) == 0 {
		return subsets, nil
	}
	claimed := map[string]bool{}
	for _, s := range subsets {
		for _, ns := range s.Namespaces {
			claimed[ns] = true
		}
	}
	if canary != nil {
		for _, ns := range canary.Namespaces {
			claimed[ns] = true
		}
	}
	out := make([]placement.Subset, len(subsets))
	for i, s := range subsets {
		s.Namespaces = slices.Clone(s.Namespaces)
		for _, ns := range reported[s.Name] {
			if !claimed[ns] {
				claimed[ns] = true
				s.Namespaces = append(s.Namespaces, ns)
			}
		}
		if len(s.Namespaces) > maxShardNamespaces {
			return nil, fmt.Errorf("subset %q would serve %d namespaces, at most %d: narrow its namespaceSelector or namespaceRegex, or give it buckets instead",
				s.Name, len(s.Namespaces), maxShardNamespaces)
		}
		out[i] = s
	}
	return out, nil
}

// subsetRules are the subsets' rules, in the order of the spec.
func subsetRules(sc *ctrlmeshv1alpha1.ShardingConfig, space sharding.Space) ([]placement.Subset, error) {
	var out []placement.Subset
	for _, s := range sc.Spec.Subsets {
		buckets, err := space.ParseSet(s.Buckets)
		if err != nil {
			return nil, fmt.Errorf("subset %q buckets: %w", s.Name, err)
		}
		out = append(out, placement.Subset{Name: s.Name, Buckets: buckets, Namespaces: slices.Clone(s.Namespaces)})
	}
	return out, nil
}

func ptrValue(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}
