package realpods_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/fleettest"
	"github.com/ctrlmesh/ctrlmesh/test/images"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// operatorImageV2 is the demo operator built with another version: the
// new image of the rolling update.
const operatorImageV2 = "ctrlmesh.test/demo-operator:v2"

// The demo operator of TestNoDoubleReconcileOnRealPods: its Deployment,
// ServiceAccount and ShardingConfig (on the hub) are named shardedName, in
// shardedNamespace.
const (
	shardedNamespace = "operators"
	shardedName      = "demo-operator"
)

// Bounds of TestNoDoubleReconcileOnRealPods's waits. They are the test's
// patience on a loaded 2-core machine, not goals: a pod's start (the
// kubelet, the sidecar's startup probe, the agent's report, the hub's
// placement, the shard lease of a pod that left expiring) takes seconds to
// tens of seconds there; the measured times are logged and in the README.
const (
	// settleWithin bounds each step's wait until the ShardingConfig is
	// Ready again with the Deployment's pods placed.
	settleWithin = 4 * time.Minute
	// servedWithin bounds, from then, the wait until every object has been
	// reconciled by its owner since the step began: the writer touches
	// every object within 8 s, and a shard's new owner lists all of its
	// objects when it starts serving.
	servedWithin = time.Minute
	// kubeletDown is how long the kubelet stays stopped.
	kubeletDown = 5 * time.Second
)

// realMember is a member cluster of TestNoDoubleReconcileOnRealPods, in
// one selector mode.
type realMember struct {
	name, mode string
	gates      []string
	cluster    *env.Cluster
}

