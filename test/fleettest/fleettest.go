// Package fleettest is what the end-to-end tests on a local fleet (package
// localfleet) share — test/e2e's and test/chaos's: real kube-apiservers and
// etcds, the hub and the agents in the test's process, the demo operator's
// pods as ctrlmesh-proxy and demo-operator processes that record every
// reconcile; the waits for the ShardingConfig to be served again, and the
// check of the records (no object reconciled by two pods at once).
package fleettest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

const (
	// OpNamespace holds the demo operator's pods and its ShardingConfig,
	// OpName names both.
	OpNamespace = "operators"
	OpName      = "demo-operator"

	namespaces   = 20
	perNamespace = 10

	// ReadyWithin bounds the wait for Ready after a disruption, and
	// ServedWithin the wait until every bucket is served again.
	ReadyWithin  = 45 * time.Second
	ServedWithin = 30 * time.Second
	// FailoverBound bounds the time from a pod's crash until its buckets
	// are served by other pods (Ready: every shard's pods enforce the rules
	// and one of them leads it): its shard lease must expire first, then
	// the agent reports it, the hub publishes and the proxies apply.
	// make bench-fleet measures it against the goal of lease + 3 s.
	FailoverBound = localfleet.OperatorLeaseDuration + 5*time.Second

	// reconcileDelay makes every reconcile last a little, so that two at
	// once would intersect in the records.
	reconcileDelay = 20 * time.Millisecond
)

// The members of the tests' fleets.
const (
	Member1 = "member1"
	Member2 = "member2"
)

// binDir holds kube-apiserver and etcd (links to the test assets) and
// ctrlmesh-proxy and demo-operator built from this checkout by Main.
var binDir string

