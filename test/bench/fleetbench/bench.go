package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"

	"github.com/ctrlmesh/ctrlmesh/test/promscrape"
)

// The operator's pods run in opNamespace, sharded by the ShardingConfig
// opName, whose leader-election lock is the demo operator's default.
const (
	opNamespace = "operators"
	opName      = "demo-operator"
	appLabel    = "app"
	// buckets is the ShardingConfig's bucket count (the default).
	buckets = 32
	// readyWithin bounds every untimed wait for the fleet to settle.
	readyWithin = 3 * time.Minute
)

var space = sharding.MustSpace(buckets)

// bench is one run.
type bench struct {
	opts     options
	progress io.Writer
	start    time.Time
	binDir   string
	crdDirs  []string
	workDir  string
	scheme   *runtime.Scheme
}

// step prints a progress line with the seconds since the start.
func (b *bench) step(format string, args ...any) {
	_, _ = fmt.Fprintf(b.progress, "==> [%6.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

// results of the phases that ran; nil for those that did not.
type results struct {
	memory *memoryResult
	// edits are the edit phase on each fleet: standalone, then, with
	// -karmada, Karmada.
	edits    []*editResult
	failover *failoverResult
	// apiserver is the members' kube-apiserver version.
	apiserver string
}

func run(ctx context.Context, opts options, out, progress io.Writer) (err error) {
	b := &bench{opts: opts, progress: progress, start: time.Now()}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return fmt.Errorf("%w: run fleetbench from the ctrlmesh checkout (make bench-fleet)", err)
	}
	b.binDir = opts.binDir
	if b.binDir == "" {
		b.binDir = filepath.Join(root, "bin")
	}
	if b.binDir, err = filepath.Abs(b.binDir); err != nil {
		return err
	}
	b.crdDirs = controlplane.CRDDirs(root)
	if b.scheme, err = ctrlmeshscheme.New(); err != nil {
		return err
	}
	// The hub and the agents log to files in the work directory; what
	// controller-runtime and client-go log globally is dropped.
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())

	if b.workDir, err = os.MkdirTemp("", "ctrlmesh-fleetbench-"); err != nil {
		return fmt.Errorf("creating the work directory: %w", err)
	}
	defer func() {
		if err != nil || opts.keep {
			b.step("work directory (kubeconfigs, logs, reconcile records) kept in %s", b.workDir)
			return
		}
		err = errors.Join(err, os.RemoveAll(b.workDir))
	}()
	ctx, cancel := context.WithTimeout(ctx, opts.timeout)
	defer cancel()

	res := &results{}
	if opts.runs("memory") {
		if res.memory, err = b.memory(ctx, res); err != nil {
			return fmt.Errorf("memory phase: %w", err)
		}
	}
	if opts.runs("edit") || opts.runs("failover") {
		if res.edits, res.failover, err = b.latency(ctx, res); err != nil {
			return fmt.Errorf("edit/failover phase: %w", err)
		}
	}
	b.step("all phases done")
	report(out, opts, res)
	return nil
}

// startFleet starts a fleet of members in range mode under dir, runs the
// hub, joins every member, and creates opNamespace on the hub and the
// members. With karmada (each member's sync mode) the hub cluster is a
// Karmada control plane and the members join it in those modes
// (localfleet.Options.Karmada); nil runs the fleet standalone. The caller
// stops it.
func (b *bench) startFleet(ctx context.Context, dir string, members []string, karmada map[string]clusterv1alpha1.ClusterSyncMode) (*localfleet.Fleet, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	hubKind, joining := "", "agents in standalone mode"
	if karmada != nil {
		hubKind = " (a Karmada control plane: karmada-aggregated-apiserver, karmada-controller-manager)"
		joining = fmt.Sprintf("each to Karmada in its sync mode %v, then its agent in Karmada mode", karmada)
	}
	b.step("starting %d API servers (kube-apiserver + etcd each): %s%s and %v, range mode (ShardedListAndWatch)", 1+len(members), localfleet.HubName, hubKind, members)
	f, err := localfleet.Start(ctx, localfleet.Options{
		BinDir: b.binDir, CRDDirs: b.crdDirs, WorkDir: dir, Members: members,
		MemberFeatureGates: []string{controlplane.FeatureShardedListAndWatch},
		Karmada:            karmada,
	})
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = f.Stop()
		}
	}()
	b.step("hub, and joining %v (%s)", members, joining)
	if err := f.StartHub(ctx); err != nil {
		return nil, err
	}
	for _, m := range members {
		if err := f.Join(ctx, m); err != nil {
			return nil, err
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNamespace}}
	if err := f.Hub.Client.Create(ctx, ns.DeepCopy()); err != nil {
		return nil, fmt.Errorf("creating namespace %s on the hub: %w", opNamespace, err)
	}
	for _, m := range members {
		// With Karmada, its namespace controller may have made it already:
		// it propagates the Karmada API server's namespaces to every member.
		if err := f.Members[m].Client.Create(ctx, ns.DeepCopy()); err != nil && !(karmada != nil && apierrors.IsAlreadyExists(err)) {
			return nil, fmt.Errorf("creating namespace %s in %s: %w", opNamespace, m, err)
		}
	}
	ok = true
	return f, nil
}

