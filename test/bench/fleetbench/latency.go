package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

var latencyMembers = []string{"member1", "member2"}

// eventWithin bounds each timed wait: far above any goal, only so that a
// stuck fleet ends the run with an error.
const eventWithin = 2 * time.Minute

type editResult struct {
	podsPerMember int
	samples       []time.Duration
	// published is, per edit, when the route with the new limits had
	// reached both members (before any proxy applied it).
	published []time.Duration
	// slowest is, per edit, the member whose last proxy reported last.
	slowest []string
}

type failoverResult struct {
	kills []killSample
}

type killSample struct {
	member, pod string
	buckets     string
	// reassigned is when the route no longer gave the killed pod a shard
	// and gave every one of its buckets to a survivor's shard (spec only);
	// rules is when every bucket was in a survivor's enforced rules;
	// total adds that the survivor held the shard's Lease.
	reassigned, rules, total time.Duration
}

// latencyFleet is the two-member fleet of the edit and failover phases.
type latencyFleet struct {
	f       *localfleet.Fleet
	watches map[string]*memberWatch
	pods    map[string][]*localfleet.Pod
}

func (lf *latencyFleet) podNames(member string) []string {
	var out []string
	for _, p := range lf.pods[member] {
		out = append(out, p.Name)
	}
	return out
}

// latency runs the edit and failover phases on a two-member fleet.
func (b *bench) latency(ctx context.Context, res *results) (_ *editResult, _ *failoverResult, err error) {
	o := b.opts
	f, err := b.startFleet(ctx, filepath.Join(b.workDir, "latency"), latencyMembers)
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, b.stopFleet(f)) }()
	lf := &latencyFleet{f: f, watches: map[string]*memberWatch{}, pods: map[string][]*localfleet.Pod{}}
	wctx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	for _, m := range latencyMembers {
		if lf.watches[m], err = watchMember(wctx, f.Members[m], b.scheme); err != nil {
			return nil, nil, err
		}
		if res.apiserver == "" {
			if dc, err := discovery.NewDiscoveryClientForConfig(f.Members[m].Config); err == nil {
				if v, err := dc.ServerVersion(); err == nil {
					res.apiserver = v.GitVersion
				}
			}
		}
		b.step("%s: %d pods of %s", m, o.podsPerMember, opName)
		for i := range o.podsPerMember {
			p, err := b.startPod(ctx, f, m, fmt.Sprintf("%s-%d", opName, i))
			if err != nil {
				return nil, nil, err
			}
			lf.pods[m] = append(lf.pods[m], p)
		}
	}
	b.step("ShardingConfig over %v, PerCluster; waiting until every pod serves and enforces", latencyMembers)
	if err := f.Hub.Client.Create(ctx, localfleet.ShardingConfig(opNamespace, opName, latencyMembers)); err != nil {
		return nil, nil, fmt.Errorf("creating the ShardingConfig: %w", err)
	}
	if err := b.settle(ctx, lf); err != nil {
		return nil, nil, err
	}

	// Failover first, so that its rule changes (buckets moving, informers
	// relisting) do not overlap the edits (see the package comment).
	var fr *failoverResult
	if o.runs("failover") {
		if fr, err = b.failovers(ctx, lf); err != nil {
			return nil, nil, err
		}
	}
	var er *editResult
	if o.runs("edit") {
		if er, err = b.edits(ctx, lf); err != nil {
			return nil, nil, err
		}
	}
	return er, fr, nil
}

// settle waits, untimed, until the ShardingConfig is Ready with every pod
// placed and each member at rest (settled) with exactly its pods.
func (b *bench) settle(ctx context.Context, lf *latencyFleet) error {
	if _, err := waitReady(ctx, lf.f, "Ready with every pod placed", func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		for m := range lf.pods {
			for _, p := range lf.podNames(m) {
				if s, err := podBuckets(sc, m, p); err != nil || s.IsEmpty() {
					return false
				}
			}
		}
		return true
	}); err != nil {
		return err
	}
	for _, m := range latencyMembers {
		pods := lf.podNames(m)
		w := lf.watches[m]
		e := w.expect(func(st *memberState) bool { return settled(st, pods) })
		if _, err := w.wait(ctx, e, readyWithin, "every pod enforcing, every bucket served and led", lf.f.Err); err != nil {
			return err
		}
	}
	return nil
}

