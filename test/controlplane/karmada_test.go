package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	workv1alpha2 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha2"
	"github.com/karmada-io/karmada/pkg/util"
	"github.com/karmada-io/karmada/pkg/util/names"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestKarmadaJoin runs a real Karmada control plane (kube-apiserver with
// Karmada's CRDs, karmada-aggregated-apiserver, karmada-controller-manager),
// joins one member in push mode and one in pull mode (karmada-agent), and
// follows Works through Karmada's own execution and work-status controllers:
// a ConfigMap, then a ctrlmesh ShardRoute reported through the shipped
// ResourceInterpreterCustomization.
func TestKarmadaJoin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	start := time.Now()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "karmada", Karmada: true}, {Name: "member1"}, {Name: "member2"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Karmada and two members serving after %s", time.Since(start).Round(time.Millisecond))
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	karmada := fleet.Cluster("karmada")
	if fleet.Cluster("member1").Karmada != nil {
		t.Fatal("a cluster without Spec.Karmada runs Karmada components")
	}

	available, reason, err := controlplane.APIServiceAvailable(ctx, karmada.Client, "v1alpha1.cluster.karmada.io")
	if err != nil || !available {
		t.Fatalf("APIService v1alpha1.cluster.karmada.io: available=%v (%s), err=%v", available, reason, err)
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.InstallShardRouteInterpreter(ctx, karmada, root); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		member string
		join   func(context.Context, *controlplane.Cluster, *controlplane.Cluster) error
		mode   clusterv1alpha1.ClusterSyncMode
	}{
		{member: "member1", join: controlplane.JoinPush, mode: clusterv1alpha1.Push},
		{member: "member2", join: controlplane.JoinPull, mode: clusterv1alpha1.Pull},
	} {
		t.Run(string(tt.mode), func(t *testing.T) {
			member := fleet.Cluster(tt.member)
			if err := tt.join(ctx, karmada, member); err != nil {
				t.Fatal(err)
			}
			cluster := &clusterv1alpha1.Cluster{}
			eventually(ctx, t, karmada, "Cluster "+member.Name+" Ready", func() (bool, string, error) {
				if err := karmada.Client.Get(ctx, client.ObjectKey{Name: member.Name}, cluster); err != nil {
					return false, "", err
				}
				ready := meta.FindStatusCondition(cluster.Status.Conditions, clusterv1alpha1.ClusterConditionReady)
				return ready != nil && ready.Status == metav1.ConditionTrue, fmt.Sprintf("conditions %v", cluster.Status.Conditions), nil
			})
			if cluster.Spec.SyncMode != tt.mode {
				t.Errorf("Cluster %s has sync mode %q, want %q", member.Name, cluster.Spec.SyncMode, tt.mode)
			}
			executionSpace := names.GenerateExecutionSpaceName(member.Name)
			eventually(ctx, t, karmada, "execution namespace "+executionSpace, func() (bool, string, error) {
				err := karmada.Client.Get(ctx, client.ObjectKey{Name: executionSpace}, &corev1.Namespace{})
				return err == nil, fmt.Sprint(err), nil
			})
			checkConfigMapWork(ctx, t, karmada, member)
			checkShardRouteWork(ctx, t, karmada, member)
			checkShardRouteBesideLabelerRBAC(ctx, t, karmada, member)
		})
	}

	if err := karmada.Karmada.Err(); err != nil {
		t.Error(err)
	}
}