// stopFleet stops f, reporting how long it took.
func (b *bench) stopFleet(f *localfleet.Fleet) error {
	b.step("stopping the fleet")
	return f.Stop()
}

// startPod starts an operator pod labeled for the ShardingConfig, its
// client limited to b.opts.operatorQPS requests/s (burst twice that).
func (b *bench) startPod(ctx context.Context, f *localfleet.Fleet, member, name string, operatorArgs ...string) (*localfleet.Pod, error) {
	args := append([]string{fmt.Sprintf("--kube-api-qps=%d", b.opts.operatorQPS), fmt.Sprintf("--kube-api-burst=%d", b.opts.operatorBurst())}, operatorArgs...)
	return f.StartPod(ctx, localfleet.PodSpec{Cluster: member, Namespace: opNamespace, Name: name,
		Labels: map[string]string{appLabel: opName}, RulesName: opName, OperatorArgs: args})
}

// waitReady polls the ShardingConfig until it is Ready for its generation
// with every shard ready, every placed shard Serving, and matches holds.
// It returns the ShardingConfig then.
func waitReady(ctx context.Context, f *localfleet.Fleet, what string, matches func(*ctrlmeshv1alpha1.ShardingConfig) bool) (*ctrlmeshv1alpha1.ShardingConfig, error) {
	deadline := time.Now().Add(readyWithin)
	key := client.ObjectKey{Namespace: opNamespace, Name: opName}
	for {
		var sc ctrlmeshv1alpha1.ShardingConfig
		if err := f.Hub.Client.Get(ctx, key, &sc); err != nil {
			return nil, fmt.Errorf("reading the ShardingConfig: %w", err)
		}
		st := &sc.Status
		if st.ObservedGeneration == sc.Generation && meta.IsStatusConditionTrue(st.Conditions, ctrlmeshv1alpha1.ConditionReady) &&
			st.ReadyShards == st.Shards && !slices.ContainsFunc(st.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
			return p.State != ctrlmeshv1alpha1.ShardServing
		}) && matches(&sc) {
			return &sc, nil
		}
		if err := f.Err(); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("ShardingConfig not %s within %v; status: %s", what, readyWithin, placementText(&sc))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the ShardingConfig to be %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// placementText prints the placement, one shard after the other.
func placementText(sc *ctrlmeshv1alpha1.ShardingConfig) string {
	var s string
	for i, p := range sc.Status.Placement {
		if i > 0 {
			s += "; "
		}
		s += fmt.Sprintf("%s/%s %v buckets=%q %s/%s", p.Cluster, p.Shard, p.Pods, p.Buckets, p.State, p.Health)
	}
	if s == "" {
		s = "no placement"
	}
	return fmt.Sprintf("generation %d observed %d, shards %d ready %d: %s", sc.Generation, sc.Status.ObservedGeneration, sc.Status.Shards, sc.Status.ReadyShards, s)
}

// podBuckets is the union of the buckets of the placed shards pod serves in
// cluster.
func podBuckets(sc *ctrlmeshv1alpha1.ShardingConfig, cluster, pod string) (sharding.Set, error) {
	set := space.AllBuckets()
	var parts []sharding.Set
	for _, p := range sc.Status.Placement {
		if p.Cluster != cluster || !slices.Contains(p.Pods, pod) {
			continue
		}
		s, err := space.ParseSet(p.Buckets)
		if err != nil {
			return set, fmt.Errorf("placement of shard %s: %w", p.Shard, err)
		}
		parts = append(parts, s)
	}
	return union(parts...), nil
}

// union of bucket sets; the empty set for none.
func union(sets ...sharding.Set) sharding.Set {
	var have []int
	for b := range buckets {
		for _, s := range sets {
			if s.Has(b) {
				have = append(have, b)
				break
			}
		}
	}
	out, _ := space.NewSet(have...)
	return out
}

// procMemory is a process's resident memory, from /proc/<pid>/status, in
// bytes.
type procMemory struct {
	// rss is VmRSS, the figure the goal is stated in; hwm is VmHWM, its
	// peak.
	rss, hwm int64
	// anon is RssAnon: memory private to the process (Go heap, stacks).
	// file is RssFile: pages mapped from files, mostly the process's own
	// executable (one copy in memory for all the processes of one binary
	// on one machine, but counted in the RSS of each).
	// rss = anon + file + RssShmem.
	anon, file int64
}

// goMemory is how a Go process's runtime accounts for its memory, from its
// Prometheus Go collector (runtime/metrics, which controller-runtime's
// metrics registry serves in full).
type goMemory struct {
	// live is the heap the last collection marked live: for an operator,
	// mostly its informers' caches. goal is the heap size at which the
	// next collection starts (twice live with GOGC=100).
	live, goal int64
	// heap is the heap's memory not returned to the OS: objects (live or
	// not yet collected), unused span space, and free pages kept.
	heap int64
}

// readGoMemory reads an operator's Go memory from its /metrics at address.
func readGoMemory(ctx context.Context, address string) (goMemory, error) {
	families, err := promscrape.Scrape(ctx, http.DefaultClient.Do, "http://"+address+"/metrics")
	if err != nil {
		return goMemory{}, fmt.Errorf("reading the Go runtime's memory: %w", err)
	}
	v := map[string]float64{}
	var errs []error
	for _, name := range []string{"go_gc_heap_live_bytes", "go_gc_heap_goal_bytes",
		"go_memory_classes_heap_objects_bytes", "go_memory_classes_heap_unused_bytes", "go_memory_classes_heap_free_bytes"} {
		var err error
		v[name], err = promscrape.Gauge(families, name)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return goMemory{}, fmt.Errorf("reading the Go runtime's memory from %s: %w", address, err)
	}
	return goMemory{
		live: int64(v["go_gc_heap_live_bytes"]),
		goal: int64(v["go_gc_heap_goal_bytes"]),
		heap: int64(v["go_memory_classes_heap_objects_bytes"] + v["go_memory_classes_heap_unused_bytes"] + v["go_memory_classes_heap_free_bytes"]),
	}, nil
}

// readProcMemory reads the memory of process pid.
func readProcMemory(pid int) (procMemory, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	data, err := os.ReadFile(path)
	if err != nil {
		return procMemory{}, fmt.Errorf("reading the memory of process %d: %w (fleetbench reads /proc: Linux only)", pid, err)
	}
	return parseProcStatus(path, data)
}

// parseProcStatus reads the VmRSS, VmHWM, RssAnon and RssFile lines of a
// /proc/<pid>/status file.
func parseProcStatus(path string, data []byte) (procMemory, error) {
	var m procMemory
	fields := map[string]*int64{"VmRSS": &m.rss, "VmHWM": &m.hwm, "RssAnon": &m.anon, "RssFile": &m.file}
	for _, line := range strings.Split(string(data), "\n") {
		name, value, ok := strings.Cut(line, ":")
		field := fields[name]
		if !ok || field == nil {
			continue
		}
		var kb int64
		if _, err := fmt.Sscanf(strings.TrimSpace(value), "%d kB", &kb); err != nil {
			return procMemory{}, fmt.Errorf("%s: line %q: %w", path, line, err)
		}
		*field = kb * 1024
		delete(fields, name)
	}
	if len(fields) > 0 {
		missing := slices.Sorted(maps.Keys(fields))
		return procMemory{}, fmt.Errorf("%s: no %s line", path, strings.Join(missing, ", "))
	}
	return m, nil
}
