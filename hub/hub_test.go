package hub_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ctrlmesh/ctrlmesh/agent"
	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
	"github.com/ctrlmesh/ctrlmesh/test/certs"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/golden"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

var members = []string{"member1", "member2"}

var update = flag.Bool("update", false, "rewrite deploy/rbac/hub.yaml from hub.RBAC")

// The static file is the rendering of RBAC for the namespace "ctrlmesh".
func TestRBACFile(t *testing.T) {
	want, err := hub.RenderRBAC("ctrlmesh")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("..", "deploy", "rbac", "hub.yaml"), want, *update,
		`RenderRBAC("ctrlmesh")`, "go test ./hub -run TestRBACFile -update")
}

func TestMain(m *testing.M) {
	// The components log to logr.Discard(); controller-runtime's own
	// fallback logger would otherwise complain that none was set.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// testFleet is a hub and two members, each member prepared for its agent.
type testFleet struct {
	hub     *env.Cluster
	members map[string]*env.Cluster
	// agentHub and agentMember are each member's agent credentials.
	agentHub, agentMember map[string]*rest.Config
	// hubIdentity has exactly the hub's shipped RBAC.
	hubIdentity *rest.Config
}

// startFleet starts the hub and the members, with the member API servers'
// feature gates.
func startFleet(t *testing.T, ctx context.Context, memberGates ...string) *testFleet {
	t.Helper()
	specs := []env.ClusterSpec{{Name: "hub"}}
	for _, m := range members {
		specs = append(specs, env.ClusterSpec{Name: m, FeatureGates: memberGates})
	}
	fleet, err := env.Start(ctx, env.Options{Clusters: specs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	})
	f := &testFleet{hub: fleet.Cluster("hub"), members: map[string]*env.Cluster{},
		agentHub: map[string]*rest.Config{}, agentMember: map[string]*rest.Config{}}
	if f.hubIdentity, err = localfleet.PrepareHub(ctx, f.hub, membership.AgentNamespace); err != nil {
		t.Fatal(err)
	}
	for _, name := range members {
		m := fleet.Cluster(name)
		f.members[name] = m
		if f.agentHub[name], f.agentMember[name], err = localfleet.PrepareAgent(ctx, f.hub, m, name, "ctrlmesh"); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// stopper runs a component until stopped; stop waits for it.
type stopper struct {
	once sync.Once
	stop func()
}

func (s *stopper) Stop() { s.once.Do(s.stop) }

func run(t *testing.T, ctx context.Context, what string, fn func(ctx context.Context) error) *stopper {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fn(runCtx) }()
	s := &stopper{stop: func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
		case <-time.After(time.Minute):
			t.Errorf("%s did not stop within a minute", what)
		}
	}}
	t.Cleanup(s.Stop)
	return s
}