// checkConfigMapWork creates a Work carrying a ConfigMap for member and
// waits until Karmada applied it and reported it.
func checkConfigMapWork(ctx context.Context, t *testing.T, karmada, member *controlplane.Cluster) {
	t.Helper()
	work := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: names.GenerateExecutionSpaceName(member.Name), Name: "configmap-from-karmada"}}
	// The annotations naming the Work, as Karmada's binding controller
	// writes them into a manifest: the work-status controller finds the
	// Work of a member object by them, and reports nothing of an object
	// without them (the execution controller applies it all the same).
	cm := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "from-karmada", Annotations: map[string]string{
			workv1alpha2.WorkNamespaceAnnotation: work.Namespace, workv1alpha2.WorkNameAnnotation: work.Name,
		}},
		Data: map[string]string{"key": "value"},
	}
	work.Spec.Workload.Manifests = []workv1alpha1.Manifest{{RawExtension: runtime.RawExtension{Raw: mustJSON(t, cm)}}}
	if err := karmada.Client.Create(ctx, work); err != nil {
		t.Fatal(err)
	}
	applied := &corev1.ConfigMap{}
	eventually(ctx, t, karmada, "the ConfigMap in the member", func() (bool, string, error) {
		err := member.Client.Get(ctx, client.ObjectKeyFromObject(cm), applied)
		return err == nil, fmt.Sprint(err), nil
	})
	if applied.Data["key"] != "value" {
		t.Errorf("the member's ConfigMap has data %v, want key=value", applied.Data)
	}
	eventually(ctx, t, karmada, "the ConfigMap Work's status", func() (bool, string, error) {
		if err := karmada.Client.Get(ctx, client.ObjectKeyFromObject(work), work); err != nil {
			return false, "", err
		}
		return isApplied(work) && len(work.Status.ManifestStatuses) == 1, statusString(work), nil
	})
	t.Logf("Karmada's status of a ConfigMap Work: %s", statusString(work))
	id := work.Status.ManifestStatuses[0].Identifier
	if id.Version != "v1" || id.Kind != "ConfigMap" || id.Namespace != cm.Namespace || id.Name != cm.Name {
		t.Errorf("manifestStatuses[0].identifier = %+v, want the ConfigMap default/from-karmada", id)
	}
}

