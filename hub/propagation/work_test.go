package propagation

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	workv1alpha2 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha2"
	"github.com/karmada-io/karmada/pkg/util"
	"github.com/karmada-io/karmada/pkg/util/names"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// testConfig is a ShardingConfig of 8 buckets as the API server serves it,
// defaults set.
func testConfig(namespace string, scope ctrlmeshv1alpha1.ShardingScope) *ctrlmeshv1alpha1.ShardingConfig {
	return &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector:   metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "op-lock"},
			Webhook:    &ctrlmeshv1alpha1.WebhookConfig{CertDir: "/tmp/certs", Port: 9443},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}},
			}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"m1", "m2"}},
			Scope:    scope,
			Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 8, PodsPerShard: 1},
		},
	}
}

// singleShardRoute builds the route of config for cluster at generation,
// one shard of every bucket served by pod op-0.
func singleShardRoute(t testing.TB, config *ctrlmeshv1alpha1.ShardingConfig, cluster string, generation int64) *ctrlmeshv1alpha1.ShardRoute {
	t.Helper()
	space := sharding.MustSpace(8)
	none, _ := space.NewSet() // the empty set cannot fail
	op0 := route.PodID{Cluster: cluster, Name: "op-0"}
	table := route.Table{Generation: generation, Shards: []route.Shard{{
		ID: "0", Cluster: cluster, Pods: []route.PodID{op0}, Buckets: space.AllBuckets(), PendingBuckets: none,
	}}}
	r, err := route.Build(config, cluster, table, map[route.PodID]string{op0: "10.0.0.1"}, route.FleetValidity)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newCluster names a member cluster for one test and creates its execution
// namespace on the hub.
func newCluster(t testing.TB, ctx context.Context, base string) string {
	t.Helper()
	cluster := unique(base)
	createNamespace(t, ctx, hub.Client, names.GenerateExecutionSpaceName(cluster))
	return cluster
}

func getWork(t testing.TB, ctx context.Context, config *ctrlmeshv1alpha1.ShardingConfig, cluster string) *workv1alpha1.Work {
	t.Helper()
	var work workv1alpha1.Work
	key := routework.WorkKey(cluster, config.Namespace, config.Name)
	if err := hub.Client.Get(ctx, key, &work); err != nil {
		t.Fatalf("reading Work %s: %v", key, err)
	}
	return &work
}

// manifest decodes the Work's one manifest.
func manifest(t *testing.T, work *workv1alpha1.Work) *ctrlmeshv1alpha1.ShardRoute {
	t.Helper()
	if n := len(work.Spec.Workload.Manifests); n != 1 {
		t.Fatalf("the Work has %d manifests, want 1", n)
	}
	raw := work.Spec.Workload.Manifests[0].Raw
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatal(err)
	}
	if _, ok := fields["status"]; ok {
		t.Errorf("the manifest has a status: %s", raw)
	}
	if _, ok, _ := unstructured.NestedFieldNoCopy(fields, "metadata", "creationTimestamp"); ok {
		t.Errorf("the manifest has a creationTimestamp: %s", raw)
	}
	var route ctrlmeshv1alpha1.ShardRoute
	if err := json.Unmarshal(raw, &route); err != nil {
		t.Fatal(err)
	}
	return &route
}