// TestNoDoubleReconcileOnRealPods is test/e2e's no-double-reconcile test on
// real pods: a hub (in this process, on a hub cluster with a node so that
// the members' pods reach its API server) and two members with real nodes,
// member1 in range mode (KEP-5866 in its API server) and member2 in label
// mode, each with the agent installed by its chart and the demo operator
// as a Deployment that asks for the proxy (injected by the agent, started
// by the kubelet, running as its own ServiceAccount), each pod recording
// every reconcile in a file on the node. A ShardingConfig on the hub shards
// both; while a writer keeps the 400 ConfigMaps changing, the test scales
// the Deployments up and down, deletes a pod, rolls the operator's image
// and restarts the kubelets. After each step the ShardingConfig is Ready
// again with exactly the Deployment's current pods placed, every object is
// reconciled by its owner, and no object has been reconciled by two pods
// at once, ever.
func TestNoDoubleReconcileOnRealPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	helm := helmBinary(t, root)
	members := []*realMember{
		{name: fleettest.Member1, mode: "range", gates: []string{env.FeatureShardedListAndWatch}},
		{name: fleettest.Member2, mode: "label"},
	}
	start := time.Now()
	logf := func(format string, args ...any) {
		t.Helper()
		t.Logf("[%5.1fs] "+format, append([]any{time.Since(start).Seconds()}, args...)...)
	}
	specs := []env.ClusterSpec{{Name: "hub", Node: true}}
	for _, m := range members {
		specs = append(specs, env.ClusterSpec{Name: m.name, Node: true, FeatureGates: m.gates})
	}
	fleet, err := env.Start(ctx, env.Options{Clusters: specs})
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer: the hub (runHub's cleanup, which runs first)
	// stops before its API server does.
	t.Cleanup(func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	})
	hubCluster := fleet.Cluster("hub")
	for _, m := range members {
		m.cluster = fleet.Cluster(m.name)
	}
	logf("hub, %s (range mode) and %s (label mode) with their nodes started", members[0].name, members[1].name)

	imgs := buildImages(t, ctx, root)
	for _, m := range members {
		if err := m.cluster.Node.ImportImages(ctx, imgs...); err != nil {
			t.Fatal(err)
		}
	}
	logf("images built and imported into the members' nodes")

	// The hub, with its shipped RBAC only, accepting the members that join.
	workDir, err := os.MkdirTemp("", "ctrlmesh-realpods-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the hub's log and the pods' records kept in %s", workDir)
			return
		}
		_ = os.RemoveAll(workDir)
	})
	runHub(t, ctx, hubCluster, filepath.Join(workDir, "hub.log"))

	// Each member: the agent by its chart, the operator's ServiceAccount
	// and RBAC, and the managed objects.
	var objects []fleettest.ClusterObjects
	for _, m := range members {
		installAgent(t, ctx, helm, root, hubCluster, m.cluster, m.name, 1)
		for _, o := range operatorRBAC(t, root, shardedNamespace, shardedName) {
			env.Create(t, ctx, m.cluster.Client, o)
		}
		objects = append(objects, fleettest.ClusterObjects{Cluster: m.name, Client: m.cluster.Client,
			Keys: fleettest.ManagedObjects(t, ctx, m.cluster.Client)})
	}
	logf("agents installed by their chart; %d managed ConfigMaps in each member", len(objects[0].Keys))

	// The ShardingConfig on the hub; the agents apply its ShardRoutes, and
	// the Deployments then get the proxy injected.
	sc := localfleet.ShardingConfig(shardedNamespace, shardedName, []string{members[0].name, members[1].name})
	env.Create(t, ctx, hubCluster.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: shardedNamespace}})
	env.Create(t, ctx, hubCluster.Client, sc)
	for _, m := range members {
		env.Eventually(t, 3*time.Minute, m.name+": the ShardRoute applied by the agent", func() error {
			var route ctrlmeshv1alpha1.ShardRoute
			return m.cluster.Client.Get(ctx, client.ObjectKeyFromObject(sc), &route)
		})
	}
	recordDir := filepath.Join(workDir, "records")
	if err := os.Mkdir(recordDir, 0o755); err != nil {
		t.Fatal(err)
	}
	deployed := time.Now()
	for _, m := range members {
		env.Create(t, ctx, m.cluster.Client, operatorDeployment(m.name, recordDir))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range members {
				t.Logf("%s: the operator's pods:\n%s", m.name, podLogs(m.cluster.Node, shardedNamespace))
			}
		}
	})

	r := &run{t: t, ctx: ctx, hub: hubCluster.Client, key: client.ObjectKeyFromObject(sc), members: members, objects: objects, recordDir: recordDir, logf: logf}
	r.step("initial placement", deployed, nil)
	r.checkCredentials()
	touching := fleettest.StartTouching(ctx, objects)
	defer touching.Stop()

	r.step("scale up (2 to 3)", time.Now(), func(m *realMember) error { return r.scale(m, 3) })
	r.step("scale down (3 to 2)", time.Now(), func(m *realMember) error { return r.scale(m, 2) })
	r.step("pod deleted", time.Now(), r.deletePod)
	// A proxy restarted alone: its operator runs on with the kubeconfig it
	// read at its start and the informers the proxy before served. Every
	// object reconciled by its owner after the restart shows the operator
	// served again (the client token kept) without a double reconcile.
	restarts := r.containerRestarts()
	killed := r.killProxies()
	r.step("proxy restarted", time.Now(), nil)
	for key, n := range r.containerRestarts() {
		want := restarts[key]
		if killed[key] {
			want++
		}
		if n != want {
			t.Errorf("%s restarted %d times over the proxies' restart, want %d", key, n, want)
		}
	}
	r.step("rolling update", time.Now(), func(m *realMember) error { return r.setImage(m, operatorImageV2) })
	before := r.current
	restarts = r.containerRestarts()
	r.step("kubelet restart", time.Now(), r.restartKubelet)
	// The pods ran on: the same pods serve the same buckets, and the
	// kubelet that took them over restarted none of their containers.
	if fleettest.Placement(before) != fleettest.Placement(r.current) {
		t.Errorf("the placement changed over the kubelet restarts:\n%s\nto\n%s", fleettest.Placement(before), fleettest.Placement(r.current))
	}
	if got := r.containerRestarts(); !maps.Equal(got, restarts) {
		t.Errorf("containers restarted over the kubelet restarts: before %v, after %v", restarts, got)
	}

	r.checkShardLocks()

	time.Sleep(2 * time.Second)
	touches := touching.Stop()
	r.checkOverlaps("end")
	logf("writer touches: %d", touches)
	r.report()
}