// startAgent runs a member's agent in standalone mode with its shipped
// RBAC. Its heartbeat lasts two seconds.
func (f *testFleet) startAgent(t *testing.T, ctx context.Context, name string) *stopper {
	t.Helper()
	certDir := t.TempDir()
	caPEM, err := certs.WriteServing(certDir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	port := env.FreePort(t)
	return run(t, ctx, "agent "+name, func(ctx context.Context) error {
		return agent.Run(ctx, agent.Options{
			Member: f.agentMember[name], Hub: f.agentHub[name], ClusterName: name, Identity: "agent-0",
			LeaseDuration: 2 * time.Second, RenewInterval: 300 * time.Millisecond,
			ApplyWorks: true, Namespace: "ctrlmesh", LeaderElection: false, MetricsAddress: "0", HealthAddress: "0",
			Webhook: agent.WebhookOptions{Host: "127.0.0.1", Port: port, CertDir: certDir,
				ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d", port)), CABundle: caPEM}},
			Proxy: inject.Options{Image: "example.com/ctrlmesh-proxy:test"},
			Log:   logr.Discard(),
		})
	})
}

// startHub runs the hub with its shipped RBAC, accepting every member.
func (f *testFleet) startHub(t *testing.T, ctx context.Context) *stopper {
	t.Helper()
	return run(t, ctx, "hub", func(ctx context.Context) error {
		return hub.Run(ctx, hub.Options{Config: f.hubIdentity, AutoAccept: true, RulesValidity: testRulesValidity, MetricsAddress: "0", HealthAddress: "0", Log: logr.Discard()})
	})
}

// operatorPod is a "pod" of the operator: a ready Pod object in a member
// and its proxy, running here, which enforces the pod's rules and reports
// the rules hash it enforces; optionally the demo operator behind it, which
// elects its shard's leader through the proxy.
type operatorPod struct {
	cluster, namespace, name string
	proxy, operator          *stopper
	// crashed is set by kill: the operator's errors are then expected.
	crashed atomic.Bool
}

// testRulesValidity is the hub's validity of Fleet-scope rules: the shortest
// allowed, so that a lost member's buckets move soon.
const testRulesValidity = 5 * time.Second

// Leader election of the demo operators: short, so that a crashed pod's
// lease expires soon.
const (
	operatorLeaseDuration = 4 * time.Second
	operatorRenewDeadline = 3 * time.Second
	operatorRetryPeriod   = 500 * time.Millisecond
)

// startOperator runs the demo operator of p behind its proxy.
func (p *operatorPod) startOperator(t *testing.T, ctx context.Context, proxyAddr string) {
	t.Helper()
	p.operator = run(t, ctx, "operator "+p.name, func(ctx context.Context) error {
		err := operator.Run(ctx, operator.Options{
			Config: &rest.Config{Host: "http://" + proxyAddr}, PodName: p.name, LeaderElectionNamespace: p.namespace,
			LeaseDuration: operatorLeaseDuration, RenewDeadline: operatorRenewDeadline, RetryPeriod: operatorRetryPeriod,
			Logger: logr.Discard(),
		})
		if p.crashed.Load() {
			// Cut off from the API server, it lost its lease.
			return nil
		}
		return err
	})
}

func (f *testFleet) startPod(t *testing.T, ctx context.Context, cluster, namespace, app, name string, extraLabels ...string) *operatorPod {
	t.Helper()
	m := f.members[cluster]
	labels := map[string]string{"app": app}
	for i := 0; i+1 < len(extraLabels); i += 2 {
		labels[extraLabels[i]] = extraLabels[i+1]
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "operator", Image: "example.com/" + app}}},
	}
	env.Create(t, ctx, m.Client, pod)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := m.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	p := &operatorPod{cluster: cluster, namespace: namespace, name: name}
	serving := make(chan string, 1)
	p.proxy = run(t, ctx, "proxy "+name, func(ctx context.Context) error {
		return proxy.Run(ctx, proxy.Options{
			Upstream: m.Config, ListenAddress: "127.0.0.1:0", Pod: name,
			RulesNamespace: namespace, RulesName: app, Log: logr.Discard(),
			Ready: func(api, _, _ net.Addr) { serving <- api.String() },
		})
	})
	if withOperator[app] {
		select {
		case addr := <-serving:
			p.startOperator(t, ctx, addr)
		case <-time.After(time.Minute):
			t.Fatalf("the proxy of %s did not serve within a minute", name)
		}
	}
	return p
}

// withOperator lists the apps whose pods run the demo operator.
var withOperator = map[string]bool{"demo-op": true}

// kill crashes the pod: its proxy stops first, so that its operator cannot
// release its lease, then the operator; then its Pod object is deleted, as
// the kubelet does once the containers stopped.
func (f *testFleet) kill(t *testing.T, ctx context.Context, p *operatorPod) {
	t.Helper()
	p.crashed.Store(true)
	p.proxy.Stop()
	if p.operator != nil {
		p.operator.Stop()
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.namespace, Name: p.name}}
	if err := f.members[p.cluster].Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
}

func shardingConfig(namespace, name string, scope ctrlmeshv1alpha1.ShardingScope) *ctrlmeshv1alpha1.ShardingConfig {
	return &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
			}}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: members},
			Scope:    scope,
		},
	}
}