func TestWriterSync(t *testing.T) {
	ctx := context.Background()
	writer := &Writer{Client: writerClient(t)}
	cluster := newCluster(t, ctx, "sync")
	config := testConfig(unique("team-sync"), ctrlmeshv1alpha1.ScopePerCluster)

	first := singleShardRoute(t, config, cluster, 1)
	if err := writer.Sync(ctx, config, cluster, first); err != nil {
		t.Fatal(err)
	}
	work := getWork(t, ctx, config, cluster)
	if want := names.GenerateWorkName("ShardRoute", config.Name, config.Namespace); work.Name != want {
		t.Errorf("Work name %s, want %s", work.Name, want)
	}
	id := work.Labels[workv1alpha2.WorkPermanentIDLabel]
	if id == "" || work.Labels[ctrlmeshv1alpha1.WorkConfigNamespaceLabel] != config.Namespace || work.Labels[ctrlmeshv1alpha1.WorkConfigNameLabel] != config.Name {
		t.Errorf("Work labels %v: want a permanent ID and the config's namespace and name", work.Labels)
	}
	if work.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation] != first.Spec.RulesHash {
		t.Errorf("Work annotations %v, want %s=%s", work.Annotations, ctrlmeshv1alpha1.WorkRulesHashAnnotation, first.Spec.RulesHash)
	}
	if len(work.Finalizers) != 0 {
		t.Errorf("Work finalizers %v, want none in standalone mode", work.Finalizers)
	}
	got := manifest(t, work)
	if got.APIVersion != "ctrlmesh.io/v1alpha1" || got.Kind != "ShardRoute" || got.Namespace != config.Namespace || got.Name != config.Name {
		t.Errorf("manifest %s %s %s/%s, want the config's ShardRoute", got.APIVersion, got.Kind, got.Namespace, got.Name)
	}
	if !equality.Semantic.DeepEqual(got.Spec, first.Spec) {
		t.Errorf("manifest spec %+v, want %+v", got.Spec, first.Spec)
	}
	wantLabels := map[string]string{"karmada.io/managed": "true", workv1alpha2.WorkPermanentIDLabel: id}
	wantAnnotations := map[string]string{
		workv1alpha2.WorkNamespaceAnnotation: work.Namespace,
		workv1alpha2.WorkNameAnnotation:      work.Name,
		workv1alpha2.ManagedLabels:           "karmada.io/managed,work.karmada.io/permanent-id",
		workv1alpha2.ManagedAnnotation:       "resourcetemplate.karmada.io/managed-annotations,resourcetemplate.karmada.io/managed-labels,work.karmada.io/name,work.karmada.io/namespace",
	}
	if !equality.Semantic.DeepEqual(got.Labels, wantLabels) || !equality.Semantic.DeepEqual(got.Annotations, wantAnnotations) {
		t.Errorf("manifest labels %v and annotations %v, want %v and %v", got.Labels, got.Annotations, wantLabels, wantAnnotations)
	}

	if err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 1)); err != nil {
		t.Fatal(err)
	}
	if again := getWork(t, ctx, config, cluster); again.ResourceVersion != work.ResourceVersion {
		t.Errorf("syncing the same rules wrote the Work: resourceVersion %s, was %s", again.ResourceVersion, work.ResourceVersion)
	}

	second := singleShardRoute(t, config, cluster, 2)
	if err := writer.Sync(ctx, config, cluster, second); err != nil {
		t.Fatal(err)
	}
	updated := getWork(t, ctx, config, cluster)
	if updated.ResourceVersion == work.ResourceVersion || updated.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation] != second.Spec.RulesHash {
		t.Errorf("changed rules did not update the Work: annotations %v", updated.Annotations)
	}
	if got := manifest(t, updated); got.Spec.RoutingGeneration != 2 || got.Labels[workv1alpha2.WorkPermanentIDLabel] != id {
		t.Errorf("updated manifest: generation %d and permanent ID %q, want 2 and %q", got.Spec.RoutingGeneration, got.Labels[workv1alpha2.WorkPermanentIDLabel], id)
	}
	if updated.Labels[workv1alpha2.WorkPermanentIDLabel] != id {
		t.Errorf("the update changed the Work's permanent ID to %q", updated.Labels[workv1alpha2.WorkPermanentIDLabel])
	}

	if err := writer.Sync(ctx, config, "elsewhere", second); err == nil || !strings.Contains(err.Error(), "does not belong") {
		t.Errorf("syncing another cluster's route: %v, want an error", err)
	}
}

