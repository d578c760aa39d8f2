package env_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestFleetHubAndTwoMembers starts a hub and two members at once, writes the
// objects the hub and agents exchange, reads them back, and shuts down.
func TestFleetHubAndTwoMembers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	start := time.Now()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{
		{Name: "hub"}, {Name: "member1"}, {Name: "member2"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hub and two members serving after %s", time.Since(start).Round(time.Millisecond))
	stopped := false
	defer func() {
		if !stopped {
			_ = fleet.Stop()
		}
	}()

	// The clusters are independent: distinct API servers, distinct etcds.
	hosts := map[string]bool{}
	for _, c := range fleet.Clusters {
		hosts[c.Config.Host] = true
	}
	if len(hosts) != 3 {
		t.Fatalf("want 3 distinct API servers, got %v", hosts)
	}
	marker := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "only-in-member1"}}
	if err := fleet.Cluster("member1").Client.Create(ctx, marker); err != nil {
		t.Fatal(err)
	}
	if err := fleet.Cluster("member2").Client.Get(ctx, client.ObjectKeyFromObject(marker), &corev1.Namespace{}); err == nil {
		t.Fatal("a namespace created in member1 is visible in member2: the clusters share storage")
	}

	hub := fleet.Cluster("hub")
	if err := hub.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "operators"}}); err != nil {
		t.Fatal(err)
	}
	sc := &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "operators", Name: "demo"},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector:   metav1.LabelSelector{MatchLabels: map[string]string{"app": "demo-operator"}},
			Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "demo-operator"},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}},
			}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"member1", "member2"}},
		},
	}
	if err := hub.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	var gotSC ctrlmeshv1alpha1.ShardingConfig
	if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &gotSC); err != nil {
		t.Fatal(err)
	}
	if gotSC.Spec.Sharding.Buckets != 32 || gotSC.Spec.Sharding.PodsPerShard != 1 || gotSC.Spec.Scope != ctrlmeshv1alpha1.ScopePerCluster {
		t.Errorf("defaults not applied: sharding %+v, scope %q", gotSC.Spec.Sharding, gotSC.Spec.Scope)
	}

	// The ManagedCluster CRD is served on the hub.
	mc := &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "member1"},
		Spec:       clusterv1.ManagedClusterSpec{HubAcceptsClient: true},
	}
	if err := hub.Client.Create(ctx, mc); err != nil {
		t.Fatal(err)
	}

	for _, member := range []string{"member1", "member2"} {
		route := &ctrlmeshv1alpha1.ShardRoute{
			TypeMeta:   metav1.TypeMeta{APIVersion: ctrlmeshv1alpha1.GroupVersion.String(), Kind: "ShardRoute"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "operators", Name: "demo"},
			Spec: ctrlmeshv1alpha1.ShardRouteSpec{
				Cluster:           member,
				RoutingGeneration: 1,
				RulesHash:         "0123abcd",
				Scope:             ctrlmeshv1alpha1.ScopePerCluster,
				Buckets:           32,
				Selector:          sc.Spec.Selector,
				Controller:        sc.Spec.Controller,
				Limits:            sc.Spec.Limits,
				Shards: []ctrlmeshv1alpha1.RouteShard{
					{ID: "0", Buckets: "0-15", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "demo-0", Address: "10.0.0.1"}}},
					{ID: "1", Buckets: "16-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "demo-1", Address: "10.0.0.2"}}},
				},
			},
		}
		raw, err := json.Marshal(route)
		if err != nil {
			t.Fatal(err)
		}

		// The Work lives in the member's execution namespace on the hub.
		execNS := names.GenerateExecutionSpaceName(member)
		if execNS != "karmada-es-"+member {
			t.Fatalf("execution namespace %q", execNS)
		}
		if err := hub.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: execNS}}); err != nil {
			t.Fatal(err)
		}
		work := &workv1alpha1.Work{
			ObjectMeta: metav1.ObjectMeta{Namespace: execNS, Name: names.GenerateWorkName("ShardRoute", "demo", "operators")},
			Spec: workv1alpha1.WorkSpec{Workload: workv1alpha1.WorkloadTemplate{
				Manifests: []workv1alpha1.Manifest{{RawExtension: runtime.RawExtension{Raw: raw}}},
			}},
		}
		if err := hub.Client.Create(ctx, work); err != nil {
			t.Fatal(err)
		}
		var gotWork workv1alpha1.Work
		if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(work), &gotWork); err != nil {
			t.Fatal(err)
		}
		var carried ctrlmeshv1alpha1.ShardRoute
		if err := json.Unmarshal(gotWork.Spec.Workload.Manifests[0].Raw, &carried); err != nil {
			t.Fatal(err)
		}
		if carried.Spec.Cluster != member || len(carried.Spec.Shards) != 2 || carried.Spec.Shards[1].Buckets != "16-31" {
			t.Errorf("the Work in %s carries %+v", execNS, carried.Spec)
		}

		// The rules object itself is served in the member, status included.
		mcl := fleet.Cluster(member)
		if err := mcl.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "operators"}}); err != nil {
			t.Fatal(err)
		}
		applied := carried.DeepCopy()
		if err := mcl.Client.Create(ctx, applied); err != nil {
			t.Fatal(err)
		}
		applied.Status.ObservedRoutingGeneration = 1
		applied.Status.Pods = []ctrlmeshv1alpha1.PodRouteStatus{{Name: "demo-0", Ready: true, Shard: "0", AppliedRulesHash: "0123abcd"}}
		applied.Status.Leaders = []ctrlmeshv1alpha1.ShardLeader{{Shard: "0", Pod: "demo-0"}}
		if err := mcl.Client.Status().Update(ctx, applied); err != nil {
			t.Fatal(err)
		}
		var gotRoute ctrlmeshv1alpha1.ShardRoute
		if err := mcl.Client.Get(ctx, client.ObjectKeyFromObject(applied), &gotRoute); err != nil {
			t.Fatal(err)
		}
		if gotRoute.Status.Pods[0].AppliedRulesHash != "0123abcd" || gotRoute.Status.Leaders[0].Pod != "demo-0" {
			t.Errorf("status of the ShardRoute in %s: %+v", member, gotRoute.Status)
		}
	}

	// Each kubeconfig file reaches its own cluster.
	for _, c := range fleet.Clusters {
		cfg, err := clientcmd.BuildConfigFromFlags("", c.KubeconfigPath)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cs.CoreV1().Namespaces().Get(ctx, "only-in-member1", metav1.GetOptions{})
		if (err == nil) != (c.Name == "member1") {
			t.Errorf("kubeconfig of %s: get namespace only-in-member1: %v", c.Name, err)
		}
	}

	if err := fleet.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	for _, c := range fleet.Clusters {
		if _, err := os.Stat(c.KubeconfigPath); !os.IsNotExist(err) {
			t.Errorf("kubeconfig %s left behind after Stop: %v", c.KubeconfigPath, err)
		}
		cs, err := kubernetes.NewForConfig(c.Config)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.Discovery().ServerVersion(); err == nil {
			t.Errorf("cluster %s still answers after Stop", c.Name)
		}
	}
}

func TestStartFailsClearlyWithoutBinaries(t *testing.T) {
	_, err := env.Start(context.Background(), env.Options{
		Clusters:  []env.ClusterSpec{{Name: "hub"}},
		AssetsDir: t.TempDir(),
	})
	if err == nil {
		t.Fatal("Start succeeded without binaries")
	}
	const want = "env: etcd and kube-apiserver not found in "
	if got := err.Error(); len(got) < len(want) || got[:len(want)] != want {
		t.Errorf("error = %q, want it to start with %q and say how to build them", got, want)
	}
}

func TestNamesUnique(t *testing.T) {
	var n env.Names
	got := []string{n.Unique("a"), n.Unique("b"), n.Unique("a"), n.Unique("a")}
	if want := []string{"a", "b", "a-r2", "a-r3"}; !slices.Equal(got, want) {
		t.Errorf("names %v, want %v", got, want)
	}
}