// Main is a test package's TestMain: it builds the binaries the pods run,
// runs the tests and exits.
func Main(m *testing.M) {
	// The hub and the agents log to files; controller-runtime and
	// client-go's global loggers are silenced.
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	dir, err := os.MkdirTemp("", "ctrlmesh-e2e-bin-")
	if err == nil {
		err = buildBinaries(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildBinaries builds ctrlmesh-proxy and demo-operator into dir, next to
// links to kube-apiserver, etcd and Karmada's components, as
// cmd/ctrlmeshctl's demo test does.
func buildBinaries(dir string) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	assets := os.Getenv(env.AssetsEnv)
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	// Karmada's components too, for the fleets with Options.Karmada.
	tools := []string{"kube-apiserver", "etcd", controlplane.KarmadaAggregatedAPIServerBinary, controlplane.KarmadaControllerManagerBinary, controlplane.KarmadaAgentBinary}
	if err := controlplane.CheckBinaries(assets, "run 'make tools'", tools...); err != nil {
		return err
	}
	for _, name := range tools {
		if err := os.Symlink(filepath.Join(assets, name), filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/ctrlmesh-proxy", "./scenarios/demo-operator")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the binaries: %v\n%s", err, out)
	}
	return nil
}

// Fleet is a local fleet with the hub up and every member joined, and
// the demo operator's pods, each recording its reconciles.
type Fleet struct {
	*localfleet.Fleet
	// RestartOperators makes AddPod's pods run their operator again when
	// it exits (localfleet.PodSpec.RestartOperator).
	RestartOperators bool
	t                *testing.T
	ctx              context.Context
	started          time.Time
	// recordDir holds one record file per pod, <cluster>--<pod>.jsonl.
	recordDir string
	pods      map[string]*localfleet.Pod
	stopOnce  sync.Once
}

// StartFleet starts the fleet of opts (BinDir, CRDDirs and WorkDir are
// filled in), the hub, and joins every member; it creates OpNamespace on
// the hub and the members.
func StartFleet(t *testing.T, ctx context.Context, opts localfleet.Options) *Fleet {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	workDir, err := os.MkdirTemp("", "ctrlmesh-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubeconfigs and logs kept in %s", workDir)
			return
		}
		_ = os.RemoveAll(workDir)
	})
	opts.BinDir, opts.CRDDirs, opts.WorkDir = binDir, controlplane.CRDDirs(root), workDir
	f := &Fleet{t: t, ctx: ctx, started: time.Now(), recordDir: filepath.Join(workDir, "records"), pods: map[string]*localfleet.Pod{}}
	if err := os.Mkdir(f.recordDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if f.Fleet, err = localfleet.Start(ctx, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.stop)
	f.Logf("API servers up")
	if err := f.StartHub(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range opts.Members {
		if err := f.Join(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	f.Logf("hub up, %s joined", strings.Join(opts.Members, ", "))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OpNamespace}}
	env.Create(t, ctx, f.Hub.Client, ns.DeepCopy())
	for _, m := range f.Members {
		env.Create(t, ctx, m.Client, ns.DeepCopy())
	}
	return f
}

// stop stops the whole fleet, once; the records are complete after it.
func (f *Fleet) stop() {
	f.stopOnce.Do(func() {
		if err := f.Stop(); err != nil {
			f.t.Errorf("stopping the fleet: %v", err)
		}
	})
}

// Logf logs with the time since the fleet started.
func (f *Fleet) Logf(format string, args ...any) {
	f.t.Helper()
	f.t.Logf("[%5.1fs] "+format, append([]any{time.Since(f.started).Seconds()}, args...)...)
}

// AddPod starts an operator pod of OpName in cluster, labeled
// app=OpName plus extraLabels, recording its reconciles.
func (f *Fleet) AddPod(cluster, name string, objectsOnHub bool, extraLabels map[string]string) {
	f.t.Helper()
	labels := map[string]string{"app": OpName}
	for k, v := range extraLabels {
		labels[k] = v
	}
	p, err := f.StartPod(f.ctx, localfleet.PodSpec{
		Cluster: cluster, Namespace: OpNamespace, Name: name, Labels: labels, RulesName: OpName, ObjectsOnHub: objectsOnHub,
		RestartOperator: f.RestartOperators,
		OperatorArgs: []string{
			"--record-file=" + filepath.Join(f.recordDir, cluster+"--"+name+".jsonl"),
			"--reconcile-delay=" + reconcileDelay.String(),
		},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	f.pods[name] = p
}

// Pod is the pod AddPod started as name.
func (f *Fleet) Pod(name string) *localfleet.Pod { return f.pods[name] }

// OperatorRestarts are the pods whose operator ran again after exiting
// (RestartOperators), with how often.
func (f *Fleet) OperatorRestarts() map[string]int {
	out := map[string]int{}
	for name, p := range f.pods {
		if n := p.OperatorRestarts(); n > 0 {
			out[name] = n
		}
	}
	return out
}

// Kill crashes the pod AddPod started as name (localfleet's KillPod).
func (f *Fleet) Kill(name string) {
	f.t.Helper()
	if err := f.KillPod(f.ctx, f.pods[name]); err != nil {
		f.t.Fatal(err)
	}
}

// ShardingConfig shards the demo operator's pods in Member1 and Member2.
func ShardingConfig(scope ctrlmeshv1alpha1.ShardingScope) *ctrlmeshv1alpha1.ShardingConfig {
	sc := localfleet.ShardingConfig(OpNamespace, OpName, []string{Member1, Member2})
	sc.Spec.Scope = scope
	return sc
}

// ManagedObjects creates perNamespace managed ConfigMaps in each of the
// spread namespaces of c and returns them.
func ManagedObjects(t *testing.T, ctx context.Context, c client.Client) []client.ObjectKey {
	t.Helper()
	var objects []client.ObjectKey
	// CanaryNamespace and others, each in a bucket of its own (of the
	// default 32), so that every pod gets objects.
	spread, _ := env.SpreadNamespaces(sharding.MustSpace(32), "t", []string{CanaryNamespace}, namespaces)
	for _, nsName := range spread {
		env.Create(t, ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName}})
		for j := range perNamespace {
			cm := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: nsName, Name: fmt.Sprintf("cm-%02d", j),
					Labels: map[string]string{operator.ManagedLabel: operator.ManagedValue}},
				Data: map[string]string{"touch": "0"},
			}
			env.Create(t, ctx, c, cm)
			objects = append(objects, client.ObjectKeyFromObject(cm))
		}
	}
	return objects
}

// CanaryNamespace is a namespace of its own bucket that canary steps name.
const CanaryNamespace = "team-a"

// ClusterObjects are the managed objects of one cluster.
type ClusterObjects struct {
	Cluster string
	Client  client.Client
	Keys    []client.ObjectKey
}