// TestWriterKarmadaFinalizer shows why the finalizer is for Karmada mode
// only: a deleted Work stays until someone removes it.
func TestWriterKarmadaFinalizer(t *testing.T) {
	ctx := context.Background()
	writer := &Writer{Client: writerClient(t), KarmadaFinalizer: true}
	cluster := newCluster(t, ctx, "finalizer")
	config := testConfig(unique("team-finalizer"), ctrlmeshv1alpha1.ScopePerCluster)
	if err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 1)); err != nil {
		t.Fatal(err)
	}
	work := getWork(t, ctx, config, cluster)
	if !slices.Equal(work.Finalizers, []string{util.ExecutionControllerFinalizer}) {
		t.Fatalf("finalizers %v, want %s", work.Finalizers, util.ExecutionControllerFinalizer)
	}
	if err := writer.Delete(ctx, config, cluster); err != nil {
		t.Fatal(err)
	}
	if work = getWork(t, ctx, config, cluster); work.DeletionTimestamp.IsZero() {
		t.Fatal("the deleted Work has no deletionTimestamp")
	}
	err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 2))
	if err == nil || !strings.Contains(err.Error(), "is being deleted") {
		t.Errorf("syncing new rules into a Work being deleted: %v, want an error", err)
	}

	// What Karmada's execution controller does once the member is clean.
	controllerutil.RemoveFinalizer(work, util.ExecutionControllerFinalizer)
	if err := hub.Client.Update(ctx, work); err != nil {
		t.Fatal(err)
	}
	if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(work), work); !apierrors.IsNotFound(err) {
		t.Errorf("the Work without finalizer: %v, want it gone", err)
	}
}

func TestWriterPruneAndDelete(t *testing.T) {
	ctx := context.Background()
	writer := &Writer{Client: writerClient(t)}
	a, b, c := newCluster(t, ctx, "prune-a"), newCluster(t, ctx, "prune-b"), newCluster(t, ctx, "prune-c")
	config := testConfig(unique("team-prune"), ctrlmeshv1alpha1.ScopePerCluster)
	other := testConfig(config.Namespace, ctrlmeshv1alpha1.ScopePerCluster)
	other.Name = "other"
	for _, cluster := range []string{a, b, c} {
		if err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := writer.Sync(ctx, other, b, singleShardRoute(t, other, b, 1)); err != nil {
		t.Fatal(err)
	}

	clustersOf := func(cfg *ctrlmeshv1alpha1.ShardingConfig) []string {
		t.Helper()
		works, err := writer.List(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var clusters []string
		for i := range works {
			report, err := routework.ReadStatus(&works[i])
			if err != nil {
				t.Fatal(err)
			}
			clusters = append(clusters, report.Cluster)
		}
		return clusters
	}
	if got := clustersOf(config); !slices.Equal(got, []string{a, b, c}) {
		t.Fatalf("List: Works for %v, want %v", got, []string{a, b, c})
	}

	pruned, err := writer.Prune(ctx, config, []string{a})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pruned, []string{b, c}) {
		t.Errorf("Prune pruned %v, want %v", pruned, []string{b, c})
	}
	if got := clustersOf(config); !slices.Equal(got, []string{a}) {
		t.Errorf("after Prune, Works for %v, want %v", got, []string{a})
	}
	if got := clustersOf(other); !slices.Equal(got, []string{b}) {
		t.Errorf("after Prune, the other config's Works are for %v, want %v", got, []string{b})
	}

	for range 2 { // deleting a deleted Work is no error
		if err := writer.Delete(ctx, config, a); err != nil {
			t.Fatal(err)
		}
	}
	if got := clustersOf(config); len(got) != 0 {
		t.Errorf("after Delete, Works for %v, want none", got)
	}
}

// TestWriterLabelerRights: the Work carries the labeler's rights on exactly
// the resources the limits name once the member's agent has claimed its
// namespace, and they follow the limits.
func TestWriterLabelerRights(t *testing.T) {
	ctx := context.Background()
	writer := &Writer{Client: writerClient(t)}
	cluster := newCluster(t, ctx, "rights")
	config := testConfig(unique("team-rights"), ctrlmeshv1alpha1.ScopePerCluster)
	rulesOf := func() []rbacv1.PolicyRule {
		t.Helper()
		m, err := routework.DecodeAll(getWork(t, ctx, config, cluster))
		if err != nil {
			t.Fatal(err)
		}
		if m.Labeler == nil {
			return nil
		}
		if s := m.Labeler.Binding.Subjects; len(s) != 1 || s[0].Namespace != "agents" || s[0].Name != ctrlmeshv1alpha1.AgentServiceAccount {
			t.Errorf("the labeler binding's subjects %+v, want the ServiceAccount agents/%s", s, ctrlmeshv1alpha1.AgentServiceAccount)
		}
		return m.Labeler.Role.Rules
	}

	// Not joined yet: no namespace to bind, so no rights.
	first := singleShardRoute(t, config, cluster, 1)
	if err := writer.Sync(ctx, config, cluster, first); err != nil {
		t.Fatal(err)
	}
	if rules := rulesOf(); rules != nil {
		t.Fatalf("rights %+v before the agent claimed its namespace", rules)
	}

	// Joined: the same rules, now with the rights.
	mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster}}
	env.Create(t, ctx, hub.Client, mc)
	mc.Status.ClusterClaims = []clusterv1.ManagedClusterClaim{{Name: membership.ClaimAgentNamespace, Value: "agents"}}
	mc.Status.Conditions = []metav1.Condition{}
	if err := hub.Client.Status().Update(ctx, mc); err != nil {
		t.Fatal(err)
	}
	if err := writer.Sync(ctx, config, cluster, first); err != nil {
		t.Fatal(err)
	}
	verbs := []string{"list", "patch", "watch"}
	if rules, want := rulesOf(), []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: verbs}}; !equality.Semantic.DeepEqual(rules, want) {
		t.Fatalf("rights %+v, want %+v", rules, want)
	}

	// A limit on Secrets and Deployments brings their rights; a limit on
	// every resource of a group brings none.
	config.Spec.Limits = append(config.Spec.Limits, ctrlmeshv1alpha1.Limit{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{
		{APIGroups: []string{""}, Resources: []string{"secrets"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}},
		{APIGroups: []string{"batch"}, Resources: []string{"*"}},
	}})
	if err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 2)); err != nil {
		t.Fatal(err)
	}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"}, Verbs: verbs},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: verbs},
	}
	if rules := rulesOf(); !equality.Semantic.DeepEqual(rules, want) {
		t.Fatalf("rights %+v, want %+v", rules, want)
	}
}

