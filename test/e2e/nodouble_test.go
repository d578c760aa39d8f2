// Package e2e_test holds end-to-end tests on a local fleet (package
// localfleet): real kube-apiservers and etcds, the hub and the agents in
// this process, the demo operator's pods as ctrlmesh-proxy and demo-operator
// processes.
package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net"
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
	"github.com/karmada-io/karmada/pkg/util/names"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ctrlmesh/ctrlmesh/agent"
	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	"github.com/ctrlmesh/ctrlmesh/agent/join"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/pkg/localfleet"
	"github.com/ctrlmesh/ctrlmesh/pkg/localfleet/clusters"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
	"github.com/ctrlmesh/ctrlmesh/test/certs"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The fleet of the test: one member, whose demo operator pods in
// opNamespace are sharded by the ShardingConfig opName.
const (
	member      = "member1"
	opNamespace = "operators"
	opName      = "demo-operator"
	canaryPod   = opName + "-canary"
	// canaryNamespace is served by the canary at both of its steps.
	canaryNamespace = "team-a"

	namespaces   = 20
	perNamespace = 10

	// readyWithin bounds the wait for Ready after a disruption, and
	// servedWithin the wait until every bucket is served again.
	readyWithin  = 45 * time.Second
	servedWithin = 30 * time.Second

	// reconcileDelay makes every reconcile last a little, so that two at
	// once would intersect in the records.
	reconcileDelay = 20 * time.Millisecond
)