// Toucher patches the managed objects round-robin, a few every 200 ms, so
// that reconciles keep happening through every disruption.
type Toucher struct {
	cancel  context.CancelFunc
	done    chan struct{}
	touches int
}

// StartTouching starts patching objects until ctx ends or Stop.
func StartTouching(ctx context.Context, objects []ClusterObjects) *Toucher {
	ctx, cancel := context.WithCancel(ctx)
	w := &Toucher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		ticker := time.NewTicker(200 * time.Millisecond)
		defer ticker.Stop()
		for next := 0; ; {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			for _, o := range objects {
				for i := range 5 {
					key := o.Keys[(next+i)%len(o.Keys)]
					patch := fmt.Sprintf(`{"data":{"touch":%q}}`, fmt.Sprint(next+i))
					if err := o.Client.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}},
						client.RawPatch("application/merge-patch+json", []byte(patch))); err == nil {
						w.touches++
					}
				}
			}
			next += 5
		}
	}()
	return w
}

// Stop ends the touching and returns how many patches succeeded.
func (w *Toucher) Stop() int {
	w.cancel()
	<-w.done
	return w.touches
}

// Phase is a stretch of a test, from its start, for counting the
// reconciles in each.
type Phase struct {
	Name  string
	Start time.Time
}

// Finish lets the pods work 2 s more, stops the touching, stops the fleet
// and checks the records (checkRecords), whose counts it returns.
func (f *Fleet) Finish(touching *Toucher, phases []Phase, objectsCluster func(podCluster string) string) Records {
	f.t.Helper()
	time.Sleep(2 * time.Second)
	touches := touching.Stop()
	phases = append(phases, Phase{"end", time.Now()})
	if err := f.Err(); err != nil {
		f.t.Error(err)
	}
	restarts := f.OperatorRestarts()
	for _, name := range slices.Sorted(maps.Keys(restarts)) {
		// An operator exits when it loses its leader election, as when
		// its proxy stops serving; the fleet starts it again.
		f.t.Logf("operator of %s started again %d times", name, restarts[name])
	}
	// Every process ends before the records are read.
	f.stop()
	f.t.Logf("writer touches: %d", touches)
	return f.checkRecords(phases, objectsCluster)
}

// Records are the counts of the pods' records.
type Records struct {
	// Reconciles in all, and by phase in the order of the phases.
	Reconciles int
	ByPhase    []PhaseReconciles
	// Overlaps are the reconciles of one object by two pods at once (each
	// pair once): 0, or the test failed.
	Overlaps int
}

// PhaseReconciles is the number of reconciles that started in a phase.
type PhaseReconciles struct {
	Phase      string
	Reconciles int
}