// TestWriterUpdatesOverStatusWrites: new rules reach a Work whose status a
// member wrote after the Writer's cache last saw it, in one request, the
// status kept; a finalizer another controller added meanwhile survives a
// Writer that adds its own. The Writer reads Works from the hub's cache,
// which lags behind the members' status writes: an update of the Work as
// read conflicted again and again (make bench-scale: 130 refused updates a
// second against 30 written).
func TestWriterUpdatesOverStatusWrites(t *testing.T) {
	ctx := context.Background()
	cluster := newCluster(t, ctx, "stale")
	config := testConfig(unique("team-stale"), ctrlmeshv1alpha1.ScopePerCluster)
	counted := &countingWrites{Client: writerClient(t)}
	stale := &staleReads{Client: counted}
	writer := &Writer{Client: stale}
	if err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 1)); err != nil {
		t.Fatal(err)
	}
	stale.work = getWork(t, ctx, config, cluster)

	// The member reports, after the cache's copy.
	reported := stale.work.DeepCopy()
	reported.Status.Conditions = []metav1.Condition{{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue,
		Reason: ctrlmeshv1alpha1.ReasonWorkAppliedSuccessful, Message: "applied", LastTransitionTime: metav1.Now()}}
	if err := hub.Client.Status().Update(ctx, reported); err != nil {
		t.Fatal(err)
	}
	counted.writes = 0
	second := singleShardRoute(t, config, cluster, 2)
	if err := writer.Sync(ctx, config, cluster, second); err != nil {
		t.Fatalf("new rules over a Work the member reported on since the cache saw it: %v", err)
	}
	if counted.writes != 1 {
		t.Errorf("%d writes, want 1", counted.writes)
	}
	work := getWork(t, ctx, config, cluster)
	if got := manifest(t, work); got.Spec.RulesHash != second.Spec.RulesHash || work.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation] != second.Spec.RulesHash {
		t.Errorf("the Work carries rules %s (annotation %s), want %s", got.Spec.RulesHash, work.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation], second.Spec.RulesHash)
	}
	if len(work.Status.Conditions) != 1 || work.Status.Conditions[0].Message != "applied" {
		t.Errorf("the member's status was not kept: %+v", work.Status.Conditions)
	}

	// Another controller's finalizer, added after the cache's copy, while
	// the Writer adds Karmada's.
	stale.work = work.DeepCopy()
	const other = "example.com/keep"
	controllerutil.AddFinalizer(work, other)
	if err := hub.Client.Update(ctx, work); err != nil {
		t.Fatal(err)
	}
	writer.KarmadaFinalizer = true
	err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 3))
	if work = getWork(t, ctx, config, cluster); !controllerutil.ContainsFinalizer(work, other) {
		t.Errorf("finalizers %v after a Sync from a stale copy (%v): %s went", work.Finalizers, err, other)
	}
	controllerutil.RemoveFinalizer(work, other)
	if err := hub.Client.Update(ctx, work); err != nil {
		t.Fatal(err)
	}
}

