package shardingconfig_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	ctrlmeshhub "github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/hub/clusters"
	"github.com/ctrlmesh/ctrlmesh/hub/propagation"
	"github.com/ctrlmesh/ctrlmesh/hub/shardingconfig"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// startHub runs the hub's two controllers over a new working model, as
// hub.Run wires them, with the hub's shipped RBAC, until stop is called or
// the test ends. It returns the working model.
func startHub(t *testing.T) (store *state.Store, stop func()) {
	t.Helper()
	return startHubWith(t, 0)
}

// startHubWith is startHub with the validity of rules in Fleet scope
// (hub.Options.RulesValidity); 0 for the default.
func startHubWith(t *testing.T, rulesValidity time.Duration) (store *state.Store, stop func()) {
	t.Helper()
	return startHubTuned(t, rulesValidity, nil, nil)
}

// startHubWriting is startHub whose Works are written through
// writer(the manager's client).
func startHubWriting(t *testing.T, writer func(client.Client) client.Client) (store *state.Store, stop func()) {
	t.Helper()
	return startHubTuned(t, 0, writer, nil)
}

// startHubTuned is startHubWith whose Works are written through
// writer(the manager's client), nil for that client, and whose
// ShardingConfig reconciler tune changes, when not nil, before it starts.
func startHubTuned(t *testing.T, rulesValidity time.Duration, writer func(client.Client) client.Client, tune func(*shardingconfig.Reconciler)) (store *state.Store, stop func()) {
	t.Helper()
	store, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	// The hub's cache: Works decoded and cached without manifests,
	// ShardingConfigs without their placement.
	cacheOpts, err := ctrlmeshhub.CacheOptions(hubIdentity, fleet.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(hubIdentity, ctrl.Options{
		Scheme: fleet.Scheme, Logger: logr.Discard(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   cacheOpts,
		// Tests run several managers, one after the other, in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	changes := make(chan event.GenericEvent)
	if err := (&clusters.Reconciler{Store: store, Options: clusters.Options{AutoAccept: true, Changes: changes, RulesValidity: rulesValidity}}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	metrics, err := shardingconfig.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	writes := mgr.GetClient()
	if writer != nil {
		writes = writer(writes)
	}
	r := &shardingconfig.Reconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Writer: &propagation.Writer{Client: writes, Reader: mgr.GetAPIReader()}, Store: store, ClusterChanges: changes,
		Recorder: mgr.GetEventRecorderFor("ctrlmesh-hub"), Metrics: metrics, RulesValidity: rulesValidity,
	}
	if tune != nil {
		tune(r)
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	_, stop = env.StartManager(t, mgr)
	return store, stop
}

// joinCluster creates an accepted ManagedCluster and, once the hub created
// its namespaces (the cluster namespace, for the heartbeat, comes after the
// execution namespace), gives it a heartbeat that lasts the test.
func joinCluster(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	env.Create(t, ctx, hub.Client, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true}})
	env.Eventually(t, 30*time.Second, "the namespaces of "+name, func() error {
		return hub.Client.Get(ctx, client.ObjectKey{Name: ctrlmeshv1alpha1.ClusterNamespace(name)}, &corev1.Namespace{})
	})
	hb := &membership.Heartbeat{Hub: hub.Client, ClusterName: name, Identity: "agent-0", LeaseDuration: 10 * time.Minute}
	if err := hb.Renew(ctx); err != nil {
		t.Fatal(err)
	}
}

// rows is what the working model holds of a config: the revision published
// to each cluster, and the pods each cluster's agent reported (nil for a
// report without pods).
type rows struct {
	published map[string]state.Revision
	reported  map[string][]string
}

func rowsOf(store *state.Store, config types.NamespacedName) rows {
	v := store.Snapshot()
	out := rows{published: map[string]state.Revision{}, reported: map[string][]string{}}
	for _, p := range v.PublishedOf(config) {
		// When the hub knew it published is the hub's own: a restarted
		// hub knows it later.
		out.published[p.Cluster] = state.Revision{Generation: p.Generation, RulesHash: p.RulesHash}
	}
	for _, r := range v.ReportsOf(config) {
		var pods []string
		for _, p := range r.Pods {
			pods = append(pods, p.Name)
		}
		out.reported[r.Cluster] = pods
	}
	return out
}

func (r rows) String() string {
	return fmt.Sprintf("published %v, reported %v", r.published, r.reported)
}

func workOf(t *testing.T, ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig, cluster string) (*workv1alpha1.Work, error) {
	t.Helper()
	var work workv1alpha1.Work
	err := hub.Client.Get(ctx, routework.WorkKey(cluster, sc.Namespace, sc.Name), &work)
	return &work, err
}

// reportPods writes the Work's status as a member's agent does once it
// applied the Work's ShardRoute: ready pods whose proxies applied the rules
// the Work carries, and the rules applied.
func reportPods(t *testing.T, ctx context.Context, work *workv1alpha1.Work, pods ...string) {
	t.Helper()
	if err := writeReport(ctx, work, pods...); err != nil {
		t.Fatal(err)
	}
}

// writeReport is reportPods, returning its error.
func writeReport(ctx context.Context, work *workv1alpha1.Work, pods ...string) error {
	route, err := routework.Decode(work)
	if err != nil {
		return err
	}
	var reported []ctrlmeshv1alpha1.PodRouteStatus
	for i, pod := range pods {
		reported = append(reported, ctrlmeshv1alpha1.PodRouteStatus{Name: pod, Address: fmt.Sprintf("10.0.0.%d", i+1), Ready: true, AppliedRulesHash: route.Spec.RulesHash})
	}
	status, err := json.Marshal(ctrlmeshv1alpha1.ShardRouteStatus{
		ObservedRoutingGeneration: route.Spec.RoutingGeneration,
		Pods:                      reported,
		Conditions: []metav1.Condition{{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue,
			Reason: ctrlmeshv1alpha1.ReasonRulesValid, Message: "applied", LastTransitionTime: metav1.Now()}},
	})
	if err != nil {
		return err
	}
	work.Status.Conditions = []metav1.Condition{{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: "AppliedSuccessful",
		ObservedGeneration: work.Generation, LastTransitionTime: metav1.Now()}}
	work.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{{
		Identifier: workv1alpha1.ResourceIdentifier{Group: ctrlmeshv1alpha1.GroupVersion.Group, Version: ctrlmeshv1alpha1.GroupVersion.Version,
			Kind: "ShardRoute", Resource: "shardroutes", Namespace: route.Namespace, Name: route.Name},
		Health: workv1alpha1.ResourceHealthy,
		Status: &runtime.RawExtension{Raw: status},
	}}
	return hub.Client.Status().Update(ctx, work)
}

// TestWorkingModelFollowsWorks: the working model holds what the Works of
// a ShardingConfig carry and report, and placement reads the reported pods
// from it; a restarted hub rebuilds it from the Works and publishes
// nothing; a cluster that leaves takes its rows with its Work, and a
// deleted ShardingConfig all of its rows.
func TestWorkingModelFollowsWorks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	store, stopHub := startHub(t)
	staying, leaving := unique("model-staying"), unique("model-leaving")
	joinCluster(t, ctx, staying)
	joinCluster(t, ctx, leaving)
	namespace := unique("model-ops")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	sc := configOver(namespace, ctrlmeshv1alpha1.ScopePerCluster, staying, leaving)
	env.Create(t, ctx, hub.Client, sc)
	config := client.ObjectKeyFromObject(sc)

	// The first rules, without pods, are in the model as published.
	env.Eventually(t, 30*time.Second, "the first rules in the model", func() error {
		got := rowsOf(store, config)
		for _, c := range []string{staying, leaving} {
			work, err := workOf(t, ctx, sc, c)
			if err != nil {
				return err
			}
			route, err := routework.Decode(work)
			if err != nil {
				return err
			}
			if want := (state.Revision{Generation: 1, RulesHash: route.Spec.RulesHash}); got.published[c] != want {
				return fmt.Errorf("%s: %s; want %+v published", c, got, want)
			}
		}
		return nil
	})

	// The agent's report enters the model, and placement takes the pod
	// from there: it publishes a shard of it.
	work, err := workOf(t, ctx, sc, staying)
	if err != nil {
		t.Fatal(err)
	}
	reportPods(t, ctx, work, "op-0")
	env.Eventually(t, 30*time.Second, "the reported pod placed", func() error {
		got := rowsOf(store, config)
		if !slices.Equal(got.reported[staying], []string{"op-0"}) || got.published[staying].Generation != 2 {
			return fmt.Errorf("%s; want op-0 reported in %s and generation 2 published", got, staying)
		}
		for _, p := range store.Snapshot().PublishedOf(config) {
			if shards := p.Route.Spec.Shards; p.Cluster == staying && (len(shards) != 1 || len(shards[0].Pods) != 1 || shards[0].Pods[0].Name != "op-0") {
				return fmt.Errorf("rules published to %s: %+v; want one shard of op-0", p.Cluster, shards)
			}
		}
		return nil
	})
	before := rowsOf(store, config)

	// A restarted hub, with a new model, reads the Works back and publishes
	// nothing.
	workVersions := func() map[string]string {
		out := map[string]string{}
		for _, c := range []string{staying, leaving} {
			work, err := workOf(t, ctx, sc, c)
			if err != nil {
				t.Fatal(err)
			}
			out[c] = work.ResourceVersion
		}
		return out
	}
	stopHub()
	versions := workVersions()
	store, _ = startHub(t)
	env.Eventually(t, 30*time.Second, "the model rebuilt", func() error {
		if got := rowsOf(store, config); !maps.Equal(got.published, before.published) || !maps.EqualFunc(got.reported, before.reported, slices.Equal) {
			return fmt.Errorf("%s; the first hub had %s", got, before)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // time for writes that should not come
	if after := workVersions(); !maps.Equal(after, versions) {
		t.Errorf("the restarted hub wrote Works: resourceVersions %v, before %v", after, versions)
	}

	// A cluster that leaves takes its Work and its rows.
	if err := hub.Client.Delete(ctx, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: leaving}}); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the rows and Work of the cluster that left gone", func() error {
		got := rowsOf(store, config)
		if _, ok := got.published[leaving]; ok || !slices.Equal(slices.Sorted(maps.Keys(got.published)), []string{staying}) {
			return fmt.Errorf("%s; want the rows of %s alone", got, staying)
		}
		if _, err := workOf(t, ctx, sc, leaving); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the Work of %s: %v", leaving, err)
		}
		return nil
	})

	// A deleted ShardingConfig takes its Works and all its rows.
	if err := hub.Client.Delete(ctx, sc); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the ShardingConfig, its Works and its rows gone", func() error {
		if err := hub.Client.Get(ctx, config, &ctrlmeshv1alpha1.ShardingConfig{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the ShardingConfig: %v", err)
		}
		if _, err := workOf(t, ctx, sc, staying); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the Work of %s: %v", staying, err)
		}
		if got := rowsOf(store, config); len(got.published)+len(got.reported) > 0 {
			return fmt.Errorf("rows left: %s", got)
		}
		return nil
	})
}

// configOver is a ShardingConfig "op" in namespace sharding the ConfigMaps
// of pods labeled app=op in clusters, in scope.
func configOver(namespace string, scope ctrlmeshv1alpha1.ShardingScope, clusters ...string) *ctrlmeshv1alpha1.ShardingConfig {
	return &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
			}}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: clusters},
			Scope:    scope,
		},
	}
}