// hasSecrets tells whether the limits shard secrets.
func hasSecrets(limits ctrlmeshv1alpha1.Limits) bool {
	for _, l := range limits {
		for _, g := range l.RelateResources {
			if slices.Contains(g.Resources, "secrets") {
				return true
			}
		}
	}
	return false
}

// edits times o.edits ShardingConfig edits to enforcement by every proxy.
func (b *bench) edits(ctx context.Context, lf *latencyFleet) (*editResult, error) {
	er := &editResult{podsPerMember: b.opts.podsPerMember}
	key := client.ObjectKey{Namespace: opNamespace, Name: opName}
	for i := range b.opts.edits {
		var (
			t0   time.Time
			want bool
			exps map[string]*expectation
			pubs map[string]*expectation
		)
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var sc ctrlmeshv1alpha1.ShardingConfig
			if err := lf.f.Hub.Client.Get(ctx, key, &sc); err != nil {
				return err
			}
			rr := sc.Spec.Limits[0].RelateResources
			want = !hasSecrets(sc.Spec.Limits)
			if want {
				rr = append(rr, ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{""}, Resources: []string{"secrets"}})
			} else {
				rr = slices.DeleteFunc(rr, func(g ctrlmeshv1alpha1.ResourceGroup) bool { return slices.Contains(g.Resources, "secrets") })
			}
			sc.Spec.Limits[0].RelateResources = rr
			exps, pubs = map[string]*expectation{}, map[string]*expectation{}
			for _, m := range latencyMembers {
				pods := lf.podNames(m)
				pubs[m] = lf.watches[m].expect(func(st *memberState) bool {
					return st.route != nil && hasSecrets(st.route.Spec.Limits) == want
				})
				exps[m] = lf.watches[m].expect(func(st *memberState) bool {
					return st.route != nil && hasSecrets(st.route.Spec.Limits) == want && enforcing(st.route, pods)
				})
			}
			t0 = time.Now()
			err := lf.f.Hub.Client.Update(ctx, &sc)
			if err != nil {
				for m, e := range exps {
					lf.watches[m].cancel(e)
					lf.watches[m].cancel(pubs[m])
				}
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("edit %d: updating the ShardingConfig: %w", i+1, err)
		}
		var last, lastPub time.Time
		var slowest string
		for _, m := range latencyMembers {
			at, err := lf.watches[m].wait(ctx, pubs[m], eventWithin, fmt.Sprintf("edit %d published", i+1), lf.f.Err)
			if err != nil {
				return nil, err
			}
			if at.After(lastPub) {
				lastPub = at
			}
		}
		for _, m := range latencyMembers {
			at, err := lf.watches[m].wait(ctx, exps[m], eventWithin, fmt.Sprintf("edit %d enforced by every proxy", i+1), lf.f.Err)
			if err != nil {
				return nil, err
			}
			if at.After(last) {
				last, slowest = at, m
			}
		}
		d := last.Sub(t0)
		er.samples = append(er.samples, d)
		er.slowest = append(er.slowest, slowest)
		er.published = append(er.published, lastPub.Sub(t0))
		verb := "removing"
		if want {
			verb = "adding"
		}
		b.step("edit %2d/%d (%s secrets): route in both members after %s, every proxy of both enforces it after %s (last: %s)", i+1, b.opts.edits, verb, fmtMs(lastPub.Sub(t0)), fmtMs(d), slowest)
		if err := b.settle(ctx, lf); err != nil {
			return nil, fmt.Errorf("after edit %d: %w", i+1, err)
		}
	}
	return er, nil
}