func TestMain(m *testing.M) {
	// The hub and the agents log to files; controller-runtime and
	// client-go's global loggers are silenced.
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// TestNoDoubleReconcile runs the demo operator's pods, recording every
// reconcile, on a member in range mode while ConfigMaps keep changing, and
// goes through rebalancing, a pod kill, a canary's steps, a hub restart and
// an agent restart. No object may ever be reconciled by two pods at once,
// and after each disruption every bucket is served again.
func TestNoDoubleReconcile(t *testing.T) {
	if testing.Short() {
		t.Skip("starts API servers and operator processes")
	}
	started := time.Now()
	binDir := binDirWithRecording(t)
	recordDir := filepath.Join(binDir, "records")
	if err := os.Mkdir(recordDir, 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := clusters.RepoRoot()
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

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fleet, err := localfleet.Start(ctx, localfleet.Options{
		BinDir: binDir, CRDDirs: clusters.CRDDirs(root), WorkDir: workDir, Members: []string{member},
		// Range mode: the canary serves a namespace besides buckets.
		MemberFeatureGates: []string{clusters.FeatureShardedListAndWatch},
	})
	if err != nil {
		t.Fatal(err)
	}
	var stopFleet sync.Once
	stopAll := func() {
		stopFleet.Do(func() {
			if err := fleet.Stop(); err != nil {
				t.Errorf("stopping the fleet: %v", err)
			}
		})
	}
	// Cleanups run last first: the hub and the agent, registered later,
	// stop before the API servers.
	t.Cleanup(stopAll)
	t.Logf("[%5.1fs] API servers up", time.Since(started).Seconds())

	h := newHubRunner(t, fleet, workDir)
	h.start(t)
	a := prepareAgent(t, ctx, fleet, workDir)
	a.start(t)
	waitFor(t, time.Minute, "the hub to accept "+member, func() error {
		ok, err := join.IsAccepted(ctx, fleet.Hub.Client, member)
		if err == nil && !ok {
			err = errors.New("not accepted")
		}
		return err
	})

	m := fleet.Members[member]
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNamespace}}
	mustCreate(t, ctx, fleet.Hub.Client, ns.DeepCopy())
	mustCreate(t, ctx, m.Client, ns.DeepCopy())
	pods := map[string]*localfleet.Pod{}
	startPod := func(name string, extraLabels map[string]string) {
		t.Helper()
		labels := map[string]string{"app": opName}
		for k, v := range extraLabels {
			labels[k] = v
		}
		p, err := fleet.StartPod(ctx, localfleet.PodSpec{Cluster: member, Namespace: opNamespace, Name: name, Labels: labels, RulesName: opName})
		if err != nil {
			t.Fatal(err)
		}
		pods[name] = p
	}
	for i := range 2 {
		startPod(fmt.Sprintf("%s-%d", opName, i), nil)
	}

	// The managed ConfigMaps, over namespaces whose buckets spread.
	var objects []client.ObjectKey
	for _, nsName := range spreadNamespaces() {
		mustCreate(t, ctx, m.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName}})
		for j := range perNamespace {
			cm := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: nsName, Name: fmt.Sprintf("cm-%02d", j),
					Labels: map[string]string{operator.ManagedLabel: operator.ManagedValue}},
				Data: map[string]string{"touch": "0"},
			}
			mustCreate(t, ctx, m.Client, cm)
			objects = append(objects, client.ObjectKeyFromObject(cm))
		}
	}

	sc := &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: opName},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector:   metav1.LabelSelector{MatchLabels: map[string]string{"app": opName}},
			Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: operator.DefaultLeaderElectionID},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
			}}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{member}},
			Scope:    ctrlmeshv1alpha1.ScopePerCluster,
			Canary: &ctrlmeshv1alpha1.CanarySpec{
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
				Steps: []ctrlmeshv1alpha1.CanaryStep{
					{Namespaces: []string{canaryNamespace}},
					{Buckets: "0-3", Namespaces: []string{canaryNamespace}},
				},
				MinHealthySeconds: 2,
			},
		},
	}
	mustCreate(t, ctx, fleet.Hub.Client, sc)
	w := &waiter{t: t, ctx: ctx, fleet: fleet, key: client.ObjectKeyFromObject(sc)}
	w.ready("initial placement", time.Now(), 90*time.Second, nil)

	// The writer touches the ConfigMaps round-robin, a few every 200 ms,
	// so that reconciles keep happening through every disruption.
	writerCtx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan int, 1)
	go func() {
		touches, next := 0, 0
		ticker := time.NewTicker(200 * time.Millisecond)
		defer ticker.Stop()
		for {
			select {
			case <-writerCtx.Done():
				writerDone <- touches
				return
			case <-ticker.C:
			}
			for range 5 {
				key := objects[next%len(objects)]
				next++
				patch := fmt.Sprintf(`{"data":{"touch":%q}}`, fmt.Sprint(next))
				if err := m.Client.Patch(writerCtx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}},
					client.RawPatch("application/merge-patch+json", []byte(patch))); err == nil {
					touches++
				}
			}
		}
	}()
	defer stopWriter()
	// phases are the stretches of the test, each from its start, for
	// counting the reconciles in each.
	type phase struct {
		name  string
		start time.Time
	}
	phases := []phase{{"steady", time.Now()}}
	time.Sleep(2 * time.Second)

	// (1) Rebalancing: a third pod takes a share of the buckets.
	added := opName + "-2"
	t0 := time.Now()
	phases = append(phases, phase{"rebalancing", t0})
	startPod(added, nil)
	w.ready("rebalancing (pod added)", t0, readyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return placed(sc, added)
	})

	// (2) Pod kill: its buckets move to the others once its lease expires.
	victim := opName + "-0"
	t0 = time.Now()
	phases = append(phases, phase{"pod kill", t0})
	if err := fleet.KillPod(ctx, pods[victim]); err != nil {
		t.Fatal(err)
	}
	w.ready("pod kill", t0, readyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !placed(sc, victim)
	})

	// (3) Canary promotion: the canary pod serves its namespace, then that
	// and buckets 0-3.
	t0 = time.Now()
	phases = append(phases, phase{"canary", t0})
	startPod(canaryPod, map[string]string{"track": "canary"})
	var promoted string
	for step := range int32(len(sc.Spec.Canary.Steps)) {
		want := sc.Spec.Canary.Steps[step]
		promoted = w.ready(fmt.Sprintf("canary step %d", step+1), t0, readyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
			if sc.Status.Canary == nil || sc.Status.Canary.Step < step {
				return false
			}
			// A short step may be over before a poll sees it.
			return sc.Status.Canary.Step > step || slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
				return p.Canary && p.Buckets == want.Buckets && slices.Equal(p.Namespaces, want.Namespaces)
			})
		})
	}

	// (4) Hub restart: the pods keep serving meanwhile.
	t0 = time.Now()
	phases = append(phases, phase{"hub restart", t0})
	h.stop()
	time.Sleep(2 * time.Second)
	h.start(t)
	// The restarted hub keeps the placement; the status may have stayed
	// Ready throughout, so this is mostly the time it was down.
	if got := w.ready("hub restart", t0, readyWithin, nil); got != promoted {
		t.Errorf("the placement changed over the hub restart:\n%s\nto\n%s", promoted, got)
	}

	// (5) Agent restart.
	t0 = time.Now()
	phases = append(phases, phase{"agent restart", t0})
	a.stop()
	time.Sleep(2 * time.Second)
	a.start(t)
	if got := w.ready("agent restart", t0, readyWithin, nil); got != promoted {
		t.Errorf("the placement changed over the agent restart:\n%s\nto\n%s", promoted, got)
	}

	time.Sleep(2 * time.Second)
	stopWriter()
	phases = append(phases, phase{"end", time.Now()})
	touches := <-writerDone
	if err := fleet.Err(); err != nil {
		t.Error(err)
	}
	// Every process ends before the records are read: the agent and the
	// hub, then the pods and the API servers.
	a.stop()
	h.stop()
	stopAll()

	var records []operator.Reconcile
	perPod := map[string]int{}
	files, err := filepath.Glob(filepath.Join(recordDir, "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		rs, err := operator.ReadRecordFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			perPod[r.Pod]++
		}
		records = append(records, rs...)
	}
	podNames := make([]string, 0, len(perPod))
	for p := range perPod {
		podNames = append(podNames, p)
	}
	sort.Strings(podNames)
	for _, p := range podNames {
		t.Logf("reconciles by %s: %d", p, perPod[p])
	}
	// Reconciles must keep happening through every disruption.
	for i := range len(phases) - 1 {
		outcomes := map[operator.Outcome]int{}
		byPod := map[string]int{}
		n := 0
		for _, r := range records {
			if !r.Start.Before(phases[i].start) && r.Start.Before(phases[i+1].start) {
				n++
				outcomes[r.Outcome]++
				byPod[r.Pod]++
			}
		}
		t.Logf("%-13s %5.1fs: %d reconciles, by pod %v, outcomes %v", phases[i].name,
			phases[i+1].start.Sub(phases[i].start).Seconds(), n, byPod, outcomes)
		if outcomes[operator.OutcomeWritten]+outcomes[operator.OutcomeUnchanged] == 0 {
			t.Errorf("%s: no reconcile found its object", phases[i].name)
		}
	}
	overlaps := operator.Overlaps(records)
	t.Logf("reconciles: %d in total over %d objects (%d writer touches); overlapping reconciles of one object by two pods: %d",
		len(records), len(objects), touches, len(overlaps))
	if len(records) == 0 {
		t.Error("no reconcile was recorded")
	}
	for i, o := range overlaps {
		if i == 20 {
			t.Errorf("... and %d more", len(overlaps)-i)
			break
		}
		t.Errorf("double reconcile: %s", o)
	}
	t.Logf("run time %.1fs", time.Since(started).Seconds())
}

