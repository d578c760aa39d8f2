package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/util/retry"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// Labels the benchmark gives its ManagedClusters, as a hub admin would: every
// ShardingConfig of PerCluster scope selects memberLabel, the one of Fleet
// scope fleetLabel.
const (
	memberLabel = "scale.ctrlmesh.io/member"
	fleetLabel  = "scale.ctrlmesh.io/fleet"
	// agentNamespace is the namespace every simulated agent claims: the
	// hub then grants the labeler its rights in every Work, as for a real
	// agent.
	agentNamespace = "ctrlmesh-system"
)

// member is one simulated member cluster as the hub sees it: its agent
// joined with membership.Join and renews its heartbeat with
// membership.Heartbeat, both the real agent's code; its Works' status is
// written by the load agent (loadAgent).
type member struct {
	name string
	// stop ends the heartbeat; lost makes the load agent stop reporting.
	stop context.CancelFunc
	done chan struct{}
	lost bool
}

// serverVersion is the simulated member's discovery answer to Join.
type serverVersion struct{}

func (serverVersion) ServerVersion() (*version.Info, error) {
	return &version.Info{GitVersion: "v1.36.3"}, nil
}

// joinMember creates the ManagedCluster as the hub admin labels it, joins
// the member as its agent does and starts its heartbeat.
func joinMember(ctx context.Context, hub client.Client, name string, fleet bool, lease, renew time.Duration) (*member, error) {
	labels := map[string]string{memberLabel: "true"}
	if fleet {
		labels[fleetLabel] = "true"
	}
	mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := hub.Create(ctx, mc); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating ManagedCluster %s: %w", name, err)
	}
	// The member's kube-system namespace, whose UID the agent claims as
	// the cluster ID: the member is simulated, so a fake reader holds it.
	kubeSystem := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: metav1.NamespaceSystem, UID: types.UID("uid-" + name)}}
	memberReader := fake.NewClientBuilder().WithObjects(kubeSystem).Build()
	if err := membership.Join(ctx, hub, membership.JoinOptions{
		ClusterName: name, Member: serverVersion{}, MemberClient: memberReader, AgentNamespace: agentNamespace, LeaseDuration: lease,
	}); err != nil {
		return nil, err
	}
	hbCtx, stop := context.WithCancel(ctx)
	m := &member{name: name, stop: stop, done: make(chan struct{})}
	hb := &membership.Heartbeat{Hub: hub, ClusterName: name, Identity: "agent-" + name, LeaseDuration: lease, RenewInterval: renew}
	go func() {
		defer close(m.done)
		_ = hb.Run(hbCtx)
	}()
	return m, nil
}

// loadAgent does, for every simulated member, what the member's agent does
// on the hub side once it applied a Work: it reflects the member's
// ShardRoute status into the Work's status (routework.ManifestStatus, the
// agent's and Karmada's format, read back by the hub with
// routework.ReadStatus). Each member runs -pods candidate pods per
// ShardingConfig, all ready, each with a proxy; a proxy applies new rules
// -proxy-delay after its agent applied them (the agent first reports the
// pods with the hash they enforced before, as the real agent does until the
// proxies report), and leads the shards the rules give it first. A failed
// pod disappears from the report and leads nothing (its Pod object deleted,
// its lock released).
type loadAgent struct {
	client     client.Client
	reader     client.Reader
	pods       int
	proxyDelay time.Duration

	mu      sync.Mutex
	members map[string]*member
	failed  map[string]bool // pod key: cluster/namespace/pod
	// proxies is, per Work, the rules hash its proxies enforce and the hash
	// they are applying since when.
	proxies map[types.NamespacedName]*proxyState
}

type proxyState struct {
	enforced string
	pending  string
	since    time.Time
}

func podKey(cluster, namespace, pod string) string { return cluster + "/" + namespace + "/" + pod }

// podName is the name of the i-th pod of a ShardingConfig in every member.
func podName(config string, i int) string { return fmt.Sprintf("%s-%d", config, i) }

func (a *loadAgent) fail(cluster, namespace, pod string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failed[podKey(cluster, namespace, pod)] = true
}

func (a *loadAgent) lose(cluster string) {
	a.mu.Lock()
	m := a.members[cluster]
	a.mu.Unlock()
	m.stop()
	<-m.done
	a.mu.Lock()
	m.lost = true
	a.mu.Unlock()
}

// reconcile brings one Work's status up to date; it returns when to come
// back (a proxy still applying), or zero. A write refused for a stale read
// is tried again on the Work read from the API server, as the real agent
// (agent/workapply) and Karmada's own status controller do: the cache can
// be far behind on a loaded API server, and retrying from it only adds
// refused writes to the load.
func (a *loadAgent) reconcile(ctx context.Context, key types.NamespacedName) (time.Duration, error) {
	var work workv1alpha1.Work
	if err := a.client.Get(ctx, key, &work); err != nil {
		if apierrors.IsNotFound(err) {
			a.mu.Lock()
			delete(a.proxies, key)
			a.mu.Unlock()
			return 0, nil
		}
		return 0, err
	}
	var requeue time.Duration
	fresh := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if fresh {
			if err := a.reader.Get(ctx, key, &work); err != nil {
				return err
			}
		}
		fresh = true
		want, again, err := a.report(key, &work)
		requeue = again
		if err != nil || want == nil {
			return err
		}
		work.Status = *want
		return a.client.Status().Update(ctx, &work)
	})
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reporting on Work %s: %w", key, err)
	}
	return requeue, nil
}

