package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

var latencyMembers = []string{"member1", "member2"}

// karmadaSyncModes are how the members of the Karmada fleet join Karmada:
// one each way Karmada has, so that both appliers of a Work are timed.
var karmadaSyncModes = map[string]clusterv1alpha1.ClusterSyncMode{"member1": clusterv1alpha1.Push, "member2": clusterv1alpha1.Pull}

// The two fleets the edits are timed on.
const (
	modeStandalone = "standalone"
	modeKarmada    = "Karmada"
)

// eventWithin bounds each timed wait: far above any goal, only so that a
// stuck fleet ends the run with an error.
const eventWithin = 2 * time.Minute

// editResult is the edit phase on one fleet.
type editResult struct {
	// mode is modeStandalone or modeKarmada.
	mode string
	// appliers says, by member, what applies the member's Work to it.
	appliers      map[string]string
	podsPerMember int
	samples       []editSample
}

// editSample is one timed edit.
type editSample struct {
	// total is from the edit until the last proxy of both members enforced
	// it: the figure against the goal.
	total time.Duration
	// slowest is the member whose last proxy reported last.
	slowest string
	// members are the stages of each member.
	members map[string]editStages
}

// editStages are, for one member and one edit, the times from just before
// the edit's Update until the watch event in which the member's Work on
// the hub carried the new route (work), the member's ShardRoute did
// (route: the Work applied), every proxy of the member reported its rules
// hash in the ShardRoute's status (enforced), and the Work's status said
// so (reported: what the hub reads).
type editStages struct {
	work, route, enforced, reported time.Duration
	// versions is how many route versions (routing generations) the
	// member received from the edit until the fleet settled again: one,
	// for an edit that moves no bucket, unless the hub changed the
	// placement after it.
	versions int64
}

