// Package e2e_test holds end-to-end tests on a local fleet (package
// localfleet): real kube-apiservers and etcds, the hub and the agents in
// this process, the demo operator's pods as ctrlmesh-proxy and demo-operator
// processes that record every reconcile.
package e2e_test

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
	// opNamespace holds the demo operator's pods and its ShardingConfig,
	// opName names both.
	opNamespace = "operators"
	opName      = "demo-operator"

	namespaces   = 20
	perNamespace = 10

	// readyWithin bounds the wait for Ready after a disruption, and
	// servedWithin the wait until every bucket is served again.
	readyWithin  = 45 * time.Second
	servedWithin = 30 * time.Second
	// failoverBound bounds the time from a pod's crash until its buckets
	// are served by other pods (Ready: every shard's pods enforce the rules
	// and one of them leads it): its shard lease must expire first, then
	// the agent reports it, the hub publishes and the proxies apply.
	// make bench-fleet measures it against the goal of lease + 3 s.
	failoverBound = localfleet.OperatorLeaseDuration + 5*time.Second

	// reconcileDelay makes every reconcile last a little, so that two at
	// once would intersect in the records.
	reconcileDelay = 20 * time.Millisecond
)

// binDir holds kube-apiserver and etcd (links to the test assets) and
// ctrlmesh-proxy and demo-operator built from this checkout by TestMain.
var binDir string