// staleReads serves Gets of Works from work, a copy taken earlier, as a
// cache behind the API server would; with missing, as one that does not
// show any Work yet.
type staleReads struct {
	client.Client
	work    *workv1alpha1.Work
	missing bool
}

func (s *staleReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*workv1alpha1.Work); ok && s.missing {
		return apierrors.NewNotFound(workv1alpha1.SchemeGroupVersion.WithResource("works").GroupResource(), key.Name)
	}
	if w, ok := obj.(*workv1alpha1.Work); ok && s.work != nil && key == client.ObjectKeyFromObject(s.work) {
		s.work.DeepCopyInto(w)
		return nil
	}
	return s.Client.Get(ctx, key, obj, opts...)
}

// countingWrites counts creations, updates and patches.
type countingWrites struct {
	client.Client
	writes int
}

func (c *countingWrites) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.writes++
	return c.Client.Create(ctx, obj, opts...)
}

func (c *countingWrites) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.writes++
	return c.Client.Update(ctx, obj, opts...)
}

func (c *countingWrites) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.writes++
	return c.Client.Patch(ctx, obj, patch, opts...)
}

// TestWriterDoesNotRewriteBehindItsCache: rules the Writer wrote are not
// written again while its cache still shows the Work before the write;
// they are once the Work's spec changed after the write (a newer
// generation), or the Work is another one (deleted and created again).
// Every report of a member brings its config back to Sync all its members,
// and the cache lags behind the API server: at 100 configs x 100 members
// the hub wrote the Works 121 times a second with the content they had.
func TestWriterDoesNotRewriteBehindItsCache(t *testing.T) {
	ctx := context.Background()
	cluster := newCluster(t, ctx, "behind")
	config := testConfig(unique("team-behind"), ctrlmeshv1alpha1.ScopePerCluster)
	counted := &countingWrites{Client: writerClient(t)}
	stale := &staleReads{Client: counted}
	writer := &Writer{Client: stale}
	if err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 1)); err != nil {
		t.Fatal(err)
	}
	stale.work = getWork(t, ctx, config, cluster) // the cache, from now on behind
	second := singleShardRoute(t, config, cluster, 2)
	for i, want := range []int{1, 0, 0} {
		counted.writes = 0
		if err := writer.Sync(ctx, config, cluster, second); err != nil {
			t.Fatal(err)
		}
		if counted.writes != want {
			t.Errorf("Sync %d of the same rules with the cache behind: %d writes, want %d", i+1, counted.writes, want)
		}
	}

	// Someone else changed the spec since: the cache shows a newer
	// generation, carrying other rules.
	work := getWork(t, ctx, config, cluster)
	if err := routework.SetManifests(work, singleShardRoute(t, config, cluster, 3), nil); err != nil {
		t.Fatal(err)
	}
	work.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation] = "changed-elsewhere"
	if err := hub.Client.Update(ctx, work); err != nil {
		t.Fatal(err)
	}
	stale.work = getWork(t, ctx, config, cluster)
	counted.writes = 0
	if err := writer.Sync(ctx, config, cluster, second); err != nil {
		t.Fatal(err)
	}
	if got := getWork(t, ctx, config, cluster); counted.writes != 1 || manifest(t, got).Spec.RulesHash != second.Spec.RulesHash {
		t.Errorf("after a change of spec elsewhere: %d writes, the Work carries %s; want the rules %s written again", counted.writes, manifest(t, got).Spec.RulesHash, second.Spec.RulesHash)
	}

	// Deleted and created again, by someone else, with the older rules.
	recreated := stale.work.DeepCopy()
	if err := hub.Client.Delete(ctx, recreated); err != nil {
		t.Fatal(err)
	}
	recreated.ResourceVersion, recreated.UID = "", ""
	if err := routework.SetManifests(recreated, singleShardRoute(t, config, cluster, 1), nil); err != nil {
		t.Fatal(err)
	}
	recreated.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation] = "older"
	if err := hub.Client.Create(ctx, recreated); err != nil {
		t.Fatal(err)
	}
	stale.work = getWork(t, ctx, config, cluster)
	counted.writes = 0
	if err := writer.Sync(ctx, config, cluster, second); err != nil {
		t.Fatal(err)
	}
	if counted.writes != 1 {
		t.Errorf("a Work created again by someone else: %d writes, want the rules written to it", counted.writes)
	}
}