// totals are the samples' totals, in edit order.
func (e *editResult) totals() []time.Duration {
	var out []time.Duration
	for _, s := range e.samples {
		out = append(out, s.total)
	}
	return out
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

// latencyFleet is a two-member fleet of the edit and failover phases.
type latencyFleet struct {
	// mode is modeStandalone or modeKarmada.
	mode    string
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

// appliers says, by member, what applies the member's Work in lf.
func (lf *latencyFleet) appliers() map[string]string {
	out := map[string]string{}
	for _, m := range latencyMembers {
		switch {
		case lf.mode == modeStandalone:
			out[m] = "ctrlmesh-agent"
		case karmadaSyncModes[m] == clusterv1alpha1.Push:
			out[m] = "Karmada push: karmada-controller-manager"
		default:
			out[m] = "Karmada pull: karmada-agent"
		}
	}
	return out
}

// latency runs the failover phase on the standalone fleet and the edit
// phase on it and, with -karmada, on the Karmada fleet, one edit on each
// in turn, so that both see the same load of the machine.
func (b *bench) latency(ctx context.Context, res *results) (_ []*editResult, _ *failoverResult, err error) {
	o := b.opts
	wctx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	standalone, err := b.startLatencyFleet(ctx, wctx, modeStandalone, res)
	// Each fleet stops after the watches on it: a kube-apiserver with
	// watches open is slow to stop.
	if standalone != nil {
		defer func() { stopWatches(); err = errors.Join(err, b.stopFleet(standalone.f)) }()
	}
	if err != nil {
		return nil, nil, err
	}
	// Failover first, so that its rule changes (buckets moving, informers
	// relisting) do not overlap the edits (see the package comment).
	var fr *failoverResult
	if o.runs("failover") {
		if fr, err = b.failovers(ctx, standalone); err != nil {
			return nil, nil, err
		}
	}
	if !o.runs("edit") {
		return nil, fr, nil
	}
	fleets := []*latencyFleet{standalone}
	if o.karmada {
		var kf *latencyFleet
		kf, err = b.startLatencyFleet(ctx, wctx, modeKarmada, res)
		if kf != nil {
			defer func() { stopWatches(); err = errors.Join(err, b.stopFleet(kf.f)) }()
		}
		if err != nil {
			return nil, nil, err
		}
		fleets = append(fleets, kf)
	}
	er, err := b.edits(ctx, fleets)
	if err != nil {
		return nil, nil, err
	}
	return er, fr, nil
}

// startLatencyFleet starts the two-member fleet of mode, its watches (which
// end with wctx) and o.podsPerMember pods in each member, creates the
// ShardingConfig over both members and waits until the fleet settles. It
// returns the fleet, even with an error, once it runs, for the caller to
// stop.
func (b *bench) startLatencyFleet(ctx, wctx context.Context, mode string, res *results) (*latencyFleet, error) {
	o := b.opts
	var syncModes map[string]clusterv1alpha1.ClusterSyncMode
	dir := filepath.Join(b.workDir, "latency")
	if mode == modeKarmada {
		syncModes, dir = karmadaSyncModes, filepath.Join(b.workDir, "latency-karmada")
	}
	f, err := b.startFleet(ctx, dir, latencyMembers, syncModes)
	if err != nil {
		return nil, err
	}
	lf := &latencyFleet{mode: mode, f: f, watches: map[string]*memberWatch{}, pods: map[string][]*localfleet.Pod{}}
	for _, m := range latencyMembers {
		if lf.watches[m], err = watchMember(wctx, f.Hub, f.Members[m], b.scheme); err != nil {
			return lf, err
		}
		if res.apiserver == "" {
			if dc, err := discovery.NewDiscoveryClientForConfig(f.Members[m].Config); err == nil {
				if v, err := dc.ServerVersion(); err == nil {
					res.apiserver = v.GitVersion
				}
			}
		}
		b.step("%s fleet, %s: %d pods of %s", mode, m, o.podsPerMember, opName)
		for i := range o.podsPerMember {
			p, err := b.startPod(ctx, f, m, fmt.Sprintf("%s-%d", opName, i))
			if err != nil {
				return lf, err
			}
			lf.pods[m] = append(lf.pods[m], p)
		}
	}
	b.step("%s fleet: ShardingConfig over %v, PerCluster; waiting until every pod serves and enforces", mode, latencyMembers)
	if err := f.Hub.Client.Create(ctx, localfleet.ShardingConfig(opNamespace, opName, latencyMembers)); err != nil {
		return lf, fmt.Errorf("%s fleet: creating the ShardingConfig: %w", mode, err)
	}
	if err := b.settle(ctx, lf); err != nil {
		return lf, fmt.Errorf("%s fleet: %w", mode, err)
	}
	return lf, nil
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

// edits times o.edits ShardingConfig edits to enforcement by every proxy
// on each fleet, one edit on each fleet in turn.
func (b *bench) edits(ctx context.Context, fleets []*latencyFleet) ([]*editResult, error) {
	var out []*editResult
	for _, lf := range fleets {
		out = append(out, &editResult{mode: lf.mode, appliers: lf.appliers(), podsPerMember: b.opts.podsPerMember})
	}
	for i := range b.opts.edits {
		for j, lf := range fleets {
			before := lf.routingGenerations()
			s, err := b.edit(ctx, lf, i)
			if err != nil {
				return nil, fmt.Errorf("%s fleet: %w", lf.mode, err)
			}
			if err := b.settle(ctx, lf); err != nil {
				return nil, fmt.Errorf("%s fleet, after edit %d: %w", lf.mode, i+1, err)
			}
			for m, g := range lf.routingGenerations() {
				st := s.members[m]
				st.versions = g - before[m]
				s.members[m] = st
			}
			out[j].samples = append(out[j].samples, s)
		}
	}
	return out, nil
}

// routingGenerations are the routing generations of the members' routes
// now.
func (lf *latencyFleet) routingGenerations() map[string]int64 {
	out := map[string]int64{}
	for _, m := range latencyMembers {
		if st := lf.watches[m].snapshot(); st.route != nil {
			out[m] = st.route.Spec.RoutingGeneration
		}
	}
	return out
}

// memberStages are a member's expectations of one edit, one per stage
// (editStages).
type memberStages struct {
	work, route, enforced, reported *expectation
}

func (e memberStages) all() []*expectation {
	return []*expectation{e.work, e.route, e.enforced, e.reported}
}

// edit times edit i on lf: it adds or removes the limit on secrets and
// waits for every stage of both members.
func (b *bench) edit(ctx context.Context, lf *latencyFleet, i int) (editSample, error) {
	key := client.ObjectKey{Namespace: opNamespace, Name: opName}
	var (
		t0   time.Time
		want bool
		exps map[string]memberStages
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
		exps = map[string]memberStages{}
		for _, m := range latencyMembers {
			pods := lf.podNames(m)
			w := lf.watches[m]
			newWork := func(st *memberState) bool { r := workRoute(st); return r != nil && hasSecrets(r.Spec.Limits) == want }
			newRoute := func(st *memberState) bool { return st.route != nil && hasSecrets(st.route.Spec.Limits) == want }
			exps[m] = memberStages{
				work:     w.expect(newWork),
				route:    w.expect(newRoute),
				enforced: w.expect(func(st *memberState) bool { return newRoute(st) && enforcing(st.route, pods) }),
				reported: w.expect(func(st *memberState) bool { return newWork(st) && reported(st, pods) }),
			}
		}
		t0 = time.Now()
		err := lf.f.Hub.Client.Update(ctx, &sc)
		if err != nil {
			for m, e := range exps {
				for _, x := range e.all() {
					lf.watches[m].cancel(x)
				}
			}
		}
		return err
	})
	if err != nil {
		return editSample{}, fmt.Errorf("edit %d: updating the ShardingConfig: %w", i+1, err)
	}
	s := editSample{members: map[string]editStages{}}
	var last time.Time
	for _, m := range latencyMembers {
		w := lf.watches[m]
		var at [4]time.Time
		for k, x := range exps[m].all() {
			what := fmt.Sprintf("edit %d: %s", i+1, [...]string{"the Work carrying the new route", "the new route in the member", "every proxy of the member enforcing it", "the Work's status reporting that"}[k])
			if at[k], err = w.wait(ctx, x, eventWithin, what, lf.f.Err); err != nil {
				for _, y := range exps[m].all()[k+1:] {
					w.cancel(y)
				}
				return editSample{}, err
			}
		}
		s.members[m] = editStages{work: at[0].Sub(t0), route: at[1].Sub(t0), enforced: at[2].Sub(t0), reported: at[3].Sub(t0)}
		if at[2].After(last) {
			last, s.slowest = at[2], m
		}
	}
	s.total = last.Sub(t0)
	verb := "removing"
	if want {
		verb = "adding"
	}
	var parts []string
	for _, m := range latencyMembers {
		st := s.members[m]
		parts = append(parts, fmt.Sprintf("%s: Work %s, route %s, enforced %s, reported %s", m, fmtMs(st.work), fmtMs(st.route), fmtMs(st.enforced), fmtMs(st.reported)))
	}
	b.step("%s fleet, edit %2d/%d (%s secrets): every proxy of both members enforces it after %s (%s)", lf.mode, i+1, b.opts.edits, verb, fmtMs(s.total), strings.Join(parts, "; "))
	return s, nil
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