// checkShardRouteWork creates a Work carrying a ShardRoute for member, plays
// the agent's report on the member's ShardRoute, waits until Karmada
// reflected it into the Work through the shipped interpreter, and deletes
// the Work.
func checkShardRouteWork(ctx context.Context, t *testing.T, karmada, member *controlplane.Cluster) {
	t.Helper()
	route := &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: member.Name, RoutingGeneration: 1, RulesHash: "h1",
			Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}},
			}}},
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: "0-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-0"}}}},
		},
	}
	work := createWork(ctx, t, karmada, member.Name, route, nil)
	applied := &ctrlmeshv1alpha1.ShardRoute{}
	eventually(ctx, t, karmada, "the ShardRoute in the member", func() (bool, string, error) {
		err := member.Client.Get(ctx, client.ObjectKeyFromObject(route), applied)
		return err == nil, fmt.Sprint(err), nil
	})

	// Before the agent reports, the shipped interpreter calls the route's
	// health Unknown.
	eventually(ctx, t, karmada, "the ShardRoute Work's status before the agent reports", func() (bool, string, error) {
		if err := karmada.Client.Get(ctx, client.ObjectKeyFromObject(work), work); err != nil {
			return false, "", err
		}
		return isApplied(work) && len(work.Status.ManifestStatuses) == 1, statusString(work), nil
	})
	t.Logf("Karmada's status of a ShardRoute Work before the agent reports: %s", statusString(work))
	report, err := routework.ReadStatus(work)
	if err != nil {
		t.Fatal(err)
	}
	if report.Health != workv1alpha1.ResourceUnknown {
		t.Errorf("health before the agent reports = %q, want %q", report.Health, workv1alpha1.ResourceUnknown)
	}

	// The agent's report, as its status controller writes it.
	now := metav1.Now()
	applied.Status = ctrlmeshv1alpha1.ShardRouteStatus{
		ObservedGeneration: applied.Generation, ObservedRoutingGeneration: 1,
		Conditions: []metav1.Condition{
			{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue, Reason: "Applied", LastTransitionTime: now, ObservedGeneration: applied.Generation},
			{Type: ctrlmeshv1alpha1.ConditionProxiesReady, Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: now, ObservedGeneration: applied.Generation},
		},
	}
	if err := member.Client.Status().Update(ctx, applied); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, karmada, "the agent's report reflected into the Work", func() (bool, string, error) {
		if err := karmada.Client.Get(ctx, client.ObjectKeyFromObject(work), work); err != nil {
			return false, "", err
		}
		report, err = routework.ReadStatus(work)
		if err != nil {
			return false, "", err
		}
		return report.Health == workv1alpha1.ResourceHealthy, statusString(work), nil
	})
	t.Logf("Karmada's status of a ShardRoute Work after the agent reports: %s", statusString(work))
	if report.Cluster != member.Name {
		t.Errorf("report.Cluster = %q, want %q", report.Cluster, member.Name)
	}
	if report.Route.ObservedRoutingGeneration != 1 || len(report.Route.Conditions) != 2 {
		t.Errorf("the reflected route status = %+v, want the agent's report", report.Route)
	}
	if report.Applied == nil || report.Applied.Status != metav1.ConditionTrue {
		t.Fatalf("report.Applied = %+v, want True", report.Applied)
	}
	// What the hub must cope with: Karmada's execution controller writes
	// Applied without an observedGeneration, so that Applied alone cannot
	// tell which generation of the Work the member holds.
	if report.Applied.ObservedGeneration != 0 {
		t.Errorf("Karmada's Applied condition has observedGeneration %d; Karmada v1.16 writes none, update the hub's reading of it (issue 14)", report.Applied.ObservedGeneration)
	}

	// Deleting the Work makes Karmada's execution controller remove the
	// ShardRoute from the member before it lets the Work go.
	if err := karmada.Client.Delete(ctx, work); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, karmada, "the ShardRoute removed from the member", func() (bool, string, error) {
		err := member.Client.Get(ctx, client.ObjectKeyFromObject(route), &ctrlmeshv1alpha1.ShardRoute{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})
	eventually(ctx, t, karmada, "the ShardRoute Work gone", func() (bool, string, error) {
		err := karmada.Client.Get(ctx, client.ObjectKeyFromObject(work), &workv1alpha1.Work{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})
}

// checkShardRouteBesideLabelerRBAC creates a Work carrying a ShardRoute and
// the labeler's RBAC for member, as the hub writes it, plays the agent's
// report, then changes the RBAC as a change of limits does, and checks that
// Karmada's work-status controller keeps reporting the route in the Work:
// it keeps one manifest status per Work, that of the last object it
// reflected, so an RBAC manifest naming the Work replaced the route's
// status (and the hub then read no pods in the member). Deleting the Work
// removes all three objects from the member.
func checkShardRouteBesideLabelerRBAC(ctx context.Context, t *testing.T, karmada, member *controlplane.Cluster) {
	t.Helper()
	configMaps := ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{""}, Resources: []string{"configmaps"}}
	route := &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "labeled"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: member.Name, RoutingGeneration: 1, RulesHash: "h1",
			Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Limits:   ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{configMaps}}},
			Shards:   []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: "0-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-0"}}}},
		},
	}
	rbac, _ := routework.NewLabelerRBAC(route.Namespace, route.Name, route.Spec.Limits, "ctrlmesh")
	work := createWork(ctx, t, karmada, member.Name, route, rbac)
	applied := &ctrlmeshv1alpha1.ShardRoute{}
	eventually(ctx, t, karmada, "the ShardRoute and the labeler's ClusterRole in the member", func() (bool, string, error) {
		if err := member.Client.Get(ctx, client.ObjectKeyFromObject(route), applied); err != nil {
			return false, err.Error(), nil
		}
		err := member.Client.Get(ctx, client.ObjectKeyFromObject(rbac.Role), &rbacv1.ClusterRole{})
		return err == nil, fmt.Sprint(err), nil
	})
	now := metav1.Now()
	applied.Status = ctrlmeshv1alpha1.ShardRouteStatus{
		ObservedGeneration: applied.Generation, ObservedRoutingGeneration: 1,
		Conditions: []metav1.Condition{
			{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue, Reason: "Applied", LastTransitionTime: now, ObservedGeneration: applied.Generation},
			{Type: ctrlmeshv1alpha1.ConditionProxiesReady, Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: now, ObservedGeneration: applied.Generation},
		},
	}
	if err := member.Client.Status().Update(ctx, applied); err != nil {
		t.Fatal(err)
	}
	routeReported := func() (bool, string, error) {
		if err := karmada.Client.Get(ctx, client.ObjectKeyFromObject(work), work); err != nil {
			return false, "", err
		}
		report, err := routework.ReadStatus(work)
		if err != nil {
			return false, "", err
		}
		return report.Health == workv1alpha1.ResourceHealthy && report.Route.ObservedRoutingGeneration == 1, statusString(work), nil
	}
	eventually(ctx, t, karmada, "the agent's report reflected into the Work", routeReported)

	// A limit on secrets more: the labeler's ClusterRole changes, the
	// route's spec does not.
	secrets := ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{""}, Resources: []string{"secrets"}}
	wider, _ := routework.NewLabelerRBAC(route.Namespace, route.Name, ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{configMaps, secrets}}}, "ctrlmesh")
	if err := routework.SetManifests(work, route, wider); err != nil {
		t.Fatal(err)
	}
	if err := karmada.Client.Update(ctx, work); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, karmada, "the wider ClusterRole in the member", func() (bool, string, error) {
		role := &rbacv1.ClusterRole{}
		if err := member.Client.Get(ctx, client.ObjectKeyFromObject(rbac.Role), role); err != nil {
			return false, "", err
		}
		return equality.Semantic.DeepEqual(role.Rules, wider.Role.Rules), fmt.Sprintf("rules %v", role.Rules), nil
	})
	// The work-status controller reflects a member object within
	// milliseconds of its change; the route's report must still be there
	// well after.
	for range 12 {
		ok, desc, err := routeReported()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("after the labeler's ClusterRole changed, the Work no longer reports the ShardRoute: %s", desc)
		}
		time.Sleep(250 * time.Millisecond)
	}

	if err := karmada.Client.Delete(ctx, work); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{&ctrlmeshv1alpha1.ShardRoute{ObjectMeta: route.ObjectMeta}, wider.Role, wider.Binding} {
		eventually(ctx, t, karmada, fmt.Sprintf("%T %s removed from the member", obj, obj.GetName()), func() (bool, string, error) {
			err := member.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
			return apierrors.IsNotFound(err), fmt.Sprint(err), nil
		})
	}
}