// placementOf waits until sc is Ready with shards shards, and returns, per
// cluster, the buckets each pod serves.
func (f *testFleet) waitReady(t *testing.T, ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig, shards int32, within time.Duration) map[string]map[string]sharding.Set {
	t.Helper()
	var got ctrlmeshv1alpha1.ShardingConfig
	env.Eventually(t, within, fmt.Sprintf("ShardingConfig %s Ready with %d shards", sc.Name, shards), func() error {
		if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
			return err
		}
		ready := meta.FindStatusCondition(got.Status.Conditions, ctrlmeshv1alpha1.ConditionReady)
		if ready == nil || ready.Status != metav1.ConditionTrue || got.Status.Shards != shards || got.Status.ReadyShards != shards || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
	space := sharding.MustSpace(int(got.Spec.Sharding.Buckets))
	out := map[string]map[string]sharding.Set{}
	for _, p := range got.Status.Placement {
		set, err := space.ParseSet(p.Buckets)
		if err != nil {
			t.Fatal(err)
		}
		if out[p.Cluster] == nil {
			out[p.Cluster] = map[string]sharding.Set{}
		}
		for _, pod := range p.Pods {
			out[p.Cluster][pod] = set
		}
	}
	return out
}

// routeVersion is a version of a ShardRoute and when the watch brought it.
type routeVersion struct {
	at    time.Time
	route ctrlmeshv1alpha1.ShardRoute
}

// routeVersions records every version of a member's ShardRoute, from a watch.
func routeVersions(t *testing.T, ctx context.Context, m *env.Cluster, namespace, name string) func() []routeVersion {
	t.Helper()
	wc, err := client.NewWithWatch(m.Config, client.Options{Scheme: m.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &ctrlmeshv1alpha1.ShardRouteList{}, client.InNamespace(namespace))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []routeVersion
	go func() {
		for ev := range w.ResultChan() {
			if r, ok := ev.Object.(*ctrlmeshv1alpha1.ShardRoute); ok && r.Name == name && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				mu.Lock()
				seen = append(seen, routeVersion{at: time.Now(), route: *r})
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(w.Stop)
	return func() []routeVersion {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// TestPerClusterPlacement: two members with two operator pods each; the
// hub places a PerCluster ShardingConfig, survives a restart without moving
// a bucket, moves at most ideal + 1 buckets to an added pod, each revoked
// before it is granted, and moves a killed pod's buckets to the others.
func TestPerClusterPlacement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	f := startFleet(t, ctx)
	for _, m := range members {
		env.Create(t, ctx, f.members[m].Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ops"}})
		f.startAgent(t, ctx, m)
	}
	env.Create(t, ctx, f.hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ops"}})
	hubRun := f.startHub(t, ctx)
	pods := map[string]*operatorPod{}
	for _, m := range members {
		for i := range 2 {
			name := fmt.Sprintf("demo-op-%d", i)
			pods[m+"/"+name] = f.startPod(t, ctx, m, "ops", "demo-op", name)
		}
	}
	sc := shardingConfig("ops", "demo-op", ctrlmeshv1alpha1.ScopePerCluster)
	sc.Spec.Controller = &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: operator.DefaultLeaderElectionID}
	env.Create(t, ctx, f.hub.Client, sc)
	before := f.waitReady(t, ctx, sc, 4, 90*time.Second)
	for _, m := range members {
		checkPartition(t, before[m], 32)
	}

	// A restarted hub rebuilds its state and moves nothing.
	generation := func(cluster string) int64 {
		var r ctrlmeshv1alpha1.ShardRoute
		if err := f.members[cluster].Client.Get(ctx, client.ObjectKey{Namespace: "ops", Name: "demo-op"}, &r); err != nil {
			t.Fatal(err)
		}
		return r.Spec.RoutingGeneration
	}
	generations := map[string]int64{}
	for _, m := range members {
		generations[m] = generation(m)
	}
	hubRun.Stop()
	f.startHub(t, ctx)
	time.Sleep(5 * time.Second)
	afterRestart := f.waitReady(t, ctx, sc, 4, 30*time.Second)
	for _, m := range members {
		if g := generation(m); g != generations[m] {
			t.Errorf("%s: the restarted hub published generation %d over %d", m, g, generations[m])
		}
		if !samePlacement(before[m], afterRestart[m]) {
			t.Errorf("%s: placement changed over a hub restart: %v -> %v", m, before[m], afterRestart[m])
		}
	}

	// A spec change that moves no bucket is a new generation all the same,
	// which the proxies acknowledge.
	var edited ctrlmeshv1alpha1.ShardingConfig
	if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &edited); err != nil {
		t.Fatal(err)
	}
	edited.Spec.Limits[0].RelateResources[0].Resources = []string{"configmaps", "secrets"}
	if err := f.hub.Client.Update(ctx, &edited); err != nil {
		t.Fatal(err)
	}
	afterEdit := f.waitReady(t, ctx, &edited, 4, 60*time.Second)
	for _, m := range members {
		if g := generation(m); g != generations[m]+1 {
			t.Errorf("%s: the edited spec was published as generation %d, want %d", m, g, generations[m]+1)
		}
		if !samePlacement(before[m], afterEdit[m]) {
			t.Errorf("%s: placement changed with a spec edit that moves nothing: %v -> %v", m, before[m], afterEdit[m])
		}
	}

	// An added pod takes at most ideal + 1 buckets, each revoked first.
	versions := routeVersions(t, ctx, f.members["member1"], "ops", "demo-op")
	pods["member1/demo-op-2"] = f.startPod(t, ctx, "member1", "ops", "demo-op", "demo-op-2")
	grown := f.waitReady(t, ctx, sc, 5, 60*time.Second)
	checkPartition(t, grown["member1"], 32)
	moved := grown["member1"]["demo-op-2"]
	ideal := 32 / 3
	if moved.Len() > ideal+1 {
		t.Errorf("the added pod took %d buckets (%s), more than ideal %d + 1", moved.Len(), moved, ideal)
	}
	checkRevokedBeforeGranted(t, versions(), "demo-op-2", moved)
	t.Logf("added pod: %d buckets moved (ideal %d), %d rule versions seen", moved.Len(), ideal, len(versions()))

	// A crashed pod's buckets move to the others once its shard lease has
	// expired, and not before: within the lease duration and a few seconds.
	shard := f.shardOf(t, ctx, sc, "member1", "demo-op-0")
	lost := grown["member1"]["demo-op-0"]
	versions = routeVersions(t, ctx, f.members["member1"], "ops", "demo-op")
	start := time.Now()
	f.kill(t, ctx, pods["member1/demo-op-0"])
	var lease coordinationv1.Lease
	if err := f.members["member1"].Client.Get(ctx, client.ObjectKey{Namespace: "ops", Name: ctrlmeshv1alpha1.ShardLockName(operator.DefaultLeaderElectionID, shard)}, &lease); err != nil {
		t.Fatal(err)
	}
	expiry := lease.Spec.RenewTime.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second)
	healed := f.waitReady(t, ctx, sc, 4, operatorLeaseDuration+20*time.Second)
	checkPartition(t, healed["member1"], 32)
	if _, ok := healed["member1"]["demo-op-0"]; ok {
		t.Error("the killed pod still serves buckets")
	}
	granted := firstGrant(t, versions(), shard, lost)
	if granted.Before(expiry) {
		t.Errorf("shard %s's buckets %s were granted elsewhere at %v, before its lease expired at %v", shard, lost, granted, expiry)
	}
	t.Logf("failover after a pod crash: buckets granted %v after the crash, %v after its lease expired (operator lease %v)",
		granted.Sub(start), granted.Sub(expiry), operatorLeaseDuration)
}

// shardOf is the shard whose pods include pod, in the hub's status.
func (f *testFleet) shardOf(t *testing.T, ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig, cluster, pod string) string {
	t.Helper()
	var got ctrlmeshv1alpha1.ShardingConfig
	if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
		t.Fatal(err)
	}
	for _, p := range got.Status.Placement {
		if p.Cluster == cluster && slices.Contains(p.Pods, pod) {
			return p.Shard
		}
	}
	t.Fatalf("no shard of %s/%s in %+v", cluster, pod, got.Status.Placement)
	return ""
}

// firstGrant is when the member first received rules in which another
// shard than shard serves some of buckets.
func firstGrant(t *testing.T, versions []routeVersion, shard string, buckets sharding.Set) time.Time {
	t.Helper()
	for _, v := range versions {
		for _, s := range v.route.Spec.Shards {
			served, err := buckets.Space().ParseSet(s.Buckets)
			if err != nil {
				t.Fatal(err)
			}
			if s.ID != shard && !served.Intersection(buckets).IsEmpty() {
				return v.at
			}
		}
	}
	t.Fatalf("no rules version granted %s elsewhere (%d versions)", buckets, len(versions))
	return time.Time{}
}

// TestCanarySteps: a canary pod gets exactly what the canary step names —
// buckets and single namespaces, which no other shard serves — and the hub
// moves to the next step once the canary shard has been healthy for
// minHealthySeconds. Buckets plus single namespaces need range mode.
func TestCanarySteps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	f := startFleet(t, ctx, env.FeatureShardedListAndWatch)
	env.Create(t, ctx, f.members["member1"].Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "canary-ops"}})
	f.startAgent(t, ctx, "member1")
	env.Create(t, ctx, f.hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "canary-ops"}})
	f.startHub(t, ctx)
	f.startPod(t, ctx, "member1", "canary-ops", "canary-op", "canary-op-0")
	f.startPod(t, ctx, "member1", "canary-ops", "canary-op", "canary-op-1")
	f.startPod(t, ctx, "member1", "canary-ops", "canary-op", "canary-op-new", "track", "canary")
	sc := shardingConfig("canary-ops", "canary-op", ctrlmeshv1alpha1.ScopePerCluster)
	sc.Spec.Clusters.Names = []string{"member1"}
	sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
		Selector:          metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
		Steps:             []ctrlmeshv1alpha1.CanaryStep{{Buckets: "0-3"}, {Buckets: "0-7", Namespaces: []string{"team-x"}}},
		MinHealthySeconds: 2,
	}
	env.Create(t, ctx, f.hub.Client, sc)

	var got ctrlmeshv1alpha1.ShardingConfig
	env.Eventually(t, 90*time.Second, "the canary reaches its last step, Ready", func() error {
		if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
			return err
		}
		if got.Status.Canary == nil || got.Status.Canary.Step != 1 || !meta.IsStatusConditionTrue(got.Status.Conditions, ctrlmeshv1alpha1.ConditionReady) {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
	space := sharding.MustSpace(32)
	byPod := map[string]sharding.Set{}
	for _, p := range got.Status.Placement {
		set, err := space.ParseSet(p.Buckets)
		if err != nil {
			t.Fatal(err)
		}
		if p.Canary {
			if p.Buckets != "0-7" || !slices.Equal(p.Namespaces, []string{"team-x"}) || !slices.Equal(p.Pods, []string{"canary-op-new"}) {
				t.Errorf("canary shard %+v, want canary-op-new serving exactly 0-7 and team-x", p)
			}
		} else if len(p.Namespaces) > 0 {
			t.Errorf("shard %s serves single namespaces %v", p.Shard, p.Namespaces)
		}
		for _, pod := range p.Pods {
			byPod[pod] = set
		}
	}
	checkPartition(t, byPod, 32)

	// Deleting the ShardingConfig deletes its Works, and the agent the
	// member's rules, before the finalizer lets it go.
	if err := f.hub.Client.Delete(ctx, sc); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the ShardingConfig, its Work and its ShardRoute are gone", func() error {
		if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &ctrlmeshv1alpha1.ShardingConfig{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("ShardingConfig: %v", err)
		}
		var works workv1alpha1.WorkList
		if err := f.hub.Client.List(ctx, &works, client.InNamespace(names.GenerateExecutionSpaceName("member1"))); err != nil {
			return err
		}
		if len(works.Items) > 0 {
			return fmt.Errorf("%d Works left", len(works.Items))
		}
		err := f.members["member1"].Client.Get(ctx, client.ObjectKeyFromObject(sc), &ctrlmeshv1alpha1.ShardRoute{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("ShardRoute: %v", err)
		}
		return nil
	})
}

