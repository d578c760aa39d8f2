package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

const memoryMember = "member1"

// podMemory is one operator's memory, read once it is settled.
type podMemory struct {
	pod     string
	buckets string
	objects int
	// operator is the demo operator's memory, the figure the goal is
	// about; proxy is its ctrlmesh-proxy's, read at the same moment.
	operator, proxy procMemory
	// runtime is how the operator's Go runtime accounts for its memory,
	// read from its /metrics right after operator.
	runtime goMemory
	// reconciled is how long after the pod's start every object of its
	// share had a reconcile record with outcome written or unchanged.
	reconciled time.Duration
}

type memoryResult struct {
	objects, namespaces, payload int
	// perBucket is the fewest and most namespaces in one bucket.
	minPerBucket, maxPerBucket int
	createTime                 time.Duration
	idle, single               podMemory
	sharded                    []podMemory
}

// memory runs the memory phase on its own one-member fleet.
func (b *bench) memory(ctx context.Context, res *results) (_ *memoryResult, err error) {
	o := b.opts
	mr := &memoryResult{objects: o.objects, namespaces: o.namespaces, payload: o.payload}
	f, err := b.startFleet(ctx, filepath.Join(b.workDir, "memory"), []string{memoryMember}, nil)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, b.stopFleet(f)) }()
	m := f.Members[memoryMember]
	recordDir := filepath.Join(b.workDir, "memory", "records")
	if err := os.MkdirAll(recordDir, 0o755); err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(m.Config)
	cfg.QPS = -1 // no client-side rate limit for the seeding
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if v, err := cs.Discovery().ServerVersion(); err == nil {
		res.apiserver = v.GitVersion
	}
	start := func(name string) (*operatorPod, error) {
		port, err := controlplane.FreePort()
		if err != nil {
			return nil, err
		}
		path := filepath.Join(recordDir, name+".jsonl")
		metrics := fmt.Sprintf("127.0.0.1:%d", port)
		p, err := b.startPod(ctx, f, memoryMember, name, "--record-file="+path, "--metrics-addr="+metrics)
		return &operatorPod{Pod: p, records: &recordTail{path: path, keys: map[string]bool{}}, metrics: metrics}, err
	}

	// 1. Idle: one pod serving every bucket, no ConfigMap yet.
	sc := localfleet.ShardingConfig(opNamespace, opName, []string{memoryMember})
	b.step("ShardingConfig over %s; idle pod %s-idle serving all %d buckets, no managed ConfigMap yet", memoryMember, opName, buckets)
	if err := f.Hub.Client.Create(ctx, sc); err != nil {
		return nil, fmt.Errorf("creating the ShardingConfig: %w", err)
	}
	idle, err := start(opName + "-idle")
	if err != nil {
		return nil, err
	}
	started := time.Now()
	if _, err := waitReady(ctx, f, "Ready with the idle pod on every bucket", servesAll(memoryMember, idle.Name)); err != nil {
		return nil, err
	}
	if mr.idle, err = b.settleAndRead(ctx, f, idle, nil, started); err != nil {
		return nil, err
	}
	mr.idle.buckets = "0-31"
	b.step("idle RSS %s (peak %s); killing the idle pod", mib(mr.idle.operator.rss), mib(mr.idle.operator.hwm))
	if err := f.KillPod(ctx, idle.Pod); err != nil {
		return nil, err
	}

	// 2. The ConfigMaps, without the operator's annotations.
	nss, perBucket := env.SpreadNamespaces(space, "bench", nil, o.namespaces)
	mr.minPerBucket, mr.maxPerBucket = slices.Min(perBucket), slices.Max(perBucket)
	objs := makeObjects(nss, o.objects, o.payload)
	b.step("creating %d namespaces (%d-%d per bucket) and %d ConfigMaps (%d-byte payload) with %d writers",
		len(nss), mr.minPerBucket, mr.maxPerBucket, len(objs), o.payload, o.workers)
	t0 := time.Now()
	for _, ns := range nss {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}
	if err := b.parallel(ctx, "created", len(objs), func(ctx context.Context, i int) error {
		_, err := cs.CoreV1().ConfigMaps(objs[i].Namespace).Create(ctx, objs[i], metav1.CreateOptions{})
		return err
	}); err != nil {
		return nil, fmt.Errorf("creating the ConfigMaps: %w", err)
	}
	mr.createTime = time.Since(t0)
	b.step("created %d ConfigMaps in %.1fs (%.0f/s)", len(objs), mr.createTime.Seconds(), float64(len(objs))/mr.createTime.Seconds())

	// 3. One pod serving all of them, annotating every one.
	single := opName + "-single"
	b.step("single pod %s: waiting until it serves all %d buckets and has reconciled (annotated) all %d ConfigMaps", single, buckets, len(objs))
	sp, err := start(single)
	if err != nil {
		return nil, err
	}
	started = time.Now()
	if _, err := waitReady(ctx, f, "Ready with the single pod on every bucket", servesAll(memoryMember, single)); err != nil {
		return nil, err
	}
	if mr.single, err = b.settleAndRead(ctx, f, sp, allKeys(objs), started); err != nil {
		return nil, err
	}
	mr.single.buckets = "0-31"
	b.step("single pod reconciled all %d objects after %.1fs (%.0f/s from its start); RSS %s (peak %s); killing it",
		mr.single.objects, mr.single.reconciled.Seconds(), rate(mr.single.objects, mr.single.reconciled), mib(mr.single.operator.rss), mib(mr.single.operator.hwm))
	if err := f.KillPod(ctx, sp.Pod); err != nil {
		return nil, err
	}

	// 4. o.pods fresh pods sharing the buckets, each rewriting the
	// reconciled-by annotation of the objects of its buckets.
	var pods []*operatorPod
	var names []string
	b.step("starting %d fresh pods; waiting until each serves its shard", o.pods)
	started = time.Now()
	for i := range o.pods {
		p, err := start(fmt.Sprintf("%s-%d", opName, i))
		if err != nil {
			return nil, err
		}
		pods, names = append(pods, p), append(names, p.Name)
	}
	placed, err := waitReady(ctx, f, fmt.Sprintf("Ready with %d pods sharing every bucket", o.pods), func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		var sets []sharding.Set
		for _, n := range names {
			s, err := podBuckets(sc, memoryMember, n)
			if err != nil || s.IsEmpty() {
				return false
			}
			sets = append(sets, s)
		}
		return union(sets...).Len() == buckets
	})
	if err != nil {
		return nil, err
	}
	owner := map[int]string{}
	shares := make([]map[string]bool, len(pods))
	bucketsOf := make([]string, len(pods))
	for i, n := range names {
		s, _ := podBuckets(placed, memoryMember, n)
		bucketsOf[i] = s.String()
		shares[i] = map[string]bool{}
		for bk := range buckets {
			if s.Has(bk) {
				owner[bk] = n
			}
		}
	}
	for _, obj := range objs {
		n := owner[space.Bucket(obj.Namespace)]
		shares[slices.Index(names, n)][key(obj.Namespace, obj.Name)] = true
	}
	b.step("placement: %s", placementText(placed))
	b.step("waiting until every pod has reconciled its share (writing its own name in their reconciled-by annotation) and gone quiet")
	mems, err := b.settleAndReadAll(ctx, f, pods, shares, started)
	if err != nil {
		return nil, err
	}
	for i := range mems {
		mems[i].buckets = bucketsOf[i]
		b.step("%s: buckets %s, %d objects, RSS %s (peak %s)", mems[i].pod, mems[i].buckets, mems[i].objects, mib(mems[i].operator.rss), mib(mems[i].operator.hwm))
	}
	mr.sharded = mems
	return mr, nil
}

