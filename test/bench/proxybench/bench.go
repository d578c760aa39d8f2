package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/policies"
)

const (
	// The seeded data: namespaces × perNamespace ConfigMaps, each labeled
	// benchLabel=benchValue and with its sharding-hash label.
	namespaces   = 10
	perNamespace = 1000
	totalObjects = namespaces * perNamespace
	payloadBytes = 256
	benchLabel   = "app.kubernetes.io/part-of"
	benchValue   = "proxybench"
	buckets      = 32
	seedWorkers  = 16

	podName    = "pod-a"
	lockName   = "proxybench-leader"
	getWarmup  = 200
	listWarmup = 2

	proxyStartTimeout = 30 * time.Second
	watchTimeout      = 3 * time.Minute
)

// bench holds what every measurement uses.
type bench struct {
	o        options
	log      io.Writer
	start    time.Time
	selector string
	// direct talks to kube-apiserver; hopped to the bare hop and proxied
	// to the proxy, which both forward to the same kube-apiserver. The
	// narrowed clients narrow every request as the proxy narrows a list
	// (narrowing): they only list.
	direct, hopped, proxied     kubernetes.Interface
	directNarrowed, hopNarrowed kubernetes.Interface
	hopURL                      string
	hop, proxy                  *proxyProcess
}

// way is a path the measured requests take to kube-apiserver.
type way int

const (
	wayDirect way = iota
	// wayHop is through the bare hop (barehop): ctrlmesh-proxy's
	// forwarding alone, the floor of any sidecar's cost.
	wayHop
	wayProxy
	// wayDirectNarrowed and wayHopNarrowed list narrowed as the proxy
	// narrows (rules.Snapshot.Narrow: in range mode the same shardSelector,
	// in label mode the same label requirement), directly and through the
	// bare hop. Lists only: their p50 over direct's is kube-apiserver's
	// share of a sharded list, and the proxy's over the narrowed hop's is
	// the proxy's own.
	wayDirectNarrowed
	wayHopNarrowed
	numWays
)

var (
	// ways are the ways of GETs and of the concurrent clients.
	ways = []way{wayDirect, wayHop, wayProxy}
	// listWays are the ways of LISTs.
	listWays = []way{wayDirect, wayDirectNarrowed, wayHop, wayHopNarrowed, wayProxy}
)

func (w way) String() string {
	return [numWays]string{"direct", "through the bare hop", "through the proxy", "direct, narrowed as the proxy narrows", "through the bare hop, narrowed as the proxy narrows"}[w]
}

func (b *bench) client(w way) kubernetes.Interface {
	return [numWays]kubernetes.Interface{b.direct, b.hopped, b.proxied, b.directNarrowed, b.hopNarrowed}[w]
}

// process is the process w's requests go through; nil for the direct ways.
func (b *bench) process(w way) *proxyProcess {
	return [numWays]*proxyProcess{nil, b.hop, b.proxy, nil, b.hop}[w]
}

// order is the order of set's ways in round i of an interleaved
// measurement: rotated each round, so every way goes first, second and
// last equally often and drift and ordering effects fall on all alike.
func order(i int, set []way) []way {
	o := make([]way, len(set))
	for j := range o {
		o[j] = set[(i+j)%len(set)]
	}
	return o
}

