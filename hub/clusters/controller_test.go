package clusters_test

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/clusters"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

const (
	hubAccepted = clusterv1.ManagedClusterConditionHubAccepted
	available   = clusterv1.ManagedClusterConditionAvailable
)

func executionNamespace(cluster string) string { return "karmada-es-" + cluster }

// acceptedWithNamespace checks that the cluster is accepted, in its spec,
// condition and the Store, and has its execution namespace.
func acceptedWithNamespace(ctx context.Context, c *controller, name string) error {
	var mc clusterv1.ManagedCluster
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: name}, &mc); err != nil {
		return err
	}
	if !mc.Spec.HubAcceptsClient {
		return fmt.Errorf("not accepted")
	}
	if err := conditionIs(ctx, name, hubAccepted, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAccepted); err != nil {
		return err
	}
	if exists, err := namespaceExists(ctx, executionNamespace(name)); !exists {
		return fmt.Errorf("no execution namespace (%v)", err)
	}
	var ns corev1.Namespace
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: ctrlmeshv1alpha1.ClusterNamespace(name)}, &ns); err != nil {
		return fmt.Errorf("no cluster namespace: %w", err)
	}
	if got := ns.Labels[clusterv1.ClusterNameLabelKey]; got != name {
		return fmt.Errorf("cluster namespace labeled %s=%q, want %q", clusterv1.ClusterNameLabelKey, got, name)
	}
	if sc, ok := c.store.Snapshot().Cluster(name); !ok || !sc.Accepted {
		return fmt.Errorf("store has %+v", sc)
	}
	return nil
}

func TestAutoAccept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _ := startController(t, clusters.Options{AutoAccept: true})
	name := unique("auto")
	createCluster(t, ctx, name, false)
	env.Eventually(t, 20*time.Second, "auto-acceptance", func() error {
		if err := acceptedWithNamespace(ctx, c, name); err != nil {
			return err
		}
		// Accepted, with no heartbeat yet.
		if err := conditionIs(ctx, name, available, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat); err != nil {
			return err
		}
		if err := recorded(c.store, name, true, false, ctrlmeshv1alpha1.ReasonNoHeartbeat); err != nil {
			return err
		}
		if c.changesOf(name) == 0 {
			return fmt.Errorf("no change event")
		}
		return nil
	})
	if sc, _ := c.store.Snapshot().Cluster(name); sc.Labels["test"] != t.Name() {
		t.Errorf("store labels %v", sc.Labels)
	}
}

func TestAcceptByAdmin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _ := startController(t, clusters.Options{})
	name := unique("manual")
	createCluster(t, ctx, name, false)
	// Once the controller has written the condition it has done all it does.
	env.Eventually(t, 20*time.Second, "the pending cluster", func() error {
		if err := conditionIs(ctx, name, available, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat); err != nil {
			return err
		}
		return recorded(c.store, name, false, false, ctrlmeshv1alpha1.ReasonNoHeartbeat)
	})
	// As OCM's hub: no HubAccepted condition before the first acceptance
	// (OCM's lease controller takes one for "accepted once").
	if mc := getCluster(t, ctx, name); mc.Spec.HubAcceptsClient || meta.FindStatusCondition(mc.Status.Conditions, hubAccepted) != nil {
		t.Fatalf("pending cluster: hubAcceptsClient %t, conditions %+v", mc.Spec.HubAcceptsClient, mc.Status.Conditions)
	}
	if exists, err := namespaceExists(ctx, executionNamespace(name)); exists || err != nil {
		t.Fatalf("execution namespace of a pending cluster: %v, %v", exists, err)
	}

	mc := getCluster(t, ctx, name)
	mc.Spec.HubAcceptsClient = true
	if err := hub.Client.Update(ctx, mc); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 20*time.Second, "acceptance by the admin", func() error { return acceptedWithNamespace(ctx, c, name) })

	// The admin withdraws the acceptance: denied, as OCM's hub says it.
	mc = getCluster(t, ctx, name)
	mc.Spec.HubAcceptsClient = false
	if err := hub.Client.Update(ctx, mc); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 20*time.Second, "the denied cluster", func() error {
		if err := conditionIs(ctx, name, hubAccepted, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonClusterDenied); err != nil {
			return err
		}
		return recorded(c.store, name, false, false, ctrlmeshv1alpha1.ReasonNoHeartbeat)
	})
}