// helmBinary is the helm of 'make tools'.
func helmBinary(t *testing.T, root string) string {
	t.Helper()
	helm := filepath.Join(root, "bin", "helm")
	if dir := os.Getenv(env.AssetsEnv); dir != "" {
		helm = filepath.Join(dir, "helm")
	}
	if err := controlplane.CheckBinaries(filepath.Dir(helm), "run 'make tools' to build it from source", "helm"); err != nil {
		t.Fatal(err)
	}
	return helm
}

// buildImages builds the images of the agent, the proxy and the demo
// operator, the latter twice: as operatorImage and, with another version,
// as operatorImageV2.
func buildImages(t *testing.T, ctx context.Context, root string) []images.Image {
	t.Helper()
	var imgs []images.Image
	for _, img := range []struct {
		name, pkg, version, user string
	}{
		{agentImage, "./cmd/ctrlmesh-agent", "", ""},
		{proxyImage, "./cmd/ctrlmesh-proxy", "", "65532"},
		{operatorImage, "./scenarios/demo-operator", "", ""},
		{operatorImageV2, "./scenarios/demo-operator", "v2", ""},
	} {
		file := "/" + filepath.Base(img.pkg)
		bin := filepath.Join(t.TempDir(), filepath.Base(img.pkg))
		if err := images.BuildStaticVersion(ctx, root, img.pkg, bin, img.version); err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, images.Image{Name: img.name, Files: map[string]string{file: bin}, Entrypoint: []string{file}, User: img.user})
	}
	return imgs
}

// runHub runs the hub in this process until the test ends, with the hub's
// shipped RBAC only (localfleet.PrepareHub), accepting every member that
// joins, logging to logPath.
func runHub(t *testing.T, ctx context.Context, hubCluster *env.Cluster, logPath string) {
	t.Helper()
	identity, err := localfleet.PrepareHub(ctx, hubCluster, membership.AgentNamespace)
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	hubCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- hub.Run(hubCtx, hub.Options{Config: identity, AutoAccept: true, MetricsAddress: "0", HealthAddress: "0",
			Log: zap.New(zap.WriteTo(logFile))})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("the hub: %v", err)
		}
		_ = logFile.Close()
	})
}

// operatorDeployment is the demo operator's Deployment in cluster, two
// replicas asking for the proxy, each recording its reconciles into
// recordDir on the node (<cluster>--<pod>.jsonl), with the leader-election
// timing of the local fleet's operators.
func operatorDeployment(cluster, recordDir string) *appsv1.Deployment {
	selector := map[string]string{"app": shardedName}
	fieldEnv := func(name, field string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: field}}}
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: shardedNamespace, Name: shardedName},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": shardedName, ctrlmeshv1alpha1.EnableProxyLabel: "true"}},
				Spec: corev1.PodSpec{
					ServiceAccountName: shardedName,
					Containers: []corev1.Container{{
						Name: "manager", Image: operatorImage, ImagePullPolicy: corev1.PullNever,
						Args: []string{"--webhook-port=0", "--metrics-addr=0", "--health-addr=:8081",
							"--record-file=/records/" + cluster + "--$(POD_NAME).jsonl", "--reconcile-delay=20ms",
							"--lease-duration=" + localfleet.OperatorLeaseDuration.String(), "--renew-deadline=6s", "--retry-period=1s"},
						Env:          []corev1.EnvVar{fieldEnv("POD_NAME", "metadata.name"), fieldEnv("POD_NAMESPACE", "metadata.namespace")},
						VolumeMounts: []corev1.VolumeMount{{Name: "records", MountPath: "/records"}},
					}},
					Volumes: []corev1.Volume{{Name: "records", VolumeSource: corev1.VolumeSource{
						HostPath: &corev1.HostPathVolumeSource{Path: recordDir, Type: ptr.To(corev1.HostPathDirectory)}}}},
				},
			},
		},
	}
}

