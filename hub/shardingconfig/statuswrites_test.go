package shardingconfig_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/shardingconfig"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestStatusWritesSpacedBySize: while members report one after the other,
// the hub writes a ShardingConfig's status no faster than its size allows
// at the status rate, unless the write says something new (a condition's
// status or reason, the generation, the canary), and the last report is in
// the status in the end. Every status write carries the whole placement
// to etcd and every watcher; written at every report, a rollout over 1000
// members cost O(members²) bytes (make bench-scale).
func TestStatusWritesSpacedBySize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A status of 6 members of two pods is 1-2 KB: a write every 1-2 s,
	// while the members report every 400 ms.
	const bytesPerSecond = 1000
	// The writes are timed where the hub times them, as it starts each:
	// a watch, on a loaded machine, delivered two writes 15 ms apart that
	// the hub made 216 ms apart or more.
	writes := &statusWriteLog{}
	_, stopHub := startHubTuned(t, 0, nil, func(r *shardingconfig.Reconciler) {
		r.StatusBytesPerSecond = bytesPerSecond
		writes.Client, r.Client = r.Client, writes
	})
	defer stopHub()
	var names []string
	for range 6 {
		name := unique("rate-member")
		joinCluster(t, ctx, name)
		names = append(names, name)
	}
	ns := unique("rate-ops")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	sc := configOver(ns, ctrlmeshv1alpha1.ScopePerCluster, names...)
	env.Create(t, ctx, hub.Client, sc)
	env.Eventually(t, 30*time.Second, "every member's Work", func() error {
		for _, name := range names {
			if _, err := workOf(t, ctx, sc, name); err != nil {
				return err
			}
		}
		return nil
	})

	// Two rounds of reports: one pod in each member, then two.
	for _, pods := range [][]string{{"op-0"}, {"op-0", "op-1"}} {
		for _, name := range names {
			work, err := workOf(t, ctx, sc, name)
			if err != nil {
				t.Fatal(err)
			}
			reportPods(t, ctx, work, pods...)
			time.Sleep(400 * time.Millisecond)
		}
	}
	env.Eventually(t, time.Minute, "the last reports in the status", func() error {
		var got ctrlmeshv1alpha1.ShardingConfig
		if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
			return err
		}
		for _, name := range names {
			var placed []string
			for _, p := range got.Status.Placement {
				if p.Cluster == name {
					placed = append(placed, p.Pods...)
				}
			}
			if slices.Sort(placed); !slices.Equal(placed, []string{"op-0", "op-1"}) {
				return fmt.Errorf("member %s: pods %v placed, want op-0 and op-1", name, placed)
			}
		}
		return nil
	})
	seen := writes.list()

	spaced := 0
	for i := 1; i < len(seen); i++ {
		before, next := seen[i-1], seen[i]
		if shardingconfig.NewsIn(&before.status, &next.status) {
			continue
		}
		spaced++
		// The bytes of the patch before at the rate, less a fifth: the
		// hub takes the time of a write before it computes the patch, the
		// log after, and either may wait for a CPU on a loaded machine.
		least := time.Duration(float64(before.bytes) / bytesPerSecond * float64(time.Second) * 4 / 5)
		if gap := next.at.Sub(before.at); gap < least {
			t.Errorf("status written %s after the one before, whose patch of %d bytes at %d bytes/s wants at least %s between them; it changed only the placement's detail: %d of %d shards ready, then %d of %d",
				gap.Round(time.Millisecond), before.bytes, bytesPerSecond, least, before.status.ReadyShards, before.status.Shards, next.status.ReadyShards, next.status.Shards)
		}
	}
	if spaced == 0 {
		t.Fatalf("none of the %d status writes changed only the placement's detail: the reports did not test the spacing", len(seen))
	}
	t.Logf("%d status writes during 12 reports, %d of them spaced by size", len(seen), spaced)
}