// runHeartbeat beats for cluster until the returned stop is called.
func runHeartbeat(t *testing.T, cluster string, leaseDuration time.Duration) (stop func()) {
	t.Helper()
	hb := &membership.Heartbeat{Hub: hub.Client, ClusterName: cluster, Identity: "agent-0",
		LeaseDuration: leaseDuration, RenewInterval: leaseDuration / 10, Log: logr.Discard()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hb.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func leaseOf(t *testing.T, ctx context.Context, cluster string) *coordinationv1.Lease {
	t.Helper()
	var lease coordinationv1.Lease
	if err := hub.Client.Get(ctx, client.ObjectKey{Namespace: ctrlmeshv1alpha1.ClusterNamespace(cluster), Name: ctrlmeshv1alpha1.HeartbeatLeaseName}, &lease); err != nil {
		t.Fatal(err)
	}
	return &lease
}

func TestHeartbeatAvailability(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const leaseDuration = 2 * time.Second
	c, _ := startController(t, clusters.Options{AutoAccept: true})
	name := unique("heartbeat")
	createCluster(t, ctx, name, true)
	env.Eventually(t, 20*time.Second, "the execution namespace", func() error { return acceptedWithNamespace(ctx, c, name) })

	isAvailable := func() error {
		if err := conditionIs(ctx, name, available, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable); err != nil {
			return err
		}
		if sc, _ := c.store.Snapshot().Cluster(name); !sc.Usable() {
			return fmt.Errorf("not usable: %+v", sc)
		}
		return recorded(c.store, name, true, true, "")
	}
	stopHeartbeat := runHeartbeat(t, name, leaseDuration)
	env.Eventually(t, 20*time.Second, "availability with a fresh lease", isAvailable)
	changes := c.changesOf(name)
	time.Sleep(leaseDuration) // renewals, each an event of the Lease
	if got := c.changesOf(name); got != changes {
		t.Errorf("%d change events while only the heartbeat renewed", got-changes)
	}

	// The agent stops: the lease runs out with no event to tell.
	stopHeartbeat()
	lease := leaseOf(t, ctx, name)
	// Fresh for the lease's duration, but at least as long as the rules
	// validity the agent granted with the last renewal may run.
	expiry := lease.Spec.RenewTime.Add(max(leaseDuration, route.LapseBound(testRulesValidity)))
	env.Eventually(t, 10*time.Second, "unavailability after the lease ran out", func() error {
		err := conditionIs(ctx, name, available, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped)
		if err == nil && time.Now().Before(expiry) {
			t.Fatalf("unavailable at %s, before the heartbeat's expiry %s", time.Now(), expiry)
		}
		return err
	})
	if late := time.Since(expiry); late > time.Second {
		t.Errorf("unavailable %s after the heartbeat's expiry, want within 1 s", late)
	}
	if sc, _ := c.store.Snapshot().Cluster(name); !sc.HeartbeatLapsed {
		t.Errorf("a cluster whose heartbeat expired is not recorded as lapsed: %+v", sc)
	}
	if err := recorded(c.store, name, true, false, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped); err != nil {
		t.Error(err)
	}
	// The hub judges by when it saw the last renewal, on its own clock: a
	// moment after the agent wrote it.
	if sc, _ := c.store.Snapshot().Cluster(name); sc.HeartbeatExpiry.Before(expiry) || sc.HeartbeatExpiry.After(expiry.Add(time.Second)) {
		t.Errorf("store heartbeat expiry %s, want within a second after %s", sc.HeartbeatExpiry, expiry)
	}
	if sc, _ := c.store.Snapshot().Cluster(name); sc.Usable() {
		t.Error("an unavailable cluster is usable")
	}

	// The agent is back.
	stopHeartbeat = runHeartbeat(t, name, leaseDuration)
	defer stopHeartbeat()
	env.Eventually(t, 20*time.Second, "availability after renewals resumed", isAvailable)
}

// TestSkewedAgentClock: an agent whose clock runs a minute behind the hub's
// writes renewTimes that look a minute old; the hub judges freshness by when
// it sees the renewals, so the cluster is available while they come and
// unavailable one lease duration after they stop.
func TestSkewedAgentClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const leaseDuration = 2 * time.Second
	c, _ := startController(t, clusters.Options{AutoAccept: true})
	name := unique("skewed")
	createCluster(t, ctx, name, true)
	env.Eventually(t, 20*time.Second, "the execution namespace", func() error { return acceptedWithNamespace(ctx, c, name) })

	renew := func() error {
		agentNow := metav1.NewMicroTime(time.Now().Add(-time.Minute))
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ctrlmeshv1alpha1.ClusterNamespace(name), Name: ctrlmeshv1alpha1.HeartbeatLeaseName}}
		mark := map[string]string{ctrlmeshv1alpha1.HeartbeatRenewalAnnotation: agentNow.UTC().Format(metav1.RFC3339Micro)}
		if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(lease), lease); apierrors.IsNotFound(err) {
			lease.Annotations = mark
			lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To("agent-0"), LeaseDurationSeconds: ptr.To(int32(leaseDuration / time.Second)), RenewTime: &agentNow}
			return hub.Client.Create(ctx, lease)
		} else if err != nil {
			return err
		}
		lease.Annotations = mark
		lease.Spec.RenewTime = &agentNow
		return hub.Client.Update(ctx, lease)
	}
	var lastRenewal time.Time
	renewFor := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(leaseDuration / 10) {
			if err := renew(); err != nil {
				t.Fatal(err)
			}
			lastRenewal = time.Now()
		}
	}
	renewFor(3 * leaseDuration)
	if err := conditionIs(ctx, name, available, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable); err != nil {
		t.Fatalf("renewing with a clock a minute behind: %v", err)
	}
	if sc, _ := c.store.Snapshot().Cluster(name); !sc.Usable() {
		t.Fatalf("renewing with a clock a minute behind: not usable: %+v", sc)
	}
	env.Eventually(t, 10*time.Second, "unavailability after the renewals stopped", func() error {
		return conditionIs(ctx, name, available, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped)
	})
	if since := time.Since(lastRenewal); since < leaseDuration || since > leaseDuration+2*time.Second {
		t.Errorf("unavailable %s after the last renewal, want one lease duration (%s) and at most 2 s more", since, leaseDuration)
	}
}

