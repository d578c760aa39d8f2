package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
)

// memberState is what a member shows of the ShardingConfig: its ShardRoute
// and the holders of the Leases in opNamespace, and, on the hub, the Work
// the hub writes for it (carrying that route, reporting its status back).
type memberState struct {
	route *ctrlmeshv1alpha1.ShardRoute
	// leases maps a Lease's name to its holder identity.
	leases map[string]string
	// work is the member's Work on the hub; nil until the hub writes it.
	work *workv1alpha1.Work
}

// memberWatch follows a member's ShardRoute opName and the Leases of
// opNamespace with informers on the member, and the Work that carries the
// route with an informer on the hub. Conditions registered with expect are
// evaluated on every event, in the informers' goroutines, so that the time
// they first hold is the time of the watch event that made them hold.
type memberWatch struct {
	name string

	mu      sync.Mutex
	state   memberState
	pending []*expectation
}

// expectation is a condition on a member's state and when it first held.
type expectation struct {
	cond func(*memberState) bool
	done chan struct{}
	at   time.Time
}

// watchMember starts the informers on the member c and on the hub and
// waits for their first list. They stop with ctx.
func watchMember(ctx context.Context, hub, c *controlplane.Cluster, s *runtime.Scheme) (*memberWatch, error) {
	w := &memberWatch{name: c.Name, state: memberState{leases: map[string]string{}}}
	ca, err := cache.New(c.Config, cache.Options{Scheme: s, DefaultNamespaces: map[string]cache.Config{opNamespace: {}}})
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", c.Name, err)
	}
	workKey := routework.WorkKey(c.Name, opNamespace, opName)
	hubCache, err := cache.New(hub.Config, cache.Options{Scheme: s, DefaultNamespaces: map[string]cache.Config{workKey.Namespace: {}}})
	if err != nil {
		return nil, fmt.Errorf("watching the Work of %s: %w", c.Name, err)
	}
	works, err := hubCache.GetInformer(ctx, &workv1alpha1.Work{})
	if err != nil {
		return nil, fmt.Errorf("watching the Works of %s: %w", c.Name, err)
	}
	routes, err := ca.GetInformer(ctx, &ctrlmeshv1alpha1.ShardRoute{})
	if err != nil {
		return nil, fmt.Errorf("watching ShardRoutes in %s: %w", c.Name, err)
	}
	leases, err := ca.GetInformer(ctx, &coordinationv1.Lease{})
	if err != nil {
		return nil, fmt.Errorf("watching Leases in %s: %w", c.Name, err)
	}
	onRoute := func(obj any, deleted bool) {
		now := time.Now()
		r, ok := obj.(*ctrlmeshv1alpha1.ShardRoute)
		if !ok || r.Name != opName {
			return
		}
		w.update(now, func(st *memberState) {
			if deleted {
				st.route = nil
			} else {
				st.route = r
			}
		})
	}
	onLease := func(obj any, deleted bool) {
		now := time.Now()
		l, ok := obj.(*coordinationv1.Lease)
		if !ok {
			return
		}
		w.update(now, func(st *memberState) {
			if deleted || l.Spec.HolderIdentity == nil {
				delete(st.leases, l.Name)
			} else {
				st.leases[l.Name] = *l.Spec.HolderIdentity
			}
		})
	}
	onWork := func(obj any, deleted bool) {
		now := time.Now()
		wk, ok := obj.(*workv1alpha1.Work)
		if !ok || wk.Name != workKey.Name {
			return
		}
		w.update(now, func(st *memberState) {
			if deleted {
				st.work = nil
			} else {
				st.work = wk
			}
		})
	}
	for _, h := range []struct {
		inf cache.Informer
		fn  func(any, bool)
	}{{routes, onRoute}, {leases, onLease}, {works, onWork}} {
		fn := h.fn
		if _, err := h.inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { fn(obj, false) },
			UpdateFunc: func(_, obj any) { fn(obj, false) },
			DeleteFunc: func(obj any) {
				if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
					obj = t.Obj
				}
				fn(obj, true)
			},
		}); err != nil {
			return nil, fmt.Errorf("watching %s: %w", c.Name, err)
		}
	}
	for _, cc := range []cache.Cache{ca, hubCache} {
		go func() { _ = cc.Start(ctx) }()
		if !cc.WaitForCacheSync(ctx) {
			return nil, fmt.Errorf("watching %s: the informers did not sync", c.Name)
		}
	}
	return w, nil
}

// update changes the state and settles the expectations that now hold.
func (w *memberWatch) update(at time.Time, change func(*memberState)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	change(&w.state)
	w.pending = slices.DeleteFunc(w.pending, func(e *expectation) bool {
		if e.cond(&w.state) {
			e.at = at
			close(e.done)
			return true
		}
		return false
	})
}

// expect registers cond; if it holds already, it is settled now.
func (w *memberWatch) expect(cond func(*memberState) bool) *expectation {
	e := &expectation{cond: cond, done: make(chan struct{})}
	w.mu.Lock()
	defer w.mu.Unlock()
	if cond(&w.state) {
		e.at = time.Now()
		close(e.done)
	} else {
		w.pending = append(w.pending, e)
	}
	return e
}

// cancel drops an expectation that is no longer waited for.
func (w *memberWatch) cancel(e *expectation) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending = slices.DeleteFunc(w.pending, func(p *expectation) bool { return p == e })
}