// run is the state of TestNoDoubleReconcileOnRealPods's steps.
type run struct {
	t         *testing.T
	ctx       context.Context
	hub       client.Client
	key       client.ObjectKey
	members   []*realMember
	objects   []fleettest.ClusterObjects
	recordDir string
	logf      func(string, ...any)
	// current is the ShardingConfig after the last step.
	current *ctrlmeshv1alpha1.ShardingConfig
	results []stepResult
}

// stepResult is what a step measured in one member.
type stepResult struct {
	step, member, mode string
	// ready: from the step's start until the ShardingConfig was Ready with
	// the member's current pods placed; served: until every object of the
	// member had been reconciled by its owner since the start.
	ready, served time.Duration
	overlaps      int
}

// step runs act on every member at once (nil: nothing, the initial
// placement), then waits until the ShardingConfig is Ready with each
// member's current pods placed (settled) and every object has been
// reconciled by its owner since t0, and checks the records so far for
// double reconciles.
func (r *run) step(name string, t0 time.Time, act func(m *realMember) error) {
	t := r.t
	t.Helper()
	if act != nil {
		var g errgroup.Group
		for _, m := range r.members {
			g.Go(func() error { return act(m) })
		}
		if err := g.Wait(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	readyAt := map[string]time.Duration{}
	env.Eventually(t, time.Until(t0.Add(settleWithin)), name+": the ShardingConfig Ready with every member's current pods placed", func() error {
		var sc ctrlmeshv1alpha1.ShardingConfig
		if err := r.hub.Get(r.ctx, r.key, &sc); err != nil {
			return err
		}
		st := &sc.Status
		if st.ObservedGeneration != sc.Generation || !meta.IsStatusConditionTrue(st.Conditions, ctrlmeshv1alpha1.ConditionReady) || st.ReadyShards != st.Shards {
			return fmt.Errorf("status %+v", *st)
		}
		if err := fleettest.Partition(&sc); err != nil {
			return err
		}
		var errs []error
		for _, m := range r.members {
			if err := r.settled(m, &sc); err != nil {
				delete(readyAt, m.name)
				errs = append(errs, err)
			} else if _, ok := readyAt[m.name]; !ok {
				readyAt[m.name] = time.Since(t0)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		r.current = &sc
		return nil
	})
	settled := time.Now()
	served := map[string]time.Duration{}
	env.Eventually(t, time.Until(settled.Add(servedWithin)), name+": every object reconciled by its owner", func() error {
		first, err := fleettest.FirstReconciles(r.recordDir, t0, r.current, fleettest.PerCluster)
		if err != nil {
			return err
		}
		var missing []string
		for _, o := range r.objects {
			var last time.Duration
			for _, key := range o.Keys {
				end, ok := first[o.Cluster+"/"+key.String()]
				if !ok {
					missing = append(missing, o.Cluster+" "+key.String())
					continue
				}
				last = max(last, end.Sub(t0))
			}
			served[o.Cluster] = last
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d objects not reconciled by their owner yet, such as %s", len(missing), missing[0])
		}
		return nil
	})
	overlaps := r.checkOverlaps(name)
	r.waitTerminated(name)
	for _, m := range r.members {
		res := stepResult{step: name, member: m.name, mode: m.mode, ready: readyAt[m.name], served: served[m.name], overlaps: overlaps[m.name]}
		r.results = append(r.results, res)
		r.logf("%s in %s (%s mode): Ready again after %.1fs, every object reconciled by its owner %.1fs after the start, %d double reconciles so far",
			name, m.name, m.mode, res.ready.Seconds(), res.served.Seconds(), res.overlaps)
	}
	r.logf("%s: placement %s", name, fleettest.Placement(r.current))
}

// settled tells whether sc places exactly the member's current operator
// pods, all of them: the Deployment's replicas, Running, every container
// Ready, with the Deployment's image, none terminating.
func (r *run) settled(m *realMember, sc *ctrlmeshv1alpha1.ShardingConfig) error {
	var d appsv1.Deployment
	if err := m.cluster.Client.Get(r.ctx, client.ObjectKey{Namespace: shardedNamespace, Name: shardedName}, &d); err != nil {
		return err
	}
	pods, err := r.pods(m)
	if err != nil {
		return err
	}
	var current []string
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Spec.Containers[0].Image != d.Spec.Template.Spec.Containers[0].Image {
			continue
		}
		ready := len(p.Status.InitContainerStatuses) == 1 && len(p.Status.ContainerStatuses) == 1
		for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			ready = ready && s.Ready
		}
		if ready {
			current = append(current, p.Name)
		}
	}
	var placed []string
	for _, p := range sc.Status.Placement {
		if p.Cluster == m.name {
			placed = append(placed, p.Pods...)
		}
	}
	sort.Strings(current)
	sort.Strings(placed)
	if len(current) != int(ptr.Deref(d.Spec.Replicas, 1)) || !slices.Equal(current, placed) {
		return fmt.Errorf("%s: pods %v placed, %d of the Deployment's current pods Ready: %v", m.name, placed, ptr.Deref(d.Spec.Replicas, 1), current)
	}
	return nil
}

// checkCredentials checks that the operator's pods run with nothing but
// their own ServiceAccount's token: no Secret volume, no kubeconfig of
// anyone else; their volumes are the projected token, the proxy's
// kubeconfig emptyDir (which the proxy writes from that token) and the
// records' hostPath.
func (r *run) checkCredentials() {
	r.t.Helper()
	for _, m := range r.members {
		pods, err := r.pods(m)
		if err != nil {
			r.t.Fatal(err)
		}
		for _, p := range pods {
			if p.Spec.ServiceAccountName != shardedName || !ptr.Deref(p.Spec.AutomountServiceAccountToken, true) {
				r.t.Errorf("%s: pod %s runs as ServiceAccount %q (automount %v), want its own, %q", m.name, p.Name, p.Spec.ServiceAccountName, p.Spec.AutomountServiceAccountToken, shardedName)
			}
			for _, v := range p.Spec.Volumes {
				if v.Projected == nil && v.EmptyDir == nil && (v.HostPath == nil || v.HostPath.Path != r.recordDir) {
					r.t.Errorf("%s: pod %s has volume %s: %+v, want only its token, the proxy's emptyDir and the records", m.name, p.Name, v.Name, v.VolumeSource)
				}
			}
			for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
				for _, e := range c.Env {
					if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
						r.t.Errorf("%s: pod %s container %s reads Secret %s", m.name, p.Name, c.Name, e.ValueFrom.SecretKeyRef.Name)
					}
				}
			}
		}
	}
}