// spreadNamespaces names the test's namespaces: canaryNamespace and others,
// each in a bucket of its own (of the default 32), so that every pod gets
// objects. Names that differ only in their last bytes, such as ns-01 and
// ns-02, share their bucket: the hash's top bits barely depend on them.
func spreadNamespaces() []string {
	scheme := sharding.MustScheme(32)
	out := []string{canaryNamespace}
	used := map[int]bool{scheme.Bucket(canaryNamespace): true}
	for i := 0; len(out) < namespaces; i++ {
		if i == 10000 {
			panic("no namespace names spread over the buckets")
		}
		name := fmt.Sprintf("t%03d-ns", i)
		if b := scheme.Bucket(name); !used[b] {
			used[b] = true
			out = append(out, name)
		}
	}
	return out
}

// placed tells whether pod serves a shard.
func placed(sc *ctrlmeshv1alpha1.ShardingConfig, pod string) bool {
	return slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
		return slices.Contains(p.Pods, pod)
	})
}

// waiter waits for the ShardingConfig.
type waiter struct {
	t     *testing.T
	ctx   context.Context
	fleet *localfleet.Fleet
	key   client.ObjectKey
}

// ready waits until the ShardingConfig is Ready for its generation with
// every shard ready and matches (nil: any), then until every bucket is
// served (servedWithin from since), and logs how long each took. It
// returns the placement then.
func (w *waiter) ready(what string, since time.Time, within time.Duration, matches func(*ctrlmeshv1alpha1.ShardingConfig) bool) string {
	w.t.Helper()
	var sc ctrlmeshv1alpha1.ShardingConfig
	waitFor(w.t, within, what+": ShardingConfig Ready", func() error {
		if err := w.fleet.Err(); err != nil {
			return err
		}
		if err := w.fleet.Hub.Client.Get(w.ctx, w.key, &sc); err != nil {
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
	waitFor(w.t, time.Until(since.Add(servedWithin)), what+": every bucket served", func() error {
		if err := w.fleet.Hub.Client.Get(w.ctx, w.key, &sc); err != nil {
			return err
		}
		return partition(&sc)
	})
	w.t.Logf("%s: Ready after %.1fs, every bucket served after %.1fs (%s)", what, readyAfter.Seconds(), time.Since(since).Seconds(), placement(&sc))
	return placement(&sc)
}

// partition checks, per cluster, that the serving shards' buckets are
// disjoint and cover every bucket: no orphan, no bucket served twice.
func partition(sc *ctrlmeshv1alpha1.ShardingConfig) error {
	buckets := int(sc.Spec.Sharding.Buckets)
	if buckets == 0 {
		buckets = 32
	}
	scheme := sharding.MustScheme(buckets)
	owners := map[string][]string{}
	for _, c := range sc.Spec.Clusters.Names {
		owners[c] = make([]string, buckets)
	}
	var errs []error
	for _, p := range sc.Status.Placement {
		if p.State != ctrlmeshv1alpha1.ShardServing {
			continue
		}
		set, err := scheme.ParseSet(p.Buckets)
		if err != nil {
			return err
		}
		owner := owners[p.Cluster]
		if owner == nil {
			owner = make([]string, buckets)
			owners[p.Cluster] = owner
		}
		for _, b := range set.Buckets() {
			if owner[b] != "" {
				errs = append(errs, fmt.Errorf("%s: bucket %d served by shards %s and %s", p.Cluster, b, owner[b], p.Shard))
			}
			owner[b] = p.Shard
		}
	}
	for c, owner := range owners {
		var orphans []string
		for b, o := range owner {
			if o == "" {
				orphans = append(orphans, fmt.Sprint(b))
			}
		}
		if len(orphans) > 0 {
			errs = append(errs, fmt.Errorf("%s: buckets %s served by no shard", c, strings.Join(orphans, ",")))
		}
	}
	return errors.Join(errs...)
}

// placement is a one-line summary of the placement.
func placement(sc *ctrlmeshv1alpha1.ShardingConfig) string {
	var parts []string
	for _, p := range sc.Status.Placement {
		s := fmt.Sprintf("%s:%s=%s", p.Shard, strings.Join(p.Pods, "+"), p.Buckets)
		if len(p.Namespaces) > 0 {
			s += "+ns:" + strings.Join(p.Namespaces, ",")
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// binDirWithRecording builds ctrlmesh-proxy and demo-operator from this
// checkout into a temporary directory, next to links to kube-apiserver and
// etcd, as cmd/ctrlmeshctl's demo test does. localfleet starts
// <BinDir>/demo-operator with no way to add flags, so demo-operator there is
// a script that runs the real binary with --record-file=<dir>/records/<pod>.jsonl
// and --reconcile-delay.
func binDirWithRecording(t *testing.T) string {
	t.Helper()
	root, err := clusters.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	assets := os.Getenv(env.AssetsEnv)
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	if err := clusters.CheckBinaries(assets, "run 'make tools'", "kube-apiserver", "etcd"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if err := os.Symlink(filepath.Join(assets, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	realDir := filepath.Join(dir, "real")
	build := exec.Command("go", "build", "-o", realDir+"/", "./cmd/ctrlmesh-proxy", "./scenarios/demo-operator")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the binaries: %v\n%s", err, out)
	}
	if err := os.Symlink(filepath.Join(realDir, "ctrlmesh-proxy"), filepath.Join(dir, "ctrlmesh-proxy")); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
pod=unknown
for a in "$@"; do
	case "$a" in --pod-name=*) pod="${a#--pod-name=}" ;; esac
done
exec %q "$@" --record-file=%q/"$pod".jsonl --reconcile-delay=%s
`, filepath.Join(realDir, "demo-operator"), filepath.Join(dir, "records"), reconcileDelay)
	if err := os.WriteFile(filepath.Join(dir, "demo-operator"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// component runs the hub or an agent in this process, and can stop it and
// start it again.
type component struct {
	name string
	run  func(ctx context.Context) error

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan error
}

func (c *component) start(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		t.Fatalf("%s runs already", c.name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.run(ctx) }()
	c.cancel, c.done = cancel, done
	t.Cleanup(c.stopper(t))
}

func (c *component) stopper(t *testing.T) func() {
	return func() {
		c.mu.Lock()
		cancel, done := c.cancel, c.done
		c.cancel, c.done = nil, nil
		c.mu.Unlock()
		if cancel == nil {
			return
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		case <-time.After(time.Minute):
			t.Errorf("%s did not stop within a minute", c.name)
		}
	}
}

// runner is a component with its stop bound to the test.
type runner struct {
	*component
	t *testing.T
}

func (r runner) stop() { r.stopper(r.t)() }

// newHubRunner prepares the hub's namespace and RBAC, as localfleet's
// StartHub does, and returns a runner of the hub with exactly that RBAC.
// localfleet runs the hub until Stop; the test runs it itself to restart it.
func newHubRunner(t *testing.T, fleet *localfleet.Fleet, workDir string) runner {
	t.Helper()
	ctx := context.Background()
	mustCreate(t, ctx, fleet.Hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: join.AgentNamespace}})
	for _, obj := range hub.RBAC(join.AgentNamespace, true) {
		mustCreate(t, ctx, fleet.Hub.Client, obj)
	}
	identity, err := fleet.Hub.AddUser("system:serviceaccount:" + join.AgentNamespace + ":" + hub.ServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	log := fileLogger(t, workDir, "hub")
	return runner{t: t, component: &component{name: "hub", run: func(ctx context.Context) error {
		return hub.Run(ctx, hub.Options{Config: identity, AutoAccept: true, MetricsAddress: "0", HealthAddress: "0", Log: log})
	}}}
}

// prepareAgent prepares the hub and the member for the member's agent, as
// localfleet's Join does, and returns a runner of the agent in standalone
// mode with its shipped RBAC; it keeps its webhook port and certificate
// across restarts.
func prepareAgent(t *testing.T, ctx context.Context, fleet *localfleet.Fleet, workDir string) runner {
	t.Helper()
	m := fleet.Members[member]
	mustCreate(t, ctx, fleet.Hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: names.GenerateExecutionSpaceName(member)}})
	for _, obj := range join.AgentHubRBAC(member) {
		mustCreate(t, ctx, fleet.Hub.Client, obj)
	}
	mustCreate(t, ctx, m.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: join.AgentNamespace}})
	for _, obj := range agent.MemberRBAC(join.AgentNamespace) {
		mustCreate(t, ctx, m.Client, obj)
	}
	hubIdentity, err := fleet.Hub.AddUser(join.AgentUserName(member))
	if err != nil {
		t.Fatal(err)
	}
	memberIdentity, err := m.AddUser("system:serviceaccount:" + join.AgentNamespace + ":" + agent.ServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	certDir := filepath.Join(workDir, "agent-"+member+"-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	caPEM, err := certs.WriteServing(certDir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	log := fileLogger(t, workDir, "agent-"+member)
	return runner{t: t, component: &component{name: "agent " + member, run: func(ctx context.Context) error {
		return agent.Run(ctx, agent.Options{
			Member: rest.CopyConfig(memberIdentity), Hub: rest.CopyConfig(hubIdentity), ClusterName: member, Identity: "agent-0",
			LeaseDuration: 4 * time.Second, RenewInterval: time.Second,
			ApplyWorks: true, Namespace: join.AgentNamespace, MetricsAddress: "0", HealthAddress: "0",
			Webhook: agent.WebhookOptions{Host: "127.0.0.1", Port: port, CertDir: certDir,
				ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d", port)), CABundle: caPEM}},
			// The injected container is only written into Pod objects.
			Proxy: inject.Options{Image: "ctrlmesh-proxy:local"},
			Log:   log,
		})
	}}}
}

// fileLogger logs to <workDir>/logs/<name>.log, appending across restarts.
func fileLogger(t *testing.T, workDir, name string) logr.Logger {
	t.Helper()
	file, err := os.OpenFile(filepath.Join(workDir, "logs", name+".log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = file.Close() })
	return zap.New(zap.WriteTo(file))
}

func mustCreate(t *testing.T, ctx context.Context, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitFor polls check every 200 ms until it succeeds, failing the test
// after within.
func waitFor(t *testing.T, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