// servesAll matches a ShardingConfig whose pod serves every bucket of
// cluster.
func servesAll(cluster, pod string) func(*ctrlmeshv1alpha1.ShardingConfig) bool {
	return func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		s, err := podBuckets(sc, cluster, pod)
		return err == nil && s.Len() == buckets
	}
}

// operatorPod is a pod of the memory phase: its reconcile records and the
// address of its operator's /metrics.
type operatorPod struct {
	*localfleet.Pod
	records *recordTail
	metrics string
}

func (b *bench) settleAndRead(ctx context.Context, f *localfleet.Fleet, p *operatorPod, share map[string]bool, started time.Time) (podMemory, error) {
	mems, err := b.settleAndReadAll(ctx, f, []*operatorPod{p}, []map[string]bool{share}, started)
	if err != nil {
		return podMemory{}, err
	}
	return mems[0], nil
}

// settleAndReadAll waits until every pod's records cover its share (every
// object has a reconcile record with outcome written or unchanged) and no
// pod has recorded anything for b.opts.settle, then reads each operator's
// memory: /proc first, then what its Go runtime says of it.
func (b *bench) settleAndReadAll(ctx context.Context, f *localfleet.Fleet, pods []*operatorPod, shares []map[string]bool, started time.Time) ([]podMemory, error) {
	out := make([]podMemory, len(pods))
	covered := make([]bool, len(pods))
	lastChange := time.Now()
	lastReport := time.Now()
	deadline := time.Now().Add(readyWithin + 5*time.Minute)
	for {
		for i, p := range pods {
			t := p.records
			grew, err := t.poll()
			if err != nil {
				return nil, err
			}
			if grew {
				lastChange = time.Now()
			}
			if !covered[i] && t.covers(shares[i]) {
				covered[i] = true
				out[i].reconciled = time.Since(started)
			}
		}
		if !slices.Contains(covered, false) && time.Since(lastChange) >= b.opts.settle {
			break
		}
		if err := f.Err(); err != nil {
			return nil, err
		}
		if time.Since(lastReport) >= 10*time.Second {
			lastReport = time.Now()
			var s []string
			for i, p := range pods {
				s = append(s, fmt.Sprintf("%s %d/%d", p.Name, p.records.coverage(shares[i]), len(shares[i])))
			}
			b.step("reconciled: %s", strings.Join(s, ", "))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the operators did not reconcile their shares and go quiet in time")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	for i, p := range pods {
		op, err := readProcMemory(p.OperatorPID())
		if err != nil {
			return nil, fmt.Errorf("operator of %s: %w", p.Name, err)
		}
		proxy, err := readProcMemory(p.ProxyPID())
		if err != nil {
			return nil, fmt.Errorf("proxy of %s: %w", p.Name, err)
		}
		rt, err := readGoMemory(ctx, p.metrics)
		if err != nil {
			return nil, fmt.Errorf("operator of %s: %w", p.Name, err)
		}
		out[i].pod, out[i].objects, out[i].operator, out[i].proxy, out[i].runtime = p.Name, len(shares[i]), op, proxy, rt
	}
	return out, nil
}

// recordTail follows an operator's record file: the objects it has
// reconciled and found.
type recordTail struct {
	path   string
	offset int64
	keys   map[string]bool
}

// poll reads the complete lines appended since the last poll, and tells
// whether there were any.
func (t *recordTail) poll() (bool, error) {
	f, err := os.Open(t.path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer func() { _ = f.Close() }()
	if _, err := f.Seek(t.offset, io.SeekStart); err != nil {
		return false, err
	}
	r := bufio.NewReaderSize(f, 1<<20)
	grew := false
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			// A partial last line is read again next time.
			if errors.Is(err, io.EOF) {
				return grew, nil
			}
			return grew, err
		}
		t.offset += int64(len(line))
		grew = true
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var rec operator.Reconcile
		if err := json.Unmarshal(line, &rec); err != nil {
			return grew, fmt.Errorf("%s: %w", t.path, err)
		}
		if rec.Outcome == operator.OutcomeUnchanged || rec.Outcome == operator.OutcomeWritten {
			t.keys[key(rec.Namespace, rec.Name)] = true
		}
	}
}