// snapshot is a copy of the current state.
func (w *memberWatch) snapshot() memberState {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := memberState{leases: map[string]string{}}
	if w.state.route != nil {
		st.route = w.state.route.DeepCopy()
	}
	if w.state.work != nil {
		st.work = w.state.work.DeepCopy()
	}
	for k, v := range w.state.leases {
		st.leases[k] = v
	}
	return st
}

// wait waits for e until within passes, checking fail every half second
// (a fleet component that died), and returns when e first held.
func (w *memberWatch) wait(ctx context.Context, e *expectation, within time.Duration, what string, fail func() error) (time.Time, error) {
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-e.done:
			return e.at, nil
		case <-ctx.Done():
			w.cancel(e)
			return time.Time{}, fmt.Errorf("%s: waiting for %s: %w", w.name, what, ctx.Err())
		case <-timeout.C:
			w.cancel(e)
			st := w.snapshot()
			return time.Time{}, fmt.Errorf("%s: %s not within %v; route now: %s", w.name, what, within, routeText(&st))
		case <-tick.C:
			if err := fail(); err != nil {
				w.cancel(e)
				return time.Time{}, err
			}
		}
	}
}

// appliedHash is the rules hash pod reports in the route's status.
func appliedHash(route *ctrlmeshv1alpha1.ShardRoute, pod string) string {
	for _, p := range route.Status.Pods {
		if p.Name == pod {
			return p.AppliedRulesHash
		}
	}
	return ""
}

// enforcing tells whether every one of pods reports the route's rules hash.
func enforcing(route *ctrlmeshv1alpha1.ShardRoute, pods []string) bool {
	if route == nil {
		return false
	}
	for _, p := range pods {
		if appliedHash(route, p) != route.Spec.RulesHash {
			return false
		}
	}
	return true
}

// workRoute is the ShardRoute the member's Work carries; nil before the hub
// writes it or if it does not decode.
func workRoute(st *memberState) *ctrlmeshv1alpha1.ShardRoute {
	if st.work == nil {
		return nil
	}
	r, err := routework.Decode(st.work)
	if err != nil {
		return nil
	}
	return r
}

// reported tells whether the member's Work reports, in its status, that
// every one of pods enforces the route the Work carries: the member's
// enforcement as the hub reads it (routework.ReadStatus), written back by
// the agent in standalone mode and by Karmada's work-status controller in
// Karmada mode.
func reported(st *memberState, pods []string) bool {
	r := workRoute(st)
	if r == nil {
		return false
	}
	report, err := routework.ReadStatus(st.work)
	if err != nil {
		return false
	}
	for _, p := range pods {
		i := slices.IndexFunc(report.Route.Pods, func(rp ctrlmeshv1alpha1.PodRouteStatus) bool { return rp.Name == p })
		if i < 0 || report.Route.Pods[i].AppliedRulesHash != r.Spec.RulesHash {
			return false
		}
	}
	return true
}

// leaseName is the shard's leader-election lock, as the proxy renames it.
func leaseName(route *ctrlmeshv1alpha1.ShardRoute, shard string) string {
	name := opName
	if route.Spec.Controller != nil && route.Spec.Controller.LeaderElectionName != "" {
		name = route.Spec.Controller.LeaderElectionName
	}
	return ctrlmeshv1alpha1.ShardLockName(name, shard)
}

// settled tells whether the member is at rest with exactly pods: every
// pod enforces the route, every pod is in a shard, no bucket is pending,
// every bucket is served, and every shard with buckets is led by one of
// its pods.
func settled(st *memberState, pods []string) bool {
	r := st.route
	if !enforcing(r, pods) {
		return false
	}
	_, table, err := route.Parse(&r.Spec)
	if err != nil {
		return false
	}
	var served []sharding.Set
	inShard := map[string]bool{}
	for i, s := range r.Spec.Shards {
		if s.PendingBuckets != "" || len(s.PendingNamespaces) > 0 {
			return false
		}
		for _, p := range s.Pods {
			if !slices.Contains(pods, p.Name) {
				return false
			}
			inShard[p.Name] = true
		}
		if s.Buckets == "" {
			continue
		}
		served = append(served, table.Shards[i].Buckets)
		if !slices.ContainsFunc(s.Pods, func(p ctrlmeshv1alpha1.RoutePod) bool { return st.leases[leaseName(r, s.ID)] == p.Name }) {
			return false
		}
	}
	return len(inShard) == len(pods) && union(served...).Len() == buckets
}

// routeText describes a route for error messages.
func routeText(st *memberState) string {
	r := st.route
	if r == nil {
		return "no ShardRoute"
	}
	s := fmt.Sprintf("generation %d hash %.12s:", r.Spec.RoutingGeneration, r.Spec.RulesHash)
	for _, sh := range r.Spec.Shards {
		var pods []string
		for _, p := range sh.Pods {
			pods = append(pods, fmt.Sprintf("%s(applied %.12s)", p.Name, appliedHash(r, p.Name)))
		}
		s += fmt.Sprintf(" shard %s buckets=%q pending=%q pods=%v lease=%s;", sh.ID, sh.Buckets, sh.PendingBuckets, pods, st.leases[leaseName(r, sh.ID)])
	}
	return s
}