func TestMain(m *testing.M) {
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
// links to kube-apiserver and etcd, as cmd/ctrlmeshctl's demo test does.
func buildBinaries(dir string) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	assets := os.Getenv(env.AssetsEnv)
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	if err := controlplane.CheckBinaries(assets, "run 'make tools'", "kube-apiserver", "etcd"); err != nil {
		return err
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
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

// testFleet is a local fleet with the hub up and every member joined, and
// the demo operator's pods, each recording its reconciles.
type testFleet struct {
	*localfleet.Fleet
	t       *testing.T
	ctx     context.Context
	started time.Time
	// recordDir holds one record file per pod, <cluster>--<pod>.jsonl.
	recordDir string
	pods      map[string]*localfleet.Pod
	stopOnce  sync.Once
}

// startFleet starts the fleet of opts (BinDir, CRDDirs and WorkDir are
// filled in), the hub, and joins every member; it creates opNamespace on
// the hub and the members.
func startFleet(t *testing.T, ctx context.Context, opts localfleet.Options) *testFleet {
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
	f := &testFleet{t: t, ctx: ctx, started: time.Now(), recordDir: filepath.Join(workDir, "records"), pods: map[string]*localfleet.Pod{}}
	if err := os.Mkdir(f.recordDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if f.Fleet, err = localfleet.Start(ctx, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.stop)
	f.logf("API servers up")
	if err := f.StartHub(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range opts.Members {
		if err := f.Join(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	f.logf("hub up, %s joined", strings.Join(opts.Members, ", "))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNamespace}}
	env.Create(t, ctx, f.Hub.Client, ns.DeepCopy())
	for _, m := range f.Members {
		env.Create(t, ctx, m.Client, ns.DeepCopy())
	}
	return f
}

// stop stops the whole fleet, once; the records are complete after it.
func (f *testFleet) stop() {
	f.stopOnce.Do(func() {
		if err := f.Stop(); err != nil {
			f.t.Errorf("stopping the fleet: %v", err)
		}
	})
}

func (f *testFleet) logf(format string, args ...any) {
	f.t.Helper()
	f.t.Logf("[%5.1fs] "+format, append([]any{time.Since(f.started).Seconds()}, args...)...)
}

// startPod starts an operator pod of opName in cluster, labeled
// app=opName plus extraLabels, recording its reconciles.
func (f *testFleet) startPod(cluster, name string, objectsOnHub bool, extraLabels map[string]string) {
	f.t.Helper()
	labels := map[string]string{"app": opName}
	for k, v := range extraLabels {
		labels[k] = v
	}
	p, err := f.StartPod(f.ctx, localfleet.PodSpec{
		Cluster: cluster, Namespace: opNamespace, Name: name, Labels: labels, RulesName: opName, ObjectsOnHub: objectsOnHub,
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

func (f *testFleet) killPod(name string) {
	f.t.Helper()
	if err := f.KillPod(f.ctx, f.pods[name]); err != nil {
		f.t.Fatal(err)
	}
}

// shardingConfig shards the demo operator's pods in both members.
func shardingConfig(scope ctrlmeshv1alpha1.ShardingScope) *ctrlmeshv1alpha1.ShardingConfig {
	sc := localfleet.ShardingConfig(opNamespace, opName, []string{member1, member2})
	sc.Spec.Scope = scope
	return sc
}

// managedObjects creates perNamespace managed ConfigMaps in each of the
// spread namespaces of c and returns them.
func managedObjects(t *testing.T, ctx context.Context, c client.Client) []client.ObjectKey {
	t.Helper()
	var objects []client.ObjectKey
	// canaryNamespace and others, each in a bucket of its own (of the
	// default 32), so that every pod gets objects.
	spread, _ := env.SpreadNamespaces(sharding.MustSpace(32), "t", []string{canaryNamespace}, namespaces)
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

// canaryNamespace is a namespace of its own bucket that canary steps name.
const canaryNamespace = "team-a"

// clusterObjects are the managed objects of one cluster.
type clusterObjects struct {
	cluster string
	client  client.Client
	keys    []client.ObjectKey
}

// toucher patches the managed objects round-robin, a few every 200 ms, so
// that reconciles keep happening through every disruption.
type toucher struct {
	cancel  context.CancelFunc
	done    chan struct{}
	touches int
}

func startTouching(ctx context.Context, objects []clusterObjects) *toucher {
	ctx, cancel := context.WithCancel(ctx)
	w := &toucher{cancel: cancel, done: make(chan struct{})}
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
					key := o.keys[(next+i)%len(o.keys)]
					patch := fmt.Sprintf(`{"data":{"touch":%q}}`, fmt.Sprint(next+i))
					if err := o.client.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}},
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

// stop ends the touching and returns how many patches succeeded.
func (w *toucher) stop() int {
	w.cancel()
	<-w.done
	return w.touches
}

// phase is a stretch of a test, from its start, for counting the
// reconciles in each.
type phase struct {
	name  string
	start time.Time
}

// finish lets the pods work 2 s more, stops the touching, stops the fleet
// and checks the records (checkRecords).
func (f *testFleet) finish(touching *toucher, phases []phase, objectsCluster func(podCluster string) string) {
	f.t.Helper()
	time.Sleep(2 * time.Second)
	touches := touching.stop()
	phases = append(phases, phase{"end", time.Now()})
	if err := f.Err(); err != nil {
		f.t.Error(err)
	}
	for _, name := range slices.Sorted(maps.Keys(f.pods)) {
		if n := f.pods[name].OperatorRestarts(); n > 0 {
			// An operator exits when it loses its leader election, as
			// when its proxy stops serving; the fleet starts it again.
			f.t.Logf("operator of %s started again %d times", name, n)
		}
	}
	// Every process ends before the records are read.
	f.stop()
	f.t.Logf("writer touches: %d", touches)
	f.checkRecords(phases, objectsCluster)
}

// checkRecords reads the pods' records once every process has ended and
// checks them: no two pods reconciled one object of one cluster at once,
// and in every phase some reconcile found its object. It logs the counts.
// objectsCluster maps a pod's cluster to the cluster its objects live in
// (itself, or the hub in Fleet scope).
func (f *testFleet) checkRecords(phases []phase, objectsCluster func(podCluster string) string) {
	t := f.t
	t.Helper()
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
			if !r.Start.Before(phases[i].start) && r.Start.Before(phases[i+1].start) {
				n++
				outcomes[r.Outcome]++
				byPod[r.Pod]++
			}
		}
		t.Logf("%-14s %5.1fs: %d reconciles, by pod %v, outcomes %v", phases[i].name,
			phases[i+1].start.Sub(phases[i].start).Seconds(), n, byPod, outcomes)
		if outcomes[operator.OutcomeWritten]+outcomes[operator.OutcomeUnchanged] == 0 {
			t.Errorf("%s: no reconcile found its object", phases[i].name)
		}
	}
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
		t.Logf("objects of %s: %d reconciles; overlapping reconciles of one object by two pods: %d", c, len(byCluster[c]), len(overlaps))
		for i, o := range overlaps {
			if i == 20 {
				t.Errorf("... and %d more", len(overlaps)-i)
				break
			}
			t.Errorf("double reconcile in %s: %s", c, o)
		}
	}
}

// placed tells whether pod serves a shard.
func placed(sc *ctrlmeshv1alpha1.ShardingConfig, pod string) bool {
	return slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
		return slices.Contains(p.Pods, pod)
	})
}

// waiter waits for the ShardingConfig.
type waiter struct {
	f   *testFleet
	key client.ObjectKey
}

// ready waits until the ShardingConfig is Ready for its generation with
// every shard ready and matches (nil: any), then until every bucket is
// served (servedWithin from since), and logs how long each took. It
// returns the ShardingConfig then.
func (w *waiter) ready(what string, since time.Time, within time.Duration, matches func(*ctrlmeshv1alpha1.ShardingConfig) bool) *ctrlmeshv1alpha1.ShardingConfig {
	t := w.f.t
	t.Helper()
	var sc ctrlmeshv1alpha1.ShardingConfig
	env.Eventually(t, within, what+": ShardingConfig Ready", func() error {
		if err := w.f.Err(); err != nil {
			return err
		}
		if err := w.f.Hub.Client.Get(w.f.ctx, w.key, &sc); err != nil {
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
	w.served(what, since, nil)
	if err := w.f.Hub.Client.Get(w.f.ctx, w.key, &sc); err != nil {
		t.Fatal(err)
	}
	w.f.logf("%s: Ready after %.1fs (%s)", what, readyAfter.Seconds(), placement(&sc))
	return &sc
}

// served waits until every bucket is served and matches (nil: any), within
// servedWithin from since, and logs when.
func (w *waiter) served(what string, since time.Time, matches func(*ctrlmeshv1alpha1.ShardingConfig) bool) *ctrlmeshv1alpha1.ShardingConfig {
	t := w.f.t
	t.Helper()
	var sc ctrlmeshv1alpha1.ShardingConfig
	env.Eventually(t, time.Until(since.Add(servedWithin)), what+": every bucket served", func() error {
		if err := w.f.Hub.Client.Get(w.f.ctx, w.key, &sc); err != nil {
			return err
		}
		if matches != nil && !matches(&sc) {
			return fmt.Errorf("placement %s", placement(&sc))
		}
		return partition(&sc)
	})
	w.f.logf("%s: every bucket served %.1fs after the start", what, time.Since(since).Seconds())
	return &sc
}

// domainOf is the placement domain of a shard: its cluster in PerCluster
// scope, the whole fleet in Fleet scope.
func domainOf(sc *ctrlmeshv1alpha1.ShardingConfig, p ctrlmeshv1alpha1.ShardPlacement) string {
	if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
		return "fleet"
	}
	return p.Cluster
}

// partition checks, per domain, that the serving shards' buckets are
// disjoint and cover every bucket: no orphan, no bucket served twice.
func partition(sc *ctrlmeshv1alpha1.ShardingConfig) error {
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

// owners are the pods the placement gives a namespace's objects to, in
// domain: a shard that names the namespace, else the shard serving its
// bucket.
func owners(sc *ctrlmeshv1alpha1.ShardingConfig, domain, namespace string) []string {
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

// checkReconciledBy waits until every object's reconciled-by annotation
// names a pod the placement gives its namespace to: what each operator pod
// actually reconciled matches the hub's status. domain says which
// placement domain an object of the given objects' cluster falls in.
func (f *testFleet) checkReconciledBy(what string, sc *ctrlmeshv1alpha1.ShardingConfig, objects []clusterObjects, domain func(cluster string) string) {
	t := f.t
	t.Helper()
	start := time.Now()
	env.Eventually(t, servedWithin, what+": objects reconciled by their owners", func() error {
		var wrong []string
		for _, o := range objects {
			var list corev1.ConfigMapList
			if err := o.client.List(f.ctx, &list, client.MatchingLabels{operator.ManagedLabel: operator.ManagedValue}); err != nil {
				return err
			}
			if len(list.Items) != len(o.keys) {
				return fmt.Errorf("%s: %d managed objects, want %d", o.cluster, len(list.Items), len(o.keys))
			}
			for _, cm := range list.Items {
				want := owners(sc, domain(o.cluster), cm.Namespace)
				if got := cm.Annotations[operator.ReconciledByAnnotation]; !slices.Contains(want, got) {
					wrong = append(wrong, fmt.Sprintf("%s %s/%s by %q, owners %v", o.cluster, cm.Namespace, cm.Name, got, want))
				}
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%d objects not (yet) reconciled by their owner, such as %s", len(wrong), wrong[0])
		}
		return nil
	})
	f.logf("%s: every object reconciled by its owner after %.1fs", what, time.Since(start).Seconds())
}

// placement is a one-line summary of the placement.
func placement(sc *ctrlmeshv1alpha1.ShardingConfig) string {
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