// TestConditionMessageWithinTheAPIServersBound: the real API server takes
// a status whose condition quotes a message past metav1.Condition's 32768
// bytes (a member's own condition message, say), as the hub sets it. At
// 1000 members, messages naming every waiting pod were refused (422) and
// left the configs' status stuck (make bench-scale).
func TestConditionMessageWithinTheAPIServersBound(t *testing.T) {
	ctx := t.Context()
	ns := unique("long-message")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	sc := configOver(ns, ctrlmeshv1alpha1.ScopePerCluster, "m1")
	env.Create(t, ctx, hub.Client, sc)
	message := "cluster m1 refuses the rules: " + strings.Repeat("namespace team-ü ", 3000)
	shardingconfig.SetConditions(&sc.Status, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonInvalidSpec, message, sc.Generation)
	if err := hub.Client.Status().Update(ctx, sc); err != nil {
		t.Fatalf("a status quoting a message of %d bytes: %v", len(message), err)
	}
	var got ctrlmeshv1alpha1.ShardingConfig
	if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(got.Status.Conditions, ctrlmeshv1alpha1.ConditionReady)
	if c == nil || c.Reason != ctrlmeshv1alpha1.ReasonInvalidSpec || !strings.HasPrefix(c.Message, "cluster m1 refuses the rules: namespace team-ü") {
		t.Errorf("Ready: %+v", c)
	}
}

// statusWriteLog is a client whose status patches of ShardingConfigs are
// logged as they start: when, the status written and the patch's bytes.
type statusWriteLog struct {
	client.Client
	mu     sync.Mutex
	writes []statusWriteEntry
}

type statusWriteEntry struct {
	at     time.Time
	status ctrlmeshv1alpha1.ShardingConfigStatus
	bytes  int
}

func (l *statusWriteLog) Status() client.SubResourceWriter {
	return &statusWriteLogger{SubResourceWriter: l.Client.Status(), log: l}
}

// list returns the logged writes that succeeded, in order.
func (l *statusWriteLog) list() []statusWriteEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.writes)
}

type statusWriteLogger struct {
	client.SubResourceWriter
	log *statusWriteLog
}

func (w *statusWriteLogger) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	at := time.Now()
	data, err := patch.Data(obj)
	if err != nil {
		return err
	}
	if err := w.SubResourceWriter.Patch(ctx, obj, patch, opts...); err != nil {
		return err
	}
	if sc, ok := obj.(*ctrlmeshv1alpha1.ShardingConfig); ok {
		w.log.mu.Lock()
		w.log.writes = append(w.log.writes, statusWriteEntry{at: at, status: *sc.Status.DeepCopy(), bytes: len(data)})
		w.log.mu.Unlock()
	}
	return nil
}