// TestFleetFailover: in Fleet scope one set of buckets spans both members;
// when member2's agent stops, its heartbeat expires and member1's pods take
// every bucket.
func TestFleetFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := startFleet(t, ctx)
	agents := map[string]*stopper{}
	for _, m := range members {
		env.Create(t, ctx, f.members[m].Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fleet-ops"}})
		agents[m] = f.startAgent(t, ctx, m)
		f.startPod(t, ctx, m, "fleet-ops", "fleet-op", "fleet-op-0")
	}
	env.Create(t, ctx, f.hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fleet-ops"}})
	f.startHub(t, ctx)
	sc := shardingConfig("fleet-ops", "fleet-op", ctrlmeshv1alpha1.ScopeFleet)
	env.Create(t, ctx, f.hub.Client, sc)
	before := f.waitReady(t, ctx, sc, 2, 90*time.Second)
	all := map[string]sharding.Set{}
	for _, m := range members {
		if len(before[m]) != 1 {
			t.Fatalf("%s serves %v; want one pod of the fleet's two shards", m, before[m])
		}
		for pod, set := range before[m] {
			all[m+"/"+pod] = set
		}
	}
	checkPartition(t, all, 32)

	start := time.Now()
	agents["member2"].Stop()
	var got ctrlmeshv1alpha1.ShardingConfig
	env.Eventually(t, 30*time.Second, "member1 serves every bucket", func() error {
		if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
			return err
		}
		for _, p := range got.Status.Placement {
			if p.Cluster == "member1" && p.Buckets == "0-31" && p.State == ctrlmeshv1alpha1.ShardServing {
				return nil
			}
		}
		return fmt.Errorf("placement %+v", got.Status.Placement)
	})
	t.Logf("failover after member2's agent stopped (heartbeat 2 s): %v", time.Since(start))
	degraded := meta.FindStatusCondition(got.Status.Conditions, ctrlmeshv1alpha1.ConditionDegraded)
	if degraded == nil || degraded.Reason != ctrlmeshv1alpha1.ReasonClusterUnavailable {
		t.Errorf("Degraded = %+v, want reason %s", degraded, ctrlmeshv1alpha1.ReasonClusterUnavailable)
	}
}