// checkRecords reads the pods' records once every process has ended and
// checks them: no two pods reconciled one object of one cluster at once,
// and in every phase some reconcile found its object. It logs the counts.
// objectsCluster maps a pod's cluster to the cluster its objects live in
// (itself, or the hub in Fleet scope).
func (f *Fleet) checkRecords(phases []Phase, objectsCluster func(podCluster string) string) Records {
	t := f.t
	t.Helper()
	var counts Records
	files, err := filepath.Glob(filepath.Join(f.recordDir, "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	byCluster := map[string][]operator.Reconcile{}
	var all []operator.Reconcile
	perPod := map[string]int{}
	for _, file := range files {
		podCluster, _, _ := strings.Cut(filepath.Base(file), "--")
		cluster := objectsCluster(podCluster)
		rs, err := operator.ReadRecordFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			perPod[podCluster+"/"+r.Pod]++
		}
		byCluster[cluster] = append(byCluster[cluster], rs...)
		all = append(all, rs...)
	}
	pods := make([]string, 0, len(perPod))
	for p := range perPod {
		pods = append(pods, p)
	}
	sort.Strings(pods)
	for _, p := range pods {
		t.Logf("reconciles by %s: %d", p, perPod[p])
	}
	for i := range len(phases) - 1 {
		outcomes := map[operator.Outcome]int{}
		byPod := map[string]int{}
		n := 0
		for _, r := range all {
			if !r.Start.Before(phases[i].Start) && r.Start.Before(phases[i+1].Start) {
				n++
				outcomes[r.Outcome]++
				byPod[r.Pod]++
			}
		}
		counts.ByPhase = append(counts.ByPhase, PhaseReconciles{Phase: phases[i].Name, Reconciles: n})
		t.Logf("%-14s %5.1fs: %d reconciles, by pod %v, outcomes %v", phases[i].Name,
			phases[i+1].Start.Sub(phases[i].Start).Seconds(), n, byPod, outcomes)
		if outcomes[operator.OutcomeWritten]+outcomes[operator.OutcomeUnchanged] == 0 {
			t.Errorf("%s: no reconcile found its object", phases[i].Name)
		}
	}
	counts.Reconciles = len(all)
	if len(all) == 0 {
		t.Error("no reconcile was recorded")
	}
	clusterNames := make([]string, 0, len(byCluster))
	for c := range byCluster {
		clusterNames = append(clusterNames, c)
	}
	sort.Strings(clusterNames)
	for _, c := range clusterNames {
		overlaps := operator.Overlaps(byCluster[c])
		counts.Overlaps += len(overlaps)
		t.Logf("objects of %s: %d reconciles; overlapping reconciles of one object by two pods: %d", c, len(byCluster[c]), len(overlaps))
		for i, o := range overlaps {
			if i == 20 {
				t.Errorf("... and %d more", len(overlaps)-i)
				break
			}
			t.Errorf("double reconcile in %s: %s", c, o)
		}
	}
	return counts
}

// Placed tells whether pod serves a shard.
func Placed(sc *ctrlmeshv1alpha1.ShardingConfig, pod string) bool {
	return slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
		return slices.Contains(p.Pods, pod)
	})
}

// ServesIn tells whether a serving shard is placed in cluster.
func ServesIn(sc *ctrlmeshv1alpha1.ShardingConfig, cluster string) bool {
	for _, p := range sc.Status.Placement {
		if p.Cluster == cluster && p.State == ctrlmeshv1alpha1.ShardServing && len(p.Pods) > 0 {
			return true
		}
	}
	return false
}

// Waiter waits for the ShardingConfig.
type Waiter struct {
	F   *Fleet
	Key client.ObjectKey
}

// Ready waits until the ShardingConfig is Ready for its generation with
// every shard ready and matches (nil: any), then until every bucket is
// served (ServedWithin from since), and logs how long each took. It
// returns the ShardingConfig then.
func (w *Waiter) Ready(what string, since time.Time, within time.Duration, matches func(*ctrlmeshv1alpha1.ShardingConfig) bool) *ctrlmeshv1alpha1.ShardingConfig {
	t := w.F.t
	t.Helper()
	var sc ctrlmeshv1alpha1.ShardingConfig
	env.Eventually(t, within, what+": ShardingConfig Ready", func() error {
		if err := w.F.Err(); err != nil {
			return err
		}
		if err := w.F.Hub.Client.Get(w.F.ctx, w.Key, &sc); err != nil {
			return err
		}
		st := &sc.Status
		if st.ObservedGeneration != sc.Generation || !meta.IsStatusConditionTrue(st.Conditions, ctrlmeshv1alpha1.ConditionReady) ||
			st.ReadyShards != st.Shards || (matches != nil && !matches(&sc)) {
			return fmt.Errorf("status %+v", *st)
		}
		return nil
	})
	readyAfter := time.Since(since)
	w.Served(what, since, nil)
	if err := w.F.Hub.Client.Get(w.F.ctx, w.Key, &sc); err != nil {
		t.Fatal(err)
	}
	w.F.Logf("%s: Ready after %.1fs (%s)", what, readyAfter.Seconds(), Placement(&sc))
	return &sc
}

// Served waits until every bucket is served and matches (nil: any), within
// ServedWithin from since, and logs when.
func (w *Waiter) Served(what string, since time.Time, matches func(*ctrlmeshv1alpha1.ShardingConfig) bool) *ctrlmeshv1alpha1.ShardingConfig {
	t := w.F.t
	t.Helper()
	var sc ctrlmeshv1alpha1.ShardingConfig
	env.Eventually(t, time.Until(since.Add(ServedWithin)), what+": every bucket served", func() error {
		if err := w.F.Hub.Client.Get(w.F.ctx, w.Key, &sc); err != nil {
			return err
		}
		if matches != nil && !matches(&sc) {
			return fmt.Errorf("placement %s", Placement(&sc))
		}
		return Partition(&sc)
	})
	w.F.Logf("%s: every bucket served %.1fs after the start", what, time.Since(since).Seconds())
	return &sc
}