// TestPlacementKeptOnTheAPIServer: the hub's cache holds no placement
// (CacheTransform), so the hub knows the placement on the API server from
// its own writes, and reads it there when someone else may have written
// it. A new hub (a restart) rewrites no status whose placement is
// unchanged; a placement someone else changed is written again; a
// placement that becomes empty is removed from the status.
func TestPlacementKeptOnTheAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, stopFirst := startHub(t)
	names := []string{unique("kept-member"), unique("kept-member")}
	for _, name := range names {
		joinCluster(t, ctx, name)
	}
	ns := unique("kept-ops")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	sc := configOver(ns, ctrlmeshv1alpha1.ScopePerCluster, names...)
	key := client.ObjectKeyFromObject(sc)
	placedPods := func(want ...string) func() error {
		return func() error {
			var got ctrlmeshv1alpha1.ShardingConfig
			if err := hub.Client.Get(ctx, key, &got); err != nil {
				return err
			}
			var placed []string
			for _, p := range got.Status.Placement {
				for _, pod := range p.Pods {
					placed = append(placed, p.Cluster+"/"+pod)
				}
			}
			slices.Sort(placed)
			if want = slices.Sorted(slices.Values(want)); !slices.Equal(placed, want) {
				return fmt.Errorf("pods %v placed, want %v", placed, want)
			}
			return nil
		}
	}

	env.Create(t, ctx, hub.Client, sc)
	for _, name := range names {
		env.Eventually(t, 30*time.Second, "the Work of "+name, func() error {
			_, err := workOf(t, ctx, sc, name)
			return err
		})
		work, err := workOf(t, ctx, sc, name)
		if err != nil {
			t.Fatal(err)
		}
		reportPods(t, ctx, work, "op-0")
	}
	env.Eventually(t, time.Minute, "both members' pods placed", placedPods(names[0]+"/op-0", names[1]+"/op-0"))
	stopFirst()

	// A new hub: it reads the placement from the API server, and writes
	// nothing until a report changes it.
	writes := &statusWriteLog{}
	reads := &configReadLog{}
	_, stopSecond := startHubTuned(t, 0, nil, func(r *shardingconfig.Reconciler) {
		writes.Client, r.Client = r.Client, writes
		reads.Reader, r.Reader = r.Reader, reads
	})
	defer stopSecond()
	env.Eventually(t, 30*time.Second, "the new hub reading the placement from the API server", func() error {
		if reads.count(key) == 0 {
			return errors.New("not read yet")
		}
		return nil
	})
	// The reconcile that read it finishes within milliseconds.
	time.Sleep(2 * time.Second)
	if seen := writes.list(); len(seen) > 0 {
		t.Errorf("the new hub wrote the status %d times with nothing changed; first: %d of %d shards ready", len(seen), seen[0].status.ReadyShards, seen[0].status.Shards)
	}
	work, err := workOf(t, ctx, sc, names[1])
	if err != nil {
		t.Fatal(err)
	}
	reportPods(t, ctx, work, "op-0", "op-1")
	env.Eventually(t, time.Minute, "the new report placed", placedPods(names[0]+"/op-0", names[1]+"/op-0", names[1]+"/op-1"))
	readsOwnWrites := reads.count(key)

	// Someone else empties the placement: the hub reads it again and
	// writes it back.
	var live ctrlmeshv1alpha1.ShardingConfig
	if err := hub.Client.Get(ctx, key, &live); err != nil {
		t.Fatal(err)
	}
	live.Status.Placement = nil
	if err := hub.Client.Status().Update(ctx, &live); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, time.Minute, "the placement written again", placedPods(names[0]+"/op-0", names[1]+"/op-0", names[1]+"/op-1"))
	if reads.count(key) == readsOwnWrites {
		t.Error("the hub wrote the placement again without reading what someone else wrote")
	}

	// No cluster selected: no placement.
	if err := hub.Client.Get(ctx, key, &live); err != nil {
		t.Fatal(err)
	}
	live.Spec.Clusters.Names = []string{unique("gone")}
	if err := hub.Client.Update(ctx, &live); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, time.Minute, "the placement removed", func() error {
		if err := hub.Client.Get(ctx, key, &live); err != nil {
			return err
		}
		if live.Status.ObservedGeneration != live.Generation || live.Status.Placement != nil {
			return fmt.Errorf("status of generation %d (the spec's is %d) places %d shards, want none", live.Status.ObservedGeneration, live.Generation, len(live.Status.Placement))
		}
		return nil
	})
}

// configReadLog is a reader that counts the ShardingConfigs it reads, by
// key, and fails them with err when set.
type configReadLog struct {
	client.Reader
	// err, when set, fails every read of a ShardingConfig.
	err   error
	mu    sync.Mutex
	reads map[client.ObjectKey]int
}

func (l *configReadLog) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*ctrlmeshv1alpha1.ShardingConfig); ok {
		l.mu.Lock()
		if l.reads == nil {
			l.reads = map[client.ObjectKey]int{}
		}
		l.reads[key]++
		l.mu.Unlock()
		if l.err != nil {
			return l.err
		}
	}
	return l.Reader.Get(ctx, key, obj, opts...)
}

func (l *configReadLog) count(key client.ObjectKey) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reads[key]
}

// TestUnreadPlacementPublishesNothing: a hub that cannot read a config's
// placement from the API server (the cache holds none) places nothing for
// it: the reconcile fails before it publishes, and is retried.
func TestUnreadPlacementPublishesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reads := &configReadLog{err: errors.New("the API server is unreachable")}
	_, stopHub := startHubTuned(t, 0, nil, func(r *shardingconfig.Reconciler) {
		reads.Reader, r.Reader = r.Reader, reads
	})
	defer stopHub()
	name := unique("unread-member")
	joinCluster(t, ctx, name)
	ns := unique("unread-ops")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	sc := configOver(ns, ctrlmeshv1alpha1.ScopePerCluster, name)
	env.Create(t, ctx, hub.Client, sc)
	env.Eventually(t, 30*time.Second, "two reads of the placement, the second a retry", func() error {
		if n := reads.count(client.ObjectKeyFromObject(sc)); n < 2 {
			return fmt.Errorf("%d reads", n)
		}
		return nil
	})
	if _, err := workOf(t, ctx, sc, name); !apierrors.IsNotFound(err) {
		t.Errorf("the Work of %s: %v; want none published", name, err)
	}
	var got ctrlmeshv1alpha1.ShardingConfig
	if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.ObservedGeneration != 0 {
		t.Errorf("status written for generation %d without the placement read", got.Status.ObservedGeneration)
	}
}