// checkPartition: the pods' bucket sets are disjoint and cover every bucket
// (pods of one shard share theirs).
func checkPartition(t *testing.T, byPod map[string]sharding.Set, buckets int) {
	t.Helper()
	owner := make([]string, buckets)
	for pod, set := range byPod {
		for _, b := range set.Buckets() {
			if owner[b] != "" {
				t.Errorf("bucket %d is served by %s and %s", b, owner[b], pod)
			}
			owner[b] = pod
		}
	}
	for b, o := range owner {
		if o == "" {
			t.Errorf("bucket %d is served by no pod (%v)", b, byPod)
		}
	}
}

func samePlacement(a, b map[string]sharding.Set) bool {
	if len(a) != len(b) {
		return false
	}
	for pod, set := range a {
		if other, ok := b[pod]; !ok || !other.Equal(set) {
			return false
		}
	}
	return true
}

// checkRevokedBeforeGranted: in the rule versions the member received, the
// buckets granted to pod were, in an earlier version, pending for its shard
// and served by no shard.
func checkRevokedBeforeGranted(t *testing.T, versions []routeVersion, pod string, granted sharding.Set) {
	t.Helper()
	space := granted.Space()
	for _, rv := range versions {
		v := rv.route
		for _, s := range v.Spec.Shards {
			if !slices.ContainsFunc(s.Pods, func(p ctrlmeshv1alpha1.RoutePod) bool { return p.Name == pod }) {
				continue
			}
			pending, err := space.ParseSet(s.PendingBuckets)
			if err != nil {
				t.Fatal(err)
			}
			if !pending.Intersection(granted).Equal(granted) {
				continue
			}
			for _, other := range v.Spec.Shards {
				served, err := space.ParseSet(other.Buckets)
				if err != nil {
					t.Fatal(err)
				}
				if !served.Intersection(granted).IsEmpty() {
					t.Errorf("generation %d: buckets %s pending for %s are still served by shard %s", v.Spec.RoutingGeneration, granted, pod, other.ID)
				}
			}
			return
		}
	}
	t.Errorf("no rule version had %s pending for %s before granting them (%d versions)", granted, pod, len(versions))
}