func (b *bench) progress(format string, args ...any) {
	_, _ = fmt.Fprintf(b.log, "[%6.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

// results are every figure the report prints.
type results struct {
	apiserverVersion string
	modeCheck        string
	seedTime         time.Duration

	// Latencies of each measurement, by way: GETs the ways, LISTs the
	// listWays.
	get, list1k, list10k      [numWays][]time.Duration
	list1kItems, list10kItems int

	// cpu* are the bare hop's and the proxy's CPU time over each
	// measurement's requests through them (warm-up included; the hop's
	// over both its ways' LISTs), at wayHop and wayProxy.
	cpuGet, cpuList1k, cpuList10k, cpuConcurrent [numWays]cpuCost
	conc                                         [numWays][]concurrentRun
	// proxyRSSIdle is the proxy's VmRSS once serving, before the
	// measurements; proxyRSSLoaded after them.
	proxyRSSIdle, proxyRSSLoaded int64

	watchWrite                     time.Duration // the writers' time for all events
	watchLiveDirect, watchLiveProx time.Duration
	replayDirect, replayProxied    []time.Duration
}

func run(ctx context.Context, o options, stdout, stderr io.Writer) (err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	b := &bench{o: o, log: stderr, start: time.Now(), selector: benchLabel + "=" + benchValue}
	// envtest logs through controller-runtime; keep its warning about an
	// unset logger off the output.
	ctrllog.SetLogger(logr.Discard())

	spec := env.ClusterSpec{Name: "bench"}
	if o.mode == string(rules.ModeRange) {
		spec.FeatureGates = []string{env.FeatureShardedListAndWatch}
	}
	b.progress("starting etcd and kube-apiserver (feature gates: %v)", spec.FeatureGates)
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{spec}})
	if err != nil {
		return err
	}
	defer func() {
		b.progress("stopping the control plane")
		err = errors.Join(err, fleet.Stop())
	}()
	upstream := fleet.Cluster("bench").Config

	if b.direct, err = kubernetes.NewForConfig(tune(rest.CopyConfig(upstream), o.content)); err != nil {
		return err
	}
	var res results
	version, err := b.direct.Discovery().ServerVersion()
	if err != nil {
		return fmt.Errorf("asking the API server's version: %w", err)
	}
	res.apiserverVersion = version.GitVersion

	seedStart := time.Now()
	if err := b.seed(ctx, namespaces); err != nil {
		return fmt.Errorf("seeding: %w", err)
	}
	res.seedTime = time.Since(seedStart)

	stopProxy, err := b.startProxy(ctx, fleet.Cluster("bench").KubeconfigPath)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopProxy()) }()
	stopHop, err := b.startHop(ctx, fleet.Cluster("bench").KubeconfigPath)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopHop()) }()
	if err := b.startNarrowed(upstream); err != nil {
		return err
	}
	if res.modeCheck, err = b.checkMode(ctx); err != nil {
		return err
	}

	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			err = errors.Join(err, f.Close())
		}()
	}
	if res.proxyRSSIdle, err = b.proxy.rss(); err != nil {
		return err
	}
	if err := b.measure(ctx, &res); err != nil {
		return err
	}
	if res.proxyRSSLoaded, err = b.proxy.rss(); err != nil {
		return err
	}
	report(stdout, o, &res)
	return nil
}

// tune makes a benchmark client: no client-side rate limit, and the chosen
// wire format.
func tune(cfg *rest.Config, content string) *rest.Config {
	cfg.QPS = -1 // no client-side rate limiter
	cfg.Burst = 0
	cfg.UserAgent = "proxybench"
	if content == "protobuf" {
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	} else {
		cfg.ContentType = "application/json"
		cfg.AcceptContentTypes = "application/json"
	}
	return cfg
}

func objectKey(i int) (namespace, name string) {
	return fmt.Sprintf("proxybench-%02d", i/perNamespace), fmt.Sprintf("cm-%04d", i%perNamespace)
}