// checkShardLocks checks that the operators elected their leaders on the
// renamed locks only: each shard's Lease (ShardLockName) held by a pod of
// that shard, and no Lease of the operator's own name, which an operator
// that went around its proxy would have taken.
func (r *run) checkShardLocks() {
	r.t.Helper()
	lock := operator.DefaultLeaderElectionID
	for _, m := range r.members {
		env.Eventually(r.t, time.Minute, m.name+": each shard's renamed Lease held by a pod of the shard", func() error {
			var leases coordinationv1.LeaseList
			if err := m.cluster.Client.List(r.ctx, &leases, client.InNamespace(shardedNamespace)); err != nil {
				return err
			}
			held := map[string]string{}
			for _, l := range leases.Items {
				held[l.Name] = ptr.Deref(l.Spec.HolderIdentity, "")
			}
			if holder, ok := held[lock]; ok {
				return fmt.Errorf("the Lease %s of the operator's own name exists, held by %q: an operator elected its leader past its proxy", lock, holder)
			}
			for _, p := range r.current.Status.Placement {
				if p.Cluster != m.name {
					continue
				}
				name := ctrlmeshv1alpha1.ShardLockName(lock, p.Shard)
				if holder, ok := held[name]; !ok || !slices.Contains(p.Pods, holder) {
					return fmt.Errorf("shard %s: Lease %s held by %q, want one of %v (Leases: %v)", p.Shard, name, holder, p.Pods, held)
				}
			}
			return nil
		})
	}
}