func (t *recordTail) coverage(share map[string]bool) int {
	n := 0
	for k := range share {
		if t.keys[k] {
			n++
		}
	}
	return n
}

func (t *recordTail) covers(share map[string]bool) bool { return t.coverage(share) == len(share) }

func key(ns, name string) string { return ns + "/" + name }

func allKeys(objs []*corev1.ConfigMap) map[string]bool {
	out := make(map[string]bool, len(objs))
	for _, o := range objs {
		out[key(o.Namespace, o.Name)] = true
	}
	return out
}

// makeObjects spreads total managed ConfigMaps over namespaces, each with
// a payload-byte data value and none of the operator's annotations.
func makeObjects(namespaces []string, total, payload int) []*corev1.ConfigMap {
	out := make([]*corev1.ConfigMap, 0, total)
	for i := range total {
		ns := namespaces[i%len(namespaces)]
		name := fmt.Sprintf("cm-%05d", i/len(namespaces))
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
				Labels: map[string]string{operator.ManagedLabel: operator.ManagedValue, "app.kubernetes.io/part-of": "fleetbench"}},
			Data: map[string]string{"config.yaml": payloadText(ns+"/"+name, payload)},
		}
		out = append(out, cm)
	}
	return out
}

// payloadText is n bytes of YAML-like settings, different per object.
func payloadText(seed string, n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "setting%02d: %s-%d\n", i, seed, i*7919%1000)
	}
	return sb.String()[:n]
}

// parallel runs do(0..n-1) on b.opts.workers workers, printing progress
// every 10 s; the first error stops it.
func (b *bench) parallel(ctx context.Context, what string, n int, do func(context.Context, int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next, finished atomic.Int64
	var once sync.Once
	var firstErr error
	var wg sync.WaitGroup
	for range b.opts.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := do(ctx, i); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
				finished.Add(1)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			if firstErr == nil && ctx.Err() != nil {
				return ctx.Err()
			}
			return firstErr
		case <-tick.C:
			b.step("%s %d/%d", what, finished.Load(), n)
		}
	}
}

func mib(bytes int64) string { return fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20)) }