// TestRecreateAndReselect: deleting a ShardingConfig and creating it again
// (what the hub's own message advises to change its bucket count), and
// deselecting a member and selecting it again, leave no bucket pending: the
// config is Ready again without a hub restart.
func TestRecreateAndReselect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := startFleet(t, ctx)
	for _, m := range members {
		env.Create(t, ctx, f.members[m].Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "again-ops"}})
		f.startAgent(t, ctx, m)
		f.startPod(t, ctx, m, "again-ops", "again-op", "again-op-0")
	}
	env.Create(t, ctx, f.hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "again-ops"}})
	f.startHub(t, ctx)
	sc := shardingConfig("again-ops", "again-op", ctrlmeshv1alpha1.ScopePerCluster)
	env.Create(t, ctx, f.hub.Client, sc.DeepCopy())
	f.waitReady(t, ctx, sc, 2, 90*time.Second)
	for _, m := range members {
		f.waitLabelerRights(t, ctx, sc, m, "configmaps")
	}

	// Deleted and created again: the labeler's rights go with it.
	if err := f.hub.Client.Delete(ctx, sc.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		f.waitLabelerRights(t, ctx, sc, m)
	}
	env.Eventually(t, 30*time.Second, "the ShardingConfig is gone", func() error {
		err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &ctrlmeshv1alpha1.ShardingConfig{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
	env.Create(t, ctx, f.hub.Client, sc.DeepCopy())
	f.waitReady(t, ctx, sc, 2, 60*time.Second)

	// member2 deselected, then selected again.
	setClusters := func(names ...string) {
		t.Helper()
		var current ctrlmeshv1alpha1.ShardingConfig
		if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &current); err != nil {
			t.Fatal(err)
		}
		current.Spec.Clusters.Names = names
		if err := f.hub.Client.Update(ctx, &current); err != nil {
			t.Fatal(err)
		}
	}
	setClusters("member1")
	f.waitReady(t, ctx, sc, 1, 60*time.Second)
	f.waitLabelerRights(t, ctx, sc, "member2")
	setClusters(members...)
	f.waitReady(t, ctx, sc, 2, 60*time.Second)

	// A limit on Secrets: the rights follow, in every member.
	var current ctrlmeshv1alpha1.ShardingConfig
	if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &current); err != nil {
		t.Fatal(err)
	}
	current.Spec.Limits[0].RelateResources[0].Resources = []string{"configmaps", "secrets"}
	if err := f.hub.Client.Update(ctx, &current); err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		f.waitLabelerRights(t, ctx, sc, m, "configmaps", "secrets")
	}
}