// seed creates the first namespaces of the benchmark's data and their
// ConfigMaps, concurrently: the whole data in the benchmark, one namespace
// in its test.
func (b *bench) seed(ctx context.Context, namespaces int) error {
	space := sharding.MustSpace(buckets)
	objects := namespaces * perNamespace
	for n := range namespaces {
		ns, _ := objectKey(n * perNamespace)
		if _, err := b.direct.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	b.progress("creating %d ConfigMaps in %d namespaces (%d workers)", objects, namespaces, seedWorkers)
	payload := strings.Repeat("x", payloadBytes)
	jobs := make(chan int)
	var created atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(jobs)
		for i := range objects {
			select {
			case jobs <- i:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range seedWorkers {
		g.Go(func() error {
			for i := range jobs {
				cm := seedObject(space, i, payload)
				if _, err := b.direct.CoreV1().ConfigMaps(cm.Namespace).Create(gctx, cm, metav1.CreateOptions{}); err != nil {
					return fmt.Errorf("creating %s/%s: %w", cm.Namespace, cm.Name, err)
				}
				if n := created.Add(1); n%2500 == 0 {
					b.progress("  %d/%d created", n, objects)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// seedObject is the i-th seeded ConfigMap, labeled as the benchmark selects
// and with its sharding-hash label.
func seedObject(space sharding.Space, i int, payload string) *corev1.ConfigMap {
	ns, name := objectKey(i)
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			benchLabel:                         benchValue,
			ctrlmeshv1alpha1.ShardingHashLabel: sharding.LabelValue(space.Bucket(ns)),
		}},
		Data: map[string]string{"config": payload},
	}
}

// shardRoute gives the benchmark's pod every bucket: the proxy then narrows
// every list and watch (a whole-space shardSelector, or a label selector on
// all 32 bucket values) without hiding anything, so both ways return the
// same objects.
// It carries n traffic policies (policies.Sample) that match none of the
// benchmark's requests: their check is in every proxied figure.
func shardRoute(n int) *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: ctrlmeshv1alpha1.ShardRouteGVK.GroupVersion().String(), Kind: ctrlmeshv1alpha1.ShardRouteGVK.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: "operators", Name: "proxybench"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: "bench", RoutingGeneration: 1, RulesHash: "bench0001", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: buckets,
			Selector:   metav1.LabelSelector{MatchLabels: map[string]string{"app": "proxybench-operator"}},
			Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: lockName},
			// No limit selector: it would add a label requirement to proxied
			// requests only, and the direct ones would differ.
			Limits: ctrlmeshv1alpha1.Limits{{
				RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}},
			}},
			Shards: []ctrlmeshv1alpha1.RouteShard{
				{ID: "0", Buckets: fmt.Sprintf("0-%d", buckets-1), Pods: []ctrlmeshv1alpha1.RoutePod{{Name: podName}}},
			},
			Policies: policies.Sample(n),
		},
	}
}

// startProxy builds ctrlmesh-proxy and runs it in its own process, as a
// sidecar runs, and waits until it enforces the rules. The returned
// function stops it.
func (b *bench) startProxy(ctx context.Context, upstreamKubeconfig string) (func() error, error) {
	dir, err := os.MkdirTemp("", "proxybench-")
	if err != nil {
		return nil, err
	}
	rulesFile := filepath.Join(dir, "rules.yaml")
	data, err := yaml.Marshal(shardRoute(b.o.policies))
	if err == nil {
		err = os.WriteFile(rulesFile, data, 0o600)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("writing the rules file: %w", err)
	}
	b.progress("building ctrlmesh-proxy as its image does (CGO_ENABLED=0, -trimpath, -s -w)")
	binary, err := build(ctx, dir, proxyPackage)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	api, err := freeAddress()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	args := []string{"--upstream-kubeconfig=" + upstreamKubeconfig, "--pod-name=" + podName, "--rules-file=" + rulesFile,
		"--listen-address=" + api, "--health-address="}
	// Range mode: let the proxy detect the gate, as in production. Label
	// mode: the API server has no gate; say so rather than probe.
	if b.o.mode == string(rules.ModeLabel) {
		args = append(args, "--selector-mode=label")
	}
	if b.o.proxyCPUProfile != "" {
		profile, err := filepath.Abs(b.o.proxyCPUProfile)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		args = append(args, "--cpu-profile="+profile)
	}
	b.progress("starting the proxy (mode %s)", b.o.mode)
	// The proxy logs nothing per request at Info level: its few lines
	// (serving, rules in force, mode detected) are progress.
	if b.proxy, err = startProcess(binary, args, func(line string) { b.progress("proxy: %s", line) }); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	stop := func() error {
		defer func() { _ = os.RemoveAll(dir) }()
		return b.proxy.stop()
	}
	fail := func(err error) (func() error, error) {
		return nil, errors.Join(err, stop())
	}
	if b.proxied, err = kubernetes.NewForConfig(tune(&rest.Config{Host: "http://" + api}, b.o.content)); err != nil {
		return fail(err)
	}
	// The proxy answers 503 for sharded requests until the rules are in force.
	if err := b.awaitServing(ctx, b.proxied); err != nil {
		return fail(fmt.Errorf("proxy: rules not in force: %w", err))
	}
	b.progress("proxy serving on %s with rules in force (pid %d)", api, b.proxy.cmd.Process.Pid)
	return stop, nil
}