// domainOf is the Placement domain of a shard: its cluster in PerCluster
// scope, the whole fleet in Fleet scope.
func domainOf(sc *ctrlmeshv1alpha1.ShardingConfig, p ctrlmeshv1alpha1.ShardPlacement) string {
	if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
		return "fleet"
	}
	return p.Cluster
}

// Partition checks, per domain, that the serving shards' buckets are
// disjoint and cover every bucket: no orphan, no bucket served twice.
func Partition(sc *ctrlmeshv1alpha1.ShardingConfig) error {
	buckets := int(sc.Spec.Sharding.Buckets)
	if buckets == 0 {
		buckets = 32
	}
	space := sharding.MustSpace(buckets)
	owners := map[string][]string{}
	if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
		owners["fleet"] = make([]string, buckets)
	} else {
		for _, c := range sc.Spec.Clusters.Names {
			owners[c] = make([]string, buckets)
		}
	}
	var errs []error
	for _, p := range sc.Status.Placement {
		if p.State != ctrlmeshv1alpha1.ShardServing {
			continue
		}
		set, err := space.ParseSet(p.Buckets)
		if err != nil {
			return err
		}
		domain := domainOf(sc, p)
		owner := owners[domain]
		if owner == nil {
			owner = make([]string, buckets)
			owners[domain] = owner
		}
		for _, b := range set.Buckets() {
			if owner[b] != "" {
				errs = append(errs, fmt.Errorf("%s: bucket %d served by shards %s and %s", domain, b, owner[b], p.Shard))
			}
			owner[b] = p.Shard
		}
	}
	for d, owner := range owners {
		var orphans []string
		for b, o := range owner {
			if o == "" {
				orphans = append(orphans, fmt.Sprint(b))
			}
		}
		if len(orphans) > 0 {
			errs = append(errs, fmt.Errorf("%s: buckets %s served by no shard", d, strings.Join(orphans, ",")))
		}
	}
	return errors.Join(errs...)
}

// Owners are the pods the placement gives a namespace's objects to, in
// domain: a shard that names the namespace, else the shard serving its
// bucket.
func Owners(sc *ctrlmeshv1alpha1.ShardingConfig, domain, namespace string) []string {
	var byBucket []string
	space := sharding.MustSpace(32)
	for _, p := range sc.Status.Placement {
		if p.State != ctrlmeshv1alpha1.ShardServing || domainOf(sc, p) != domain {
			continue
		}
		if slices.Contains(p.Namespaces, namespace) {
			return p.Pods
		}
		if set, err := space.ParseSet(p.Buckets); err == nil && set.HasNamespace(namespace) {
			byBucket = append(byBucket, p.Pods...)
		}
	}
	return byBucket
}