// eventually polls cond until it holds, failing the test with cond's last
// description (and the Karmada logs' directory) when it does not within
// two minutes.
func eventually(ctx context.Context, t *testing.T, karmada *controlplane.Cluster, what string, cond func() (bool, string, error)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		ok, desc, err := cond()
		last = desc
		if err != nil {
			last = err.Error()
		}
		return ok, nil
	})
	if err != nil {
		logKarmadaTails(t, karmada)
		t.Fatalf("waiting for %s: %v (last: %s)", what, err, last)
	}
}

// logKarmadaTails logs the end of each Karmada component's log, which Stop
// removes with the work directory.
func logKarmadaTails(t *testing.T, karmada *controlplane.Cluster) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(karmada.Karmada.Dir, "*.log"))
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Log(err)
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		t.Logf("last lines of %s:\n%s", filepath.Base(path), strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
}

func isApplied(work *workv1alpha1.Work) bool {
	return meta.IsStatusConditionTrue(work.Status.Conditions, workv1alpha1.WorkApplied)
}

func statusString(work *workv1alpha1.Work) string {
	data, _ := json.Marshal(struct {
		Generation int64                   `json:"generation"`
		Status     workv1alpha1.WorkStatus `json:"status"`
	}{work.Generation, work.Status})
	return string(data)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// createWork creates on karmada the Work of route (and the labeler's RBAC)
// for member, as the hub writes it. The writer of a Work puts the execution
// controller's finalizer on it, as Karmada's binding controller does and the
// hub does in Karmada mode: the execution controller adds none, and without
// it a deleted Work leaves its objects in the member.
func createWork(ctx context.Context, t *testing.T, karmada *controlplane.Cluster, member string, route *ctrlmeshv1alpha1.ShardRoute, rbac *routework.LabelerRBAC) *workv1alpha1.Work {
	t.Helper()
	work := routework.NewWork(routework.WorkKey(member, route.Namespace, route.Name))
	if err := routework.SetManifests(work, route, rbac); err != nil {
		t.Fatal(err)
	}
	work.Finalizers = []string{util.ExecutionControllerFinalizer}
	if err := karmada.Client.Create(ctx, work); err != nil {
		t.Fatal(err)
	}
	return work
}