// waitTerminated waits until no operator pod is terminating any more, so
// that the next step starts from the Deployment's pods alone, and fails the
// test for a pod seen after its deletionTimestamp (the deletion's time plus
// its 30 s grace period): the kubelet had to kill it, as when the operator
// or its proxy does not exit on SIGTERM.
func (r *run) waitTerminated(step string) {
	r.t.Helper()
	start := time.Now()
	outlived := map[string]bool{}
	env.Eventually(r.t, 2*time.Minute, step+": the deleted operator pods gone", func() error {
		var terminating []string
		for _, m := range r.members {
			pods, err := r.pods(m)
			if err != nil {
				return err
			}
			for _, p := range pods {
				if p.DeletionTimestamp == nil {
					continue
				}
				terminating = append(terminating, m.name+"/"+p.Name)
				if time.Now().After(p.DeletionTimestamp.Add(time.Second)) && !outlived[p.Name] {
					outlived[p.Name] = true
					r.t.Errorf("%s: pod %s/%s still there after its grace period (deletionTimestamp %s): %s",
						step, m.name, p.Name, p.DeletionTimestamp.Format(time.TimeOnly), podState(&p))
				}
			}
		}
		if len(terminating) > 0 {
			return fmt.Errorf("terminating: %v", terminating)
		}
		return nil
	})
	if d := time.Since(start); d > time.Second {
		r.logf("%s: the deleted pods gone %.1fs after the step's checks", step, d.Seconds())
	}
}

// pods are the member's operator pods.
func (r *run) pods(m *realMember) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := m.cluster.Client.List(r.ctx, &pods, client.InNamespace(shardedNamespace), client.MatchingLabels{"app": shardedName}); err != nil {
		return nil, err
	}
	return pods.Items, nil
}

// scale sets the Deployment's replicas.
func (r *run) scale(m *realMember, replicas int32) error {
	return m.cluster.Client.Patch(r.ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: shardedNamespace, Name: shardedName}},
		client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)))
}

// setImage rolls the Deployment to another image of the operator.
func (r *run) setImage(m *realMember, image string) error {
	var d appsv1.Deployment
	if err := m.cluster.Client.Get(r.ctx, client.ObjectKey{Namespace: shardedNamespace, Name: shardedName}, &d); err != nil {
		return err
	}
	patched := d.DeepCopy()
	patched.Spec.Template.Spec.Containers[0].Image = image
	return m.cluster.Client.Patch(r.ctx, patched, client.MergeFrom(&d))
}

// deletePod deletes one of the member's placed pods, as a user would
// (graceful): the ReplicaSet makes another.
func (r *run) deletePod(m *realMember) error {
	for _, p := range r.current.Status.Placement {
		if p.Cluster == m.name && len(p.Pods) > 0 {
			victim := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: shardedNamespace, Name: p.Pods[0]}}
			r.logf("%s: deleting pod %s", m.name, victim.Name)
			return m.cluster.Client.Delete(r.ctx, victim)
		}
	}
	return fmt.Errorf("%s: no pod placed", m.name)
}

// killProxies kills, as a crash would, the proxy container of one placed
// pod in each member, and waits until the kubelet has restarted it and it
// is ready again; it returns the killed containers as containerRestarts
// names them.
func (r *run) killProxies() map[string]bool {
	t := r.t
	t.Helper()
	killed := map[string]bool{}
	for _, m := range r.members {
		var pod corev1.Pod
		for _, p := range r.current.Status.Placement {
			if p.Cluster == m.name && len(p.Pods) > 0 {
				pod.Namespace, pod.Name = shardedNamespace, p.Pods[0]
				break
			}
		}
		if err := m.cluster.Client.Get(r.ctx, client.ObjectKeyFromObject(&pod), &pod); err != nil {
			t.Fatalf("%s: no placed pod to kill the proxy of: %v", m.name, err)
		}
		i := slices.IndexFunc(pod.Status.InitContainerStatuses, func(s corev1.ContainerStatus) bool { return s.Name == ctrlmeshv1alpha1.ProxyContainerName })
		if i < 0 {
			t.Fatalf("%s: pod %s has no %s container status", m.name, pod.Name, ctrlmeshv1alpha1.ProxyContainerName)
		}
		proxy := pod.Status.InitContainerStatuses[i]
		pid, err := m.cluster.Node.ContainerPID(r.ctx, strings.TrimPrefix(proxy.ContainerID, "containerd://"))
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("%s: killing the proxy of %s (pid %d): %v", m.name, pod.Name, pid, err)
		}
		r.logf("%s: killed the proxy of pod %s (pid %d)", m.name, pod.Name, pid)
		killed[m.name+"/"+pod.Name+"/"+proxy.Name] = true
		env.Eventually(t, settleWithin, m.name+": the proxy of "+pod.Name+" restarted and ready", func() error {
			if err := m.cluster.Client.Get(r.ctx, client.ObjectKeyFromObject(&pod), &pod); err != nil {
				return err
			}
			s := pod.Status.InitContainerStatuses[i]
			if s.RestartCount <= proxy.RestartCount || !s.Ready {
				return fmt.Errorf("proxy status %+v", s)
			}
			return nil
		})
	}
	return killed
}