// waitLabelerRights waits until the agent of cluster may list exactly the
// core resources of resources among ConfigMaps and Secrets, by the labeler
// ClusterRole of sc that the hub's Work brought (none when resources is
// empty), and the role names exactly those.
func (f *testFleet) waitLabelerRights(t *testing.T, ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig, cluster string, resources ...string) {
	t.Helper()
	asAgent, err := kubernetes.NewForConfig(f.agentMember[cluster])
	if err != nil {
		t.Fatal(err)
	}
	name := ctrlmeshv1alpha1.LabelerRBACName(sc.Namespace, sc.Name)
	env.Eventually(t, 60*time.Second, fmt.Sprintf("the labeler in %s may list exactly %v", cluster, resources), func() error {
		var role rbacv1.ClusterRole
		err := f.members[cluster].Client.Get(ctx, client.ObjectKey{Name: name}, &role)
		switch {
		case len(resources) == 0 && !apierrors.IsNotFound(err):
			return fmt.Errorf("ClusterRole %s: %v", name, err)
		case len(resources) > 0 && err != nil:
			return err
		case len(resources) > 0 && (len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, resources)):
			return fmt.Errorf("ClusterRole %s rules %+v", name, role.Rules)
		}
		for _, resource := range []string{"configmaps", "secrets"} {
			_, err := asAgent.CoreV1().RESTClient().Get().Resource(resource).Param("limit", "1").DoRaw(ctx)
			if want := slices.Contains(resources, resource); want != (err == nil) || (err != nil && !apierrors.IsForbidden(err)) {
				return fmt.Errorf("listing %s as the agent: %v", resource, err)
			}
		}
		return nil
	})
}