// startHop builds the bare hop as ctrlmesh-proxy is built and runs it in
// its own process, serving plain HTTP on loopback as the proxy serves the
// benchmark's clients, and waits until it forwards. The returned function
// stops it.
func (b *bench) startHop(ctx context.Context, upstreamKubeconfig string) (func() error, error) {
	dir, err := os.MkdirTemp("", "proxybench-hop-")
	if err != nil {
		return nil, err
	}
	b.progress("building the bare hop (%s) as ctrlmesh-proxy is built", hopPackage)
	binary, err := build(ctx, dir, hopPackage)
	var api string
	if err == nil {
		api, err = freeAddress()
	}
	if err == nil {
		b.hop, err = startProcess(binary, []string{"--upstream-kubeconfig=" + upstreamKubeconfig, "--listen-address=" + api},
			func(line string) { b.progress("bare hop: %s", line) })
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("bare hop: %w", err)
	}
	stop := func() error {
		defer func() { _ = os.RemoveAll(dir) }()
		return b.hop.stop()
	}
	b.hopURL = "http://" + api
	if b.hopped, err = kubernetes.NewForConfig(tune(&rest.Config{Host: b.hopURL}, b.o.content)); err == nil {
		err = b.awaitServing(ctx, b.hopped)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("bare hop: %w", err), stop())
	}
	b.progress("bare hop serving on %s (pid %d)", api, b.hop.cmd.Process.Pid)
	return stop, nil
}

// awaitServing waits until a list of the benchmark's ConfigMaps through cs
// succeeds.
func (b *bench) awaitServing(ctx context.Context, cs kubernetes.Interface) error {
	deadline := time.Now().Add(proxyStartTimeout)
	for {
		_, err := cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: b.selector, Limit: 1})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not serving after %s: %w", proxyStartTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkMode confirms that the proxy narrows lists the way -mode says: in
// range mode the API server applied a shardSelector and says so in
// metadata.shardInfo; in label mode there is none. The narrowed ways must
// get the same answer as the proxy: the same shardSelector, or none.
func (b *bench) checkMode(ctx context.Context) (string, error) {
	proxied, err := b.shardInfo(ctx, b.proxied)
	if err != nil {
		return "", fmt.Errorf("checking the proxy's mode: %w", err)
	}
	for _, w := range []way{wayDirectNarrowed, wayHopNarrowed} {
		got, err := b.shardInfo(ctx, b.client(w))
		if err != nil {
			return "", fmt.Errorf("checking the narrowing %s: %w", w, err)
		}
		if got != proxied {
			return "", fmt.Errorf("a list %s got metadata.shardInfo %q, through the proxy %q: the benchmark does not narrow as the proxy does", w, got, proxied)
		}
	}
	switch {
	case b.o.mode == string(rules.ModeRange) && proxied == "":
		return "", errors.New("range mode: a list through the proxy has no metadata.shardInfo, so the API server applied no shardSelector")
	case b.o.mode == string(rules.ModeRange):
		return "proxy detected range mode; the API server applied shardSelector " + proxied + " (the narrowed ways' lists too)", nil
	case proxied != "":
		return "", fmt.Errorf("label mode: a list through the proxy has metadata.shardInfo %q", proxied)
	default:
		return "label selector " + ctrlmeshv1alpha1.ShardingHashLabel + " in (0..31) added by the proxy (and by the narrowed ways)", nil
	}
}