// failovers kills o.kills pods, alternating members, and times until
// their buckets are served again.
func (b *bench) failovers(ctx context.Context, lf *latencyFleet) (*failoverResult, error) {
	fr := &failoverResult{}
	for k := range b.opts.kills {
		m := latencyMembers[k%len(latencyMembers)]
		w := lf.watches[m]
		victim := lf.pods[m][0]
		st := w.snapshot()
		if st.route == nil {
			return nil, fmt.Errorf("%s: no ShardRoute", m)
		}
		_, table, err := route.Parse(&st.route.Spec)
		if err != nil {
			return nil, err
		}
		var sets []sharding.Set
		for _, s := range table.Shards {
			if slices.ContainsFunc(s.Pods, func(p route.PodID) bool { return p.Name == victim.Name }) {
				sets = append(sets, s.Buckets)
			}
		}
		served := union(sets...)
		if served.IsEmpty() {
			return nil, fmt.Errorf("%s: pod %s serves no bucket before the kill: %s", m, victim.Name, routeText(&st))
		}
		survivors := slices.DeleteFunc(lf.podNames(m), func(n string) bool { return n == victim.Name })
		reassigned := w.expect(func(st *memberState) bool { return reassignedTo(st, victim.Name, served, survivors) })
		rulesOnly := w.expect(func(st *memberState) bool { return takenOver(st, served, survivors, false) })
		withLease := w.expect(func(st *memberState) bool { return takenOver(st, served, survivors, true) })
		b.step("kill %d/%d: %s/%s, which serves buckets %s", k+1, b.opts.kills, m, victim.Name, served)
		t0 := time.Now()
		if err := lf.f.KillPod(ctx, victim); err != nil {
			w.cancel(reassigned)
			w.cancel(rulesOnly)
			w.cancel(withLease)
			return nil, err
		}
		lf.pods[m] = lf.pods[m][1:]
		what := fmt.Sprintf("buckets %s of the killed %s served by a survivor", served, victim.Name)
		atReassigned, err := w.wait(ctx, reassigned, eventWithin, "the route to move "+what, lf.f.Err)
		if err != nil {
			w.cancel(rulesOnly)
			w.cancel(withLease)
			return nil, err
		}
		atRules, err := w.wait(ctx, rulesOnly, eventWithin, what, lf.f.Err)
		if err != nil {
			w.cancel(withLease)
			return nil, err
		}
		atLease, err := w.wait(ctx, withLease, eventWithin, what+" holding the shard lease", lf.f.Err)
		if err != nil {
			return nil, err
		}
		ks := killSample{member: m, pod: victim.Name, buckets: served.String(), reassigned: atReassigned.Sub(t0), rules: atRules.Sub(t0), total: atLease.Sub(t0)}
		fr.kills = append(fr.kills, ks)
		b.step("kill %d/%d: buckets given to a survivor in the route after %s, in its enforced rules after %s, its operator holding the shard lease after %s",
			k+1, b.opts.kills, fmtMs(ks.reassigned), fmtMs(ks.rules), fmtMs(ks.total))
		if k+1 == b.opts.kills && !b.opts.runs("edit") {
			break
		}
		name := fmt.Sprintf("%s-r%d", opName, k+1)
		b.step("%s: replacement pod %s; waiting until the fleet settles", m, name)
		p, err := b.startPod(ctx, lf.f, m, name)
		if err != nil {
			return nil, err
		}
		lf.pods[m] = append(lf.pods[m], p)
		if err := b.settle(ctx, lf); err != nil {
			return nil, fmt.Errorf("after kill %d: %w", k+1, err)
		}
	}
	return fr, nil
}

// takenOver tells whether every bucket of served is in the (not pending)
// buckets of a shard with a survivor that enforces the route, and, with
// lease, holds the shard's Lease.
func takenOver(st *memberState, served sharding.Set, survivors []string, lease bool) bool {
	r := st.route
	if r == nil {
		return false
	}
	_, table, err := route.Parse(&r.Spec)
	if err != nil {
		return false
	}
	for bk := range buckets {
		if !served.Has(bk) {
			continue
		}
		ok := false
		for i, s := range r.Spec.Shards {
			if !table.Shards[i].Buckets.Has(bk) {
				continue
			}
			for _, p := range s.Pods {
				if slices.Contains(survivors, p.Name) && appliedHash(r, p.Name) == r.Spec.RulesHash &&
					(!lease || st.leases[leaseName(r, s.ID)] == p.Name) {
					ok = true
				}
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// reassignedTo tells whether the route gives the killed pod no shard and
// every bucket of served to a shard with a survivor (the hub's decision,
// before any proxy applied it).
func reassignedTo(st *memberState, killed string, served sharding.Set, survivors []string) bool {
	r := st.route
	if r == nil {
		return false
	}
	_, table, err := route.Parse(&r.Spec)
	if err != nil {
		return false
	}
	var sets []sharding.Set
	for _, s := range table.Shards {
		if slices.ContainsFunc(s.Pods, func(p route.PodID) bool { return p.Name == killed }) {
			return false
		}
		if !slices.ContainsFunc(s.Pods, func(p route.PodID) bool { return slices.Contains(survivors, p.Name) }) {
			continue
		}
		sets = append(sets, s.Buckets)
	}
	u := union(sets...)
	for bk := range buckets {
		if served.Has(bk) && !u.Has(bk) {
			return false
		}
	}
	return true
}