// TestWriterReadsWhatItsCacheDoesNotShowYet: a Work the Writer created,
// which its cache does not show yet, is read from the API server, not
// created again (each creation refused as the Work exists, up to the
// retries' end: 88 refused creations a second at 100 x 100); a Work
// deleted since is created again.
func TestWriterReadsWhatItsCacheDoesNotShowYet(t *testing.T) {
	ctx := context.Background()
	cluster := newCluster(t, ctx, "unseen")
	config := testConfig(unique("team-unseen"), ctrlmeshv1alpha1.ScopePerCluster)
	counted := &countingWrites{Client: writerClient(t)}
	stale := &staleReads{Client: counted, missing: true}
	writer := &Writer{Client: stale, Reader: counted}
	first := singleShardRoute(t, config, cluster, 1)
	for i, want := range []int{1, 0} {
		counted.writes = 0
		if err := writer.Sync(ctx, config, cluster, first); err != nil {
			t.Fatalf("Sync %d with the cache showing no Work: %v", i+1, err)
		}
		if counted.writes != want {
			t.Errorf("Sync %d with the cache showing no Work: %d writes, want %d", i+1, counted.writes, want)
		}
	}
	second := singleShardRoute(t, config, cluster, 2)
	if err := writer.Sync(ctx, config, cluster, second); err != nil {
		t.Fatal(err)
	}
	if got := manifest(t, getWork(t, ctx, config, cluster)); got.Spec.RulesHash != second.Spec.RulesHash {
		t.Errorf("the Work carries %s, want the new rules %s", got.Spec.RulesHash, second.Spec.RulesHash)
	}

	if err := hub.Client.Delete(ctx, getWork(t, ctx, config, cluster)); err != nil {
		t.Fatal(err)
	}
	counted.writes = 0
	if err := writer.Sync(ctx, config, cluster, second); err != nil {
		t.Fatal(err)
	}
	if got := manifest(t, getWork(t, ctx, config, cluster)); counted.writes != 1 || got.Spec.RulesHash != second.Spec.RulesHash {
		t.Errorf("a Work deleted since: %d writes, carries %s; want it created again with %s", counted.writes, got.Spec.RulesHash, second.Spec.RulesHash)
	}
}