// TestOCMAgentRenewalsDoNotCount: where OCM's registration agent runs in the
// member beside the ctrlmesh agent, it renews the same Lease
// (managed-cluster-lease): it reads it, sets renewTime and updates it. Once
// the ctrlmesh agent stops, the cluster's heartbeat stops for the hub all
// the same — only the ctrlmesh agent grants its proxies rules validity —
// so the cluster lapses one heartbeat lifetime after the ctrlmesh agent's
// last renewal. Before the mark, the klusterlet kept it fresh for ever.
func TestOCMAgentRenewalsDoNotCount(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const leaseDuration = 2 * time.Second
	c, _ := startController(t, clusters.Options{AutoAccept: true})
	name := unique("klusterlet")
	createCluster(t, ctx, name, true)
	env.Eventually(t, 20*time.Second, "the namespaces", func() error { return acceptedWithNamespace(ctx, c, name) })

	stopHeartbeat := runHeartbeat(t, name, leaseDuration)
	env.Eventually(t, 20*time.Second, "availability with the ctrlmesh agent's heartbeat", func() error {
		return conditionIs(ctx, name, available, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable)
	})
	stopHeartbeat()
	lastMark := leaseOf(t, ctx, name).Annotations[ctrlmeshv1alpha1.HeartbeatRenewalAnnotation]
	if lastMark == "" {
		t.Fatal("the heartbeat did not mark its renewal")
	}

	// OCM's agent renews, as its lease updater does, every 200 ms.
	klusterletCtx, stopKlusterlet := context.WithCancel(ctx)
	defer stopKlusterlet()
	klusterletDone := make(chan struct{})
	go func() {
		defer close(klusterletDone)
		for klusterletCtx.Err() == nil {
			lease := leaseOf(t, ctx, name)
			lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
			if err := hub.Client.Update(klusterletCtx, lease); err != nil && klusterletCtx.Err() == nil && !apierrors.IsConflict(err) {
				t.Errorf("renewing as OCM's agent: %v", err)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	env.Eventually(t, 20*time.Second, "the heartbeat stopped although OCM's agent renews the Lease", func() error {
		if err := conditionIs(ctx, name, available, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped); err != nil {
			return err
		}
		if sc, _ := c.store.Snapshot().Cluster(name); !sc.HeartbeatLapsed {
			return fmt.Errorf("not lapsed: %+v", sc)
		}
		return nil
	})
	stopKlusterlet()
	<-klusterletDone
	if got := leaseOf(t, ctx, name).Annotations[ctrlmeshv1alpha1.HeartbeatRenewalAnnotation]; got != lastMark {
		t.Errorf("the mark changed from %q to %q without the ctrlmesh agent", lastMark, got)
	}
}

// The agent writes its claims into the status the controller writes its
// conditions into; neither loses the other's writes.
func TestClaimsSurviveConditionWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _ := startController(t, clusters.Options{AutoAccept: true})
	name := unique("claims")
	createCluster(t, ctx, name, true)
	env.Eventually(t, 20*time.Second, "the execution namespace", func() error { return acceptedWithNamespace(ctx, c, name) })

	const counterClaim = "counter.test.ctrlmesh.io"
	member := hubDiscovery(t)
	claimsCtx, stopClaims := context.WithCancel(ctx)
	lastClaim := make(chan int, 1)
	go func() {
		i := 0
		for ; claimsCtx.Err() == nil; i++ {
			err := membership.Join(claimsCtx, hub.Client, membership.JoinOptions{ClusterName: name, Member: member, MemberClient: hub.Client,
				ExtraClaims: map[string]string{counterClaim: strconv.Itoa(i)}})
			if err != nil && claimsCtx.Err() == nil {
				t.Errorf("join %d: %v", i, err)
			}
			if claimsCtx.Err() != nil {
				break
			}
		}
		lastClaim <- i
	}()

	// Availability flips, and the controller writes its conditions, while
	// the agent writes claims.
	hb := &membership.Heartbeat{Hub: hub.Client, ClusterName: name, Identity: "agent-0", LeaseDuration: time.Second}
	for range 3 {
		if err := hb.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		env.Eventually(t, 10*time.Second, "available", func() error {
			return conditionIs(ctx, name, available, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable)
		})
		env.Eventually(t, 10*time.Second, "unavailable", func() error {
			return conditionIs(ctx, name, available, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped)
		})
	}
	stopClaims()
	last := <-lastClaim

	mc := getCluster(t, ctx, name)
	claims := map[string]string{}
	for _, cl := range mc.Status.ClusterClaims {
		claims[cl.Name] = cl.Value
	}
	// The last Join may have been cancelled before it wrote.
	if got := claims[counterClaim]; got != strconv.Itoa(last) && got != strconv.Itoa(last-1) {
		t.Errorf("claim %s = %q after %d joins", counterClaim, got, last)
	}
	if claims[membership.ClaimKubeVersion] == "" || claims[membership.ClaimCtrlmeshVersion] == "" || claims[membership.ClaimClusterID] == "" {
		t.Errorf("claims %v", claims)
	}
	if err := conditionIs(ctx, name, hubAccepted, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAccepted); err != nil {
		t.Error(err)
	}
	if err := conditionIs(ctx, name, available, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped); err != nil {
		t.Error(err)
	}
	t.Logf("%d joins during 3 availability flips", last)
}

// A new hub (new manager, new Store) rebuilds the Store from the API objects
// and writes nothing: a lost member stays unavailable, a live one available.
func TestRestartRebuildsWithoutWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first, stopFirst := startController(t, clusters.Options{})
	fresh, expired, pending, noLease := unique("restart-fresh"), unique("restart-expired"), unique("restart-pending"), unique("restart-nolease")
	createCluster(t, ctx, fresh, true)
	createCluster(t, ctx, expired, true)
	createCluster(t, ctx, pending, false)
	createCluster(t, ctx, noLease, true)
	for _, name := range []string{fresh, expired, noLease} {
		env.Eventually(t, 20*time.Second, "the execution namespace", func() error { return acceptedWithNamespace(ctx, first, name) })
	}
	if err := (&membership.Heartbeat{Hub: hub.Client, ClusterName: fresh, Identity: "agent-0", LeaseDuration: 10 * time.Minute}).Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := (&membership.Heartbeat{Hub: hub.Client, ClusterName: expired, Identity: "agent-0", LeaseDuration: time.Second}).Renew(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		accepted, available bool
		reason              string
	}{
		fresh:   {true, true, ""},
		expired: {true, false, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped},
		pending: {false, false, ctrlmeshv1alpha1.ReasonNoHeartbeat},
		noLease: {true, false, ctrlmeshv1alpha1.ReasonNoHeartbeat},
	}
	env.Eventually(t, 20*time.Second, "the first hub's state", func() error {
		for name, w := range want {
			if err := recorded(first.store, name, w.accepted, w.available, w.reason); err != nil {
				return err
			}
			// The heartbeat's verdicts are Unknown, as OCM's hub writes them.
			status, reason := metav1.ConditionUnknown, w.reason
			if w.available {
				status, reason = metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable
			}
			if err := conditionIs(ctx, name, available, status, reason); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	})
	stopFirst()

	versions := func() map[string]string {
		out := map[string]string{}
		for name := range want {
			out["ManagedCluster "+name] = getCluster(t, ctx, name).ResourceVersion
			var ns corev1.Namespace
			for _, nsName := range []string{executionNamespace(name), ctrlmeshv1alpha1.ClusterNamespace(name)} {
				if err := hub.Client.Get(ctx, client.ObjectKey{Name: nsName}, &ns); err == nil {
					out["Namespace "+ns.Name] = ns.ResourceVersion
				}
			}
		}
		return out
	}
	before := versions()

	second, _ := startController(t, clusters.Options{})
	env.Eventually(t, 20*time.Second, "the second hub's state", func() error {
		for name := range want {
			old, _ := first.store.Snapshot().Cluster(name)
			got, ok := second.store.Snapshot().Cluster(name)
			// The hub judges heartbeats by when it saw them renewed, which a
			// new hub has not: it takes a fresh lease as renewed at its
			// start, so an available cluster's heartbeat expires no earlier
			// than the first hub thought.
			if !ok || got.Accepted != old.Accepted || got.Available != old.Available || got.Reason != old.Reason ||
				(old.Available && got.HeartbeatExpiry.Before(old.HeartbeatExpiry)) || got.Labels["test"] != old.Labels["test"] {
				return fmt.Errorf("cluster %s: second hub has %+v, first had %+v", name, got, old)
			}
		}
		return nil
	})
	time.Sleep(2 * time.Second) // time for writes that should not come
	if after := versions(); !maps.Equal(before, after) {
		t.Errorf("the second hub wrote: resourceVersions before %v, after %v", before, after)
	}
}