// restartKubelet stops the member's kubelet for kubeletDown and starts it
// again.
func (r *run) restartKubelet(m *realMember) error {
	took, err := m.cluster.Node.RestartKubelet(r.ctx, m.cluster, kubeletDown, settleWithin)
	if err != nil {
		return err
	}
	r.logf("%s: kubelet stopped for %s, node %s Ready again %.1fs after the stop", m.name, kubeletDown, m.cluster.Node.Name, took.Seconds())
	return nil
}

// containerRestarts are the restart counts of the operator pods'
// containers, by pod/container.
func (r *run) containerRestarts() map[string]int32 {
	r.t.Helper()
	out := map[string]int32{}
	for _, m := range r.members {
		pods, err := r.pods(m)
		if err != nil {
			r.t.Fatal(err)
		}
		for _, p := range pods {
			for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
				out[m.name+"/"+p.Name+"/"+s.Name] = s.RestartCount
			}
		}
	}
	return out
}

// checkOverlaps reads every record so far and fails the test on any object
// reconciled by two pods at once; it returns their number by member.
func (r *run) checkOverlaps(what string) map[string]int {
	t := r.t
	t.Helper()
	var byCluster map[string][]operator.Reconcile
	// A record being appended may be read cut short: read again.
	env.Eventually(t, 10*time.Second, what+": reading the records", func() error {
		files, err := filepath.Glob(filepath.Join(r.recordDir, "*.jsonl"))
		if err != nil {
			return err
		}
		byCluster = map[string][]operator.Reconcile{}
		for _, file := range files {
			cluster, _, _ := strings.Cut(filepath.Base(file), "--")
			rs, err := operator.ReadRecordFile(file)
			if err != nil {
				return err
			}
			byCluster[cluster] = append(byCluster[cluster], rs...)
		}
		return nil
	})
	counts := map[string]int{}
	for _, cluster := range slices.Sorted(maps.Keys(byCluster)) {
		overlaps := operator.Overlaps(byCluster[cluster])
		counts[cluster] = len(overlaps)
		for i, o := range overlaps {
			if i == 10 {
				t.Errorf("... and %d more", len(overlaps)-i)
				break
			}
			t.Errorf("%s: double reconcile in %s: %s", what, cluster, o)
		}
		if what == "end" {
			r.logf("objects of %s: %d reconciles recorded, %d double reconciles", cluster, len(byCluster[cluster]), len(overlaps))
		}
	}
	return counts
}

// report logs the steps' measures as a table.
func (r *run) report() {
	var b strings.Builder
	fmt.Fprintf(&b, "| step | member (mode) | Ready again | every object served again | double reconciles |\n|---|---|---|---|---|\n")
	for _, res := range r.results {
		fmt.Fprintf(&b, "| %s | %s (%s) | %.1f s | %.1f s | %d |\n", res.step, res.member, res.mode, res.ready.Seconds(), res.served.Seconds(), res.overlaps)
	}
	r.t.Logf("measures:\n%s", b.String())
}