// TestWriterListsThroughIndex: a Writer whose cache indexes Works by their
// ShardingConfig (IndexByConfig, as hub.Run sets it up) lists exactly the
// Works the config's labels select, and prunes through that list.
func TestWriterListsThroughIndex(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	informers, cached := startCache(t, ctx, cache.Options{}, func(c cache.Cache) error { return IndexByConfig(ctx, c) })
	direct := &Writer{Client: writerClient(t)}
	writer := &Writer{Client: cached, Indexed: true}
	clusters := []string{newCluster(t, ctx, "index-a"), newCluster(t, ctx, "index-b")}
	namespace := unique("team-index")
	mine, other := testConfig(namespace, ctrlmeshv1alpha1.ScopePerCluster), testConfig(namespace, ctrlmeshv1alpha1.ScopePerCluster)
	other.Name = "other-op"
	for _, config := range []*ctrlmeshv1alpha1.ShardingConfig{mine, other} {
		for _, cluster := range clusters {
			if err := direct.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	want, err := direct.List(ctx, mine)
	if err != nil {
		t.Fatal(err)
	}
	keys := func(works []workv1alpha1.Work) []string {
		var out []string
		for i := range works {
			out = append(out, client.ObjectKeyFromObject(&works[i]).String())
		}
		return out
	}
	if len(want) != 2 {
		t.Fatalf("the labels select %v, want the config's 2 Works", keys(want))
	}
	env.Eventually(t, time.Minute, "the index lists the config's Works", func() error {
		got, err := writer.List(ctx, mine)
		if err != nil {
			return err
		}
		if !slices.Equal(keys(got), keys(want)) {
			return fmt.Errorf("listed %v, want %v", keys(got), keys(want))
		}
		return nil
	})
	// One value a config, for every namespace: none for a Work in its
	// own namespace (IndexByConfig).
	informer, err := informers.GetInformer(ctx, &workv1alpha1.Work{})
	if err != nil {
		t.Fatal(err)
	}
	for _, value := range informer.(toolscache.SharedIndexInformer).GetIndexer().ListIndexFuncValues(configIndexName) {
		if !strings.HasPrefix(value, allNamespaces) {
			t.Errorf("the index holds Works under %q, a value of one namespace", value)
		}
	}
	pruned, err := writer.Prune(ctx, mine, clusters[:1])
	if err != nil || !slices.Equal(pruned, clusters[1:]) {
		t.Fatalf("pruned %v (%v), want %v", pruned, err, clusters[1:])
	}
	if left, err := direct.List(ctx, other); err != nil || len(left) != 2 {
		t.Errorf("the other config's Works: %v (%v), want both kept", keys(left), err)
	}
}

// TestKnownHoldsTheCachedUID: once asked about a Work as cached, the
// Writer's record of it holds the cache's copy of its UID, not the copy
// the API server's answer brought, and still tells its rules.
func TestKnownHoldsTheCachedUID(t *testing.T) {
	answered := routework.NewWork(types.NamespacedName{Namespace: "karmada-es-m1", Name: "op-1234"})
	answered.UID, answered.Generation = "6f1c2b9e-0d3a-4c59-9a57-3b1f0e2d4c6a", 2
	answered.Annotations = map[string]string{ctrlmeshv1alpha1.WorkRulesHashAnnotation: "hash"}
	cached := answered.DeepCopy()
	cached.UID = types.UID(strings.Clone(string(answered.UID)))
	w := &Writer{}
	key := client.ObjectKeyFromObject(answered)
	w.remember(key, answered)
	if hash, ok := w.Known(cached); !ok || hash != "hash" {
		t.Fatalf("Known: %q, %v; want the rules hash remembered", hash, ok)
	}
	if unsafe.StringData(string(w.known[key].uid)) != unsafe.StringData(string(cached.UID)) {
		t.Errorf("the record holds a copy of the UID of its own, not the cached Work's")
	}
	if hash, ok := w.Known(cached); !ok || hash != "hash" {
		t.Errorf("Known asked again: %q, %v; want the rules hash remembered", hash, ok)
	}
}