// TestFleetDeselectionRevokesFirst: a member deselected from a Fleet-scope
// ShardingConfig while its pods run loses its buckets as in any move: its
// Work first gives its pods no shard, and only once their proxies enforce
// that do the other member's pods get the buckets; then its Work is
// deleted. Pruning its Work at once would leave its pods serving their
// buckets (until their ShardRoute is deleted, or for good where its agent
// cannot delete it) while the other member's pods already serve them.
func TestFleetDeselectionRevokesFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := startFleet(t, ctx)
	for _, m := range members {
		env.Create(t, ctx, f.members[m].Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "leave-ops"}})
		f.startAgent(t, ctx, m)
		f.startPod(t, ctx, m, "leave-ops", "leave-op", "leave-op-0")
	}
	env.Create(t, ctx, f.hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "leave-ops"}})
	f.startHub(t, ctx)
	sc := shardingConfig("leave-ops", "leave-op", ctrlmeshv1alpha1.ScopeFleet)
	env.Create(t, ctx, f.hub.Client, sc.DeepCopy())
	before := f.waitReady(t, ctx, sc, 2, 90*time.Second)
	leaving := before["member2"]["leave-op-0"]
	if leaving.IsEmpty() {
		t.Fatalf("member2's pod serves nothing before the deselection: %v", before)
	}
	leavingShard := f.shardOf(t, ctx, sc, "member2", "leave-op-0")
	member1Versions := routeVersions(t, ctx, f.members["member1"], "leave-ops", "leave-op")
	member2Versions := routeVersions(t, ctx, f.members["member2"], "leave-ops", "leave-op")

	var current ctrlmeshv1alpha1.ShardingConfig
	if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &current); err != nil {
		t.Fatal(err)
	}
	current.Spec.Clusters.Names = []string{"member1"}
	if err := f.hub.Client.Update(ctx, &current); err != nil {
		t.Fatal(err)
	}
	after := f.waitReady(t, ctx, sc, 1, 60*time.Second)
	if got := after["member1"]["leave-op-0"]; got.Len() != 32 {
		t.Fatalf("member1's pod serves %v after the deselection, want every bucket", got)
	}
	env.Eventually(t, 30*time.Second, "member2's ShardRoute deleted with its Work", func() error {
		err := f.members["member2"].Client.Get(ctx, client.ObjectKeyFromObject(sc), &ctrlmeshv1alpha1.ShardRoute{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})

	// When member2's proxy reported enforcing rules that give its pod no
	// shard.
	var letGo time.Time
	for _, v := range member2Versions() {
		inShard := slices.ContainsFunc(v.route.Spec.Shards, func(s ctrlmeshv1alpha1.RouteShard) bool { return len(s.Pods) > 0 })
		acked := slices.ContainsFunc(v.route.Status.Pods, func(p ctrlmeshv1alpha1.PodRouteStatus) bool {
			return p.Name == "leave-op-0" && p.AppliedRulesHash == v.route.Spec.RulesHash
		})
		if !inShard && acked {
			letGo = v.at
			break
		}
	}
	if letGo.IsZero() {
		t.Fatalf("member2's pod never enforced rules without a shard before its ShardRoute went (%d versions)", len(member2Versions()))
	}
	if granted := firstGrant(t, member1Versions(), leavingShard, leaving); granted.Before(letGo) {
		t.Errorf("member1 got member2's buckets %s at %s, before member2's pod let them go at %s", leaving, granted.Format(time.StampMilli), letGo.Format(time.StampMilli))
	}
}