// report is the status the member's agent gives work now, nil when the
// Work has it already or gets none (its member lost, the Work deleted),
// and when to come back (a proxy still applying), or zero.
func (a *loadAgent) report(key types.NamespacedName, work *workv1alpha1.Work) (*workv1alpha1.WorkStatus, time.Duration, error) {
	cluster, err := routework.ClusterOf(work)
	if err != nil {
		return nil, 0, nil
	}
	a.mu.Lock()
	m := a.members[cluster]
	lost := m == nil || m.lost
	a.mu.Unlock()
	if lost || !work.DeletionTimestamp.IsZero() {
		return nil, 0, nil
	}
	manifests, err := routework.DecodeAll(work)
	if err != nil {
		return nil, 0, err
	}
	route := manifests.Route
	// The member's ShardRoute follows the Work one update for one.
	route.Generation = work.Generation
	previous, err := routework.ReadStatus(work)
	if err != nil {
		return nil, 0, err
	}

	now := time.Now()
	a.mu.Lock()
	ps := a.proxies[key]
	if ps == nil {
		ps = &proxyState{}
		a.proxies[key] = ps
	}
	var requeue time.Duration
	switch {
	case ps.enforced == route.Spec.RulesHash:
	case ps.pending != route.Spec.RulesHash:
		ps.pending, ps.since = route.Spec.RulesHash, now
		requeue = a.proxyDelay
	case now.Sub(ps.since) >= a.proxyDelay:
		ps.enforced = route.Spec.RulesHash
	default:
		requeue = a.proxyDelay - now.Sub(ps.since)
	}
	if requeue == 0 && ps.enforced != route.Spec.RulesHash {
		ps.enforced = route.Spec.RulesHash
	}
	enforced := ps.enforced
	failed := map[string]bool{}
	for i := range a.pods {
		if a.failed[podKey(cluster, route.Namespace, podName(route.Name, i))] {
			failed[podName(route.Name, i)] = true
		}
	}
	a.mu.Unlock()

	route.Status = memberStatus(&previous.Route, route, a.pods, failed, enforced)
	manifest := routework.ManifestStatus(route)

	want := work.Status.DeepCopy()
	meta.SetStatusCondition(&want.Conditions, workApplied(work.Generation))
	want.ManifestStatuses = []workv1alpha1.ManifestStatus{manifest}
	if sameReport(work, want) {
		return nil, requeue, nil
	}
	return want, requeue, nil
}

// workApplied is the Applied condition a member's agent gives a Work it
// applied at generation, as Karmada's execution controller words it.
func workApplied(generation int64) metav1.Condition {
	return metav1.Condition{
		Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonWorkAppliedSuccessful,
		Message: "Manifest has been successfully applied", ObservedGeneration: generation,
	}
}

// sameReport reports whether the Work's status already says what want
// does, as the hub reads it.
func sameReport(work *workv1alpha1.Work, want *workv1alpha1.WorkStatus) bool {
	if !equality.Semantic.DeepEqual(work.Status.Conditions, want.Conditions) || len(work.Status.ManifestStatuses) != 1 {
		return false
	}
	got, err := routework.ReadStatus(work)
	if err != nil {
		return false
	}
	shadow := work.DeepCopy()
	shadow.Status = *want
	wanted, err := routework.ReadStatus(shadow)
	return err == nil && got.Health == wanted.Health && equality.Semantic.DeepEqual(got.Route, wanted.Route)
}

// memberStatus is the ShardRoute status a member's agent reports for route
// from previous: its candidate pods (podName 0 to pods-1) but the failed
// ones, each at an address of its own and enforcing the rules hash
// enforced, the first live pod of each shard its leader, and the agent's
// conditions.
func memberStatus(previous *ctrlmeshv1alpha1.ShardRouteStatus, route *ctrlmeshv1alpha1.ShardRoute, pods int, failed map[string]bool, enforced string) ctrlmeshv1alpha1.ShardRouteStatus {
	status := previous.DeepCopy()
	status.ObservedGeneration = route.Generation
	status.ObservedRoutingGeneration = route.Spec.RoutingGeneration
	shardOf := map[string]string{}
	status.Leaders = nil
	for _, shard := range route.Spec.Shards {
		led := false
		for _, p := range shard.Pods {
			shardOf[p.Name] = shard.ID
			if !led && !failed[p.Name] {
				status.Leaders = append(status.Leaders, ctrlmeshv1alpha1.ShardLeader{Shard: shard.ID, Pod: p.Name})
				led = true
			}
		}
	}
	status.Pods = nil
	for i := range pods {
		name := podName(route.Name, i)
		if failed[name] {
			continue
		}
		status.Pods = append(status.Pods, ctrlmeshv1alpha1.PodRouteStatus{
			Name: name, Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), Ready: true, Shard: shardOf[name], AppliedRulesHash: enforced,
		})
	}
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonRulesValid,
		Message: "the proxies can enforce the rules", ObservedGeneration: route.Generation,
	})
	proxies := metav1.Condition{Type: ctrlmeshv1alpha1.ConditionProxiesReady, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonProxiesApplied,
		Message: fmt.Sprintf("all %d candidate pods report rules %s", len(status.Pods), route.Spec.RulesHash), ObservedGeneration: route.Generation}
	if enforced != route.Spec.RulesHash {
		proxies.Status, proxies.Reason = metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonProxiesPending
		proxies.Message = fmt.Sprintf("%d of %d candidate pods do not report rules %s", len(status.Pods), len(status.Pods), route.Spec.RulesHash)
	}
	meta.SetStatusCondition(&status.Conditions, proxies)
	return *status
}