// shardInfo lists one of the benchmark's ConfigMaps through cs, in JSON,
// and returns the shardSelector the API server says it applied
// (metadata.shardInfo.selector), or "" for none.
func (b *bench) shardInfo(ctx context.Context, cs kubernetes.Interface) (string, error) {
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/configmaps").
		Param("limit", "1").Param("labelSelector", b.selector).
		SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("listing: %w: %s", err, body)
	}
	var list struct {
		Metadata struct {
			ShardInfo *struct {
				Selector string `json:"selector"`
			} `json:"shardInfo"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return "", err
	}
	if list.Metadata.ShardInfo == nil {
		return "", nil
	}
	return list.Metadata.ShardInfo.Selector, nil
}

// narrowing narrows every request it sends as the proxy narrows a list of
// the benchmark's ConfigMaps: with the proxy's rules compiled for its pod
// by the proxy's own code (rules.Compile, rules.Snapshot.Narrow).
type narrowing struct {
	next  http.RoundTripper
	snap  *rules.Snapshot
	limit *rules.Limit
}

func (n *narrowing) RoundTrip(r *http.Request) (*http.Response, error) {
	query := r.URL.Query()
	if _, err := n.snap.Narrow(query, n.limit); err != nil {
		return nil, fmt.Errorf("narrowing %s as the proxy does: %w", r.URL.Path, err)
	}
	r = r.Clone(r.Context())
	r.URL.RawQuery = query.Encode()
	return n.next.RoundTrip(r)
}

// startNarrowed makes the narrowed ways' clients, direct to upstream and
// through the bare hop (started before): the proxy's rules compiled in
// -mode against kube-apiserver's discovery, as the proxy compiles them.
func (b *bench) startNarrowed(upstream *rest.Config) error {
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(b.direct.Discovery()))
	snap, err := rules.Compile(shardRoute(b.o.policies), podName, rules.Mode(b.o.mode), rules.NewMapperScopes(mapper))
	if err != nil {
		return fmt.Errorf("compiling the proxy's rules: %w", err)
	}
	limit, ok := snap.LimitFor(corev1.SchemeGroupVersion.WithResource("configmaps").GroupResource())
	if !ok {
		return errors.New("the proxy's rules do not shard ConfigMaps")
	}
	narrowed := func(cfg *rest.Config) (kubernetes.Interface, error) {
		cfg = tune(cfg, b.o.content)
		cfg.Wrap(func(next http.RoundTripper) http.RoundTripper {
			return &narrowing{next: next, snap: snap, limit: limit}
		})
		return kubernetes.NewForConfig(cfg)
	}
	if b.directNarrowed, err = narrowed(rest.CopyConfig(upstream)); err != nil {
		return err
	}
	b.hopNarrowed, err = narrowed(&rest.Config{Host: b.hopURL})
	return err
}

// timed is one request of a measurement; it returns the request's latency
// and how many objects it returned.
type timed func(ctx context.Context, cs kubernetes.Interface) (time.Duration, int, error)

// interleave runs warmup then n rounds of the request, once each of set's
// ways per round, rotating which way goes first (order). Every response
// must have want objects.
func (b *bench) interleave(ctx context.Context, what string, set []way, warmup, n, want int, call timed) ([numWays][]time.Duration, error) {
	var latencies [numWays][]time.Duration
	one := func(w way) (time.Duration, error) {
		d, got, err := call(ctx, b.client(w))
		if err != nil {
			return 0, fmt.Errorf("%s %s: %w", what, w, err)
		}
		if got != want {
			return 0, fmt.Errorf("%s %s: %d objects, want %d", what, w, got, want)
		}
		return d, nil
	}
	for range warmup {
		for _, w := range set {
			if _, err := one(w); err != nil {
				return latencies, err
			}
		}
	}
	for _, w := range set {
		latencies[w] = make([]time.Duration, 0, n)
	}
	for i := range n {
		for _, w := range order(i, set) {
			d, err := one(w)
			if err != nil {
				return latencies, err
			}
			latencies[w] = append(latencies[w], d)
		}
	}
	return latencies, nil
}

func (b *bench) measure(ctx context.Context, res *results) error {
	ns, name := objectKey(0)
	b.progress("GET %s/%s: %d warm-up + %d interleaved requests each way", ns, name, getWarmup, b.o.gets)
	var err error
	res.cpuGet, err = b.measureCPU(getWarmup+b.o.gets, ways, func() (err error) {
		res.get, err = b.interleave(ctx, "GET", ways, getWarmup, b.o.gets, 1, func(ctx context.Context, cs kubernetes.Interface) (time.Duration, int, error) {
			start := time.Now()
			_, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
			return time.Since(start), 1, err
		})
		return err
	})
	if err != nil {
		return err
	}

	list := func(namespace string) timed {
		return func(ctx context.Context, cs kubernetes.Interface) (time.Duration, int, error) {
			start := time.Now()
			l, err := cs.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{LabelSelector: b.selector})
			d := time.Since(start)
			if err != nil {
				return 0, 0, err
			}
			return d, len(l.Items), nil
		}
	}
	res.list1kItems, res.list10kItems = perNamespace, totalObjects
	b.progress("LIST %d ConfigMaps (namespace %s): %d warm-up + %d interleaved lists each of %d ways", perNamespace, ns, listWarmup, b.o.lists, len(listWays))
	if res.cpuList1k, err = b.measureCPU(listWarmup+b.o.lists, listWays, func() (err error) {
		res.list1k, err = b.interleave(ctx, "LIST 1k", listWays, listWarmup, b.o.lists, perNamespace, list(ns))
		return err
	}); err != nil {
		return err
	}
	b.progress("LIST %d ConfigMaps (all namespaces): %d warm-up + %d interleaved lists each of %d ways", totalObjects, listWarmup, b.o.lists, len(listWays))
	if res.cpuList10k, err = b.measureCPU(listWarmup+b.o.lists, listWays, func() (err error) {
		res.list10k, err = b.interleave(ctx, "LIST 10k", listWays, listWarmup, b.o.lists, totalObjects, list(""))
		return err
	}); err != nil {
		return err
	}
	b.progress("concurrent: %d clients (%d GETs, then a LIST of %d, over and over) for %s each way, %d rounds rotating the order", b.o.clients, listEvery-1, perNamespace, b.o.concurrentFor, b.o.rounds)
	if err := b.measureConcurrent(ctx, res); err != nil {
		return err
	}
	return b.measureWatch(ctx, res)
}

// countEvents reads w until it has seen want MODIFIED events and returns the
// time the last arrived. Any other event fails: nothing else touches the
// watched objects.
func countEvents(w watch.Interface, want int) (time.Time, error) {
	got := 0
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Modified:
			got++
			if got == want {
				return time.Now(), nil
			}
		case watch.Error:
			return time.Time{}, fmt.Errorf("watch error after %d of %d events: %w", got, want, apierrors.FromObject(ev.Object))
		default:
			return time.Time{}, fmt.Errorf("unexpected %s event after %d of %d events", ev.Type, got, want)
		}
	}
	return time.Time{}, fmt.Errorf("watch ended after %d of %d events", got, want)
}

type arrival struct {
	at  time.Time
	err error
}

// watchFrom opens a watch on the benchmark's ConfigMaps from rv and counts
// want events in the background.
func (b *bench) watchFrom(ctx context.Context, cs kubernetes.Interface, rv string, want int) (watch.Interface, <-chan arrival, error) {
	w, err := cs.CoreV1().ConfigMaps("").Watch(ctx, metav1.ListOptions{LabelSelector: b.selector, ResourceVersion: rv})
	if err != nil {
		return nil, nil, err
	}
	done := make(chan arrival, 1)
	go func() {
		at, err := countEvents(w, want)
		done <- arrival{at, err}
	}()
	return w, done, nil
}

func await(ctx context.Context, done <-chan arrival, way string) (time.Time, error) {
	select {
	case a := <-done:
		if a.err != nil {
			return time.Time{}, fmt.Errorf("watch %s: %w", way, a.err)
		}
		return a.at, nil
	case <-time.After(watchTimeout):
		return time.Time{}, fmt.Errorf("watch %s: not all events after %s", way, watchTimeout)
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// measureWatch has two parts. Live: a watch directly and one through the
// proxy, both open at once from the same resourceVersion, while concurrent
// writers update E ConfigMaps; each watcher's time is from the first write
// to its E-th event. Replay: then, one at a time, each way watches again
// from that resourceVersion and receives the same E events from the API
// server's watch cache as fast as it can deliver them; that isolates the
// delivery path from the writers' pace.
func (b *bench) measureWatch(ctx context.Context, res *results) error {
	events := b.o.events
	// As an informer does: list, then watch from the list's resourceVersion.
	// The proxy resumes a watch only for a selection it served a list of.
	l, err := b.direct.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: b.selector, Limit: 1})
	if err != nil {
		return fmt.Errorf("watch: listing: %w", err)
	}
	rv := l.ResourceVersion
	if _, err := b.proxied.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: b.selector, Limit: 1}); err != nil {
		return fmt.Errorf("watch: listing through the proxy: %w", err)
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wd, directDone, err := b.watchFrom(wctx, b.direct, rv, events)
	if err != nil {
		return fmt.Errorf("watch direct: %w", err)
	}
	defer wd.Stop()
	wp, proxiedDone, err := b.watchFrom(wctx, b.proxied, rv, events)
	if err != nil {
		return fmt.Errorf("watch through the proxy: %w", err)
	}
	defer wp.Stop()

	b.progress("WATCH live: %d updates by %d concurrent writers, watched directly and through the proxy at once", events, b.o.writers)
	jobs := make(chan int)
	g, gctx := errgroup.WithContext(ctx)
	start := time.Now()
	g.Go(func() error {
		defer close(jobs)
		for i := range events {
			select {
			case jobs <- i:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range b.o.writers {
		g.Go(func() error {
			for i := range jobs {
				ns, name := objectKey(i)
				patch := fmt.Appendf(nil, `{"data":{"seq":"%d"}}`, i)
				if _, err := b.direct.CoreV1().ConfigMaps(ns).Patch(gctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
					return fmt.Errorf("updating %s/%s: %w", ns, name, err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	res.watchWrite = time.Since(start)
	directAt, err := await(ctx, directDone, "direct")
	if err != nil {
		return err
	}
	proxiedAt, err := await(ctx, proxiedDone, "through the proxy")
	if err != nil {
		return err
	}
	res.watchLiveDirect, res.watchLiveProx = directAt.Sub(start), proxiedAt.Sub(start)
	wd.Stop()
	wp.Stop()

	b.progress("WATCH replay: %d rounds, each way in turn re-reads the %d events from resourceVersion %s", b.o.replays, events, rv)
	for round := range b.o.replays {
		ways := []kubernetes.Interface{b.direct, b.proxied}
		if round%2 == 1 {
			ways[0], ways[1] = ways[1], ways[0]
		}
		for _, cs := range ways {
			way := "direct"
			if cs == b.proxied {
				way = "through the proxy"
			}
			start := time.Now()
			w, done, err := b.watchFrom(wctx, cs, rv, events)
			if err != nil {
				return fmt.Errorf("watch replay %s: %w", way, err)
			}
			at, err := await(ctx, done, way)
			w.Stop()
			if err != nil {
				return fmt.Errorf("watch replay: %w", err)
			}
			if cs == b.proxied {
				res.replayProxied = append(res.replayProxied, at.Sub(start))
			} else {
				res.replayDirect = append(res.replayDirect, at.Sub(start))
			}
		}
	}
	return nil
}