// CheckReconciledBy waits until every object's reconciled-by annotation
// names a pod the placement gives its namespace to: what each operator pod
// actually reconciled matches the hub's status. domain says which
// Placement domain an object of the given objects' cluster falls in.
func (f *Fleet) CheckReconciledBy(what string, sc *ctrlmeshv1alpha1.ShardingConfig, objects []ClusterObjects, domain func(cluster string) string) {
	t := f.t
	t.Helper()
	start := time.Now()
	env.Eventually(t, ServedWithin, what+": objects reconciled by their owners", func() error {
		var wrong []string
		for _, o := range objects {
			var list corev1.ConfigMapList
			if err := o.Client.List(f.ctx, &list, client.MatchingLabels{operator.ManagedLabel: operator.ManagedValue}); err != nil {
				return err
			}
			if len(list.Items) != len(o.Keys) {
				return fmt.Errorf("%s: %d managed objects, want %d", o.Cluster, len(list.Items), len(o.Keys))
			}
			for _, cm := range list.Items {
				want := Owners(sc, domain(o.Cluster), cm.Namespace)
				if got := cm.Annotations[operator.ReconciledByAnnotation]; !slices.Contains(want, got) {
					wrong = append(wrong, fmt.Sprintf("%s %s/%s by %q, owners %v", o.Cluster, cm.Namespace, cm.Name, got, want))
				}
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%d objects not (yet) reconciled by their owner, such as %s", len(wrong), wrong[0])
		}
		return nil
	})
	f.Logf("%s: every object reconciled by its owner after %.1fs", what, time.Since(start).Seconds())
}

// Placement is a one-line summary of the placement.
func Placement(sc *ctrlmeshv1alpha1.ShardingConfig) string {
	var parts []string
	for _, p := range sc.Status.Placement {
		s := fmt.Sprintf("%s/%s:%s=%s", p.Cluster, p.Shard, strings.Join(p.Pods, "+"), p.Buckets)
		if len(p.Namespaces) > 0 {
			s += "+ns:" + strings.Join(p.Namespaces, ",")
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// Probe patches every object once (data key "probe" set to value), so that
// each is reconciled at once by whichever pod serves it; ReconciledSince
// then measures when that happened.
func (f *Fleet) Probe(objects []ClusterObjects, value string) {
	t := f.t
	t.Helper()
	start := time.Now()
	patch := client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"data":{"probe":%q}}`, value))
	var g errgroup.Group
	g.SetLimit(8)
	for _, o := range objects {
		for _, key := range o.Keys {
			g.Go(func() error {
				if err := o.Client.Patch(f.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}, patch); err != nil {
					return fmt.Errorf("probing %s %s: %w", o.Cluster, key, err)
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	f.Logf("probe %q: every object patched in %.1fs", value, time.Since(start).Seconds())
}

// ReconciledSince waits, within of since, until every object has been
// reconciled by its owner in sc's placement (a run that started at or after
// since and found its object), reading the pods' records as they are
// written. It returns the time from since until the last object's first
// such run ended: how long the objects went unserved, at most. It logs it
// as what's time to be served again. objectsCluster is as for Finish.
func (f *Fleet) ReconciledSince(what string, since time.Time, within time.Duration, sc *ctrlmeshv1alpha1.ShardingConfig,
	objects []ClusterObjects, objectsCluster func(podCluster string) string) time.Duration {
	t := f.t
	t.Helper()
	var last time.Duration
	env.Eventually(t, time.Until(since.Add(within)), what+": every object reconciled by its owner", func() error {
		if err := f.Err(); err != nil {
			return err
		}
		served, err := FirstReconciles(f.recordDir, since, sc, objectsCluster)
		if err != nil {
			return err
		}
		last = 0
		var missing []string
		for _, o := range objects {
			for _, key := range o.Keys {
				end, ok := served[o.Cluster+"/"+key.String()]
				if !ok {
					missing = append(missing, o.Cluster+" "+key.String())
					continue
				}
				last = max(last, end.Sub(since))
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d objects not reconciled by their owner yet, such as %s", len(missing), missing[0])
		}
		return nil
	})
	f.Logf("%s: every object reconciled by its owner %.1fs after the start", what, last.Seconds())
	return last
}

// FirstReconciles reads the records so far in recordDir (one file per pod,
// <cluster>--<pod>.jsonl) and returns, by "<cluster>/<namespace>/<name>",
// when the first run since since by an owner in sc that found its object
// ended. A record being written may be cut short: the error says so and the
// caller reads again.
func FirstReconciles(recordDir string, since time.Time, sc *ctrlmeshv1alpha1.ShardingConfig, objectsCluster func(string) string) (map[string]time.Time, error) {
	files, err := filepath.Glob(filepath.Join(recordDir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	first := map[string]time.Time{}
	for _, file := range files {
		podCluster, _, _ := strings.Cut(filepath.Base(file), "--")
		cluster := objectsCluster(podCluster)
		domain := cluster
		if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
			domain = "fleet"
		}
		rs, err := operator.ReadRecordFile(file)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			if r.Start.Before(since) || (r.Outcome != operator.OutcomeWritten && r.Outcome != operator.OutcomeUnchanged) ||
				!slices.Contains(Owners(sc, domain, r.Namespace), r.Pod) {
				continue
			}
			key := cluster + "/" + r.Namespace + "/" + r.Name
			if at, ok := first[key]; !ok || r.End.Before(at) {
				first[key] = r.End
			}
		}
	}
	return first, nil
}
