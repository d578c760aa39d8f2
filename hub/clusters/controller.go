// Package clusters is the hub's cluster controller: it accepts member
// clusters (when told to), creates their cluster namespaces and execution
// namespaces (the latter where Karmada does not run: where it does, Karmada
// makes them), decides from
// their heartbeat Leases (and Karmada's Cluster objects, where Karmada runs)
// whether they are available, reports that in the ManagedClusters' status
// conditions, and keeps the clusters table of the hub's state.Store, from
// which the ShardingConfig controller selects the clusters it places in.
package clusters

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

// ControllerName names the controller in logs and metrics.
const ControllerName = "clusters"

// karmadaClusterGVK is Karmada's Cluster. It is read as unstructured so the
// controller needs it neither in the space nor served.
var karmadaClusterGVK = clusterv1alpha1.SchemeGroupVersion.WithKind("Cluster")

// Options of the controller.
type Options struct {
	// AutoAccept makes the controller accept every ManagedCluster by setting
	// its spec.hubAcceptsClient; otherwise an admin does. It needs the RBAC
	// RBACRules adds for it.
	AutoAccept bool
	// Changes, when not nil, receives an event naming each cluster (an
	// Object with only the name) whose record in the Store appeared,
	// disappeared, or changed in anything but its heartbeat expiry: wrap it
	// in source.Channel to reconcile what depends on clusters. A send blocks
	// the reconcile until it is received.
	Changes chan<- event.GenericEvent
	// RulesValidity is the validity of rules in Fleet scope, which the
	// agent grants in step with its heartbeat: a heartbeat stays fresh at
	// least route.LapseBound of it after the hub saw it. Default
	// route.FleetValidity; the ShardingConfig controller must write the
	// same into the routes.
	RulesValidity time.Duration
}

// Reconciler reconciles ManagedClusters, by name.
type Reconciler struct {
	// Store receives the clusters table. Required.
	Store *state.Store
	Options

	client client.Client
	// apiReader reads the latest ManagedCluster after a write conflict.
	apiReader client.Reader
	// leases is a cache of the heartbeat Leases only.
	leases client.Reader
	// karmadaClusters reads Karmada's Clusters; nil where the hub does not
	// serve them.
	karmadaClusters client.Reader
	// renewals is when the hub saw each cluster's heartbeat renewed.
	renewals renewals
}

// SetupWithManager adds the controller, and a cache of the heartbeat Leases,
// to mgr. It watches Karmada's Clusters only when the hub serves them.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Store == nil {
		return errors.New("clusters: no state store")
	}
	r.client, r.apiReader = mgr.GetClient(), mgr.GetAPIReader()

	// Only Leases of the one name: the hub has many others (nodes, leader
	// elections), and RBAC can then grant that name alone.
	leases, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		// As the manager's cache (hub.Run): one heartbeat Lease per member.
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&coordinationv1.Lease{}: {Field: fields.OneTermEqualSelector("metadata.name", ctrlmeshv1alpha1.HeartbeatLeaseName)},
		},
	})
	if err != nil {
		return fmt.Errorf("clusters: creating the heartbeat lease cache: %w", err)
	}
	if err := mgr.Add(leases); err != nil {
		return fmt.Errorf("clusters: adding the heartbeat lease cache: %w", err)
	}
	r.leases = leases

	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&clusterv1.ManagedCluster{}).
		WatchesRawSource(source.Kind(leases, &coordinationv1.Lease{},
			handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, lease *coordinationv1.Lease) []reconcile.Request {
				if lease.Name != ctrlmeshv1alpha1.HeartbeatLeaseName {
					return nil
				}
				// The cluster namespace is named as the cluster.
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: lease.Namespace}}}
			})))

	_, err = mgr.GetRESTMapper().RESTMapping(karmadaClusterGVK.GroupKind(), karmadaClusterGVK.Version)
	switch {
	case err == nil:
		// Karmada's Cluster of a member has its name, or, when Karmada
		// knows it under another, the ID its agent claims.
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), &clusterv1.ManagedCluster{}, clusterIDIndex, func(o client.Object) []string {
			if id := membership.ClaimedClusterID(o.(*clusterv1.ManagedCluster)); id != "" {
				return []string{id}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("clusters: indexing ManagedClusters by cluster ID: %w", err)
		}
		b = b.Watches(newKarmadaCluster(), handler.EnqueueRequestsFromMapFunc(r.clustersOfKarmadaCluster))
		r.karmadaClusters = mgr.GetCache()
	case !meta.IsNoMatchError(err):
		return fmt.Errorf("clusters: asking whether the hub serves %s: %w", karmadaClusterGVK, err)
	}
	return b.Complete(r)
}

// clusterIDIndex indexes ManagedClusters by the ID their agent claims.
const clusterIDIndex = "ctrlmesh.clusterID"

// clustersOfKarmadaCluster names the ManagedClusters a Karmada Cluster
// bears on: the one of its name, and those whose agent claims its ID.
func (r *Reconciler) clustersOfKarmadaCluster(ctx context.Context, o client.Object) []reconcile.Request {
	out := []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
	id, _, _ := unstructured.NestedString(o.(*unstructured.Unstructured).Object, "spec", "id")
	if id == "" {
		return out
	}
	var list clusterv1.ManagedClusterList
	if err := r.client.List(ctx, &list, client.MatchingFields{clusterIDIndex: id}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the ManagedClusters claiming a Karmada Cluster's ID", "cluster", o.GetName())
		return out
	}
	for _, mc := range list.Items {
		if mc.Name != o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: mc.Name}})
		}
	}
	return out
}

func newKarmadaCluster() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(karmadaClusterGVK)
	return u
}

// Reconcile brings one cluster's acceptance, execution namespace, conditions
// and Store record up to date, and asks to run again when its heartbeat
// runs out.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	name := req.Name
	var mc clusterv1.ManagedCluster
	if err := r.client.Get(ctx, req.NamespacedName, &mc); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("reading the ManagedCluster: %w", err)
		}
		r.renewals.forget(name)
		existed, err := r.Store.DeleteCluster(name)
		if err != nil {
			return reconcile.Result{}, err
		}
		if existed {
			r.notify(ctx, name)
		}
		return reconcile.Result{}, nil
	}

	if !mc.Spec.HubAcceptsClient && r.AutoAccept {
		patch := client.MergeFrom(mc.DeepCopy())
		mc.Spec.HubAcceptsClient = true
		if err := r.client.Patch(ctx, &mc, patch); err != nil {
			return reconcile.Result{}, fmt.Errorf("accepting the cluster: %w", err)
		}
		log.Info("accepted the cluster")
	}

	lease, err := r.heartbeatLease(ctx, name)
	if err != nil {
		return reconcile.Result{}, err
	}
	karmada, err := r.karmadaRegistration(ctx, &mc)
	if err != nil {
		return reconcile.Result{}, err
	}
	// An agent's Lease lives in the cluster namespace: while there is a
	// Lease, the hub has seen to the namespaces.
	if mc.Spec.HubAcceptsClient && lease == nil {
		if err := r.ensureNamespaces(ctx, name); err != nil {
			return reconcile.Result{}, err
		}
	}

	now := time.Now()
	avail := assessAvailability(now, lease, r.renewals.observe(name, lease, judgedStale(mc.Status.Conditions), now), r.rulesValidity(), karmada)
	// The working model first: it is what the hub decides by, and anyone
	// who sees the condition may expect the hub to act on it already.
	if err := r.record(ctx, &mc, avail); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.writeConditions(ctx, &mc, conditions(mc.Status.Conditions, mc.Spec.HubAcceptsClient, avail)); err != nil {
		return reconcile.Result{}, err
	}
	if now.Before(avail.heartbeatExpiry) {
		return reconcile.Result{RequeueAfter: avail.heartbeatExpiry.Sub(now)}, nil
	}
	return reconcile.Result{}, nil
}

// heartbeatLease returns the cluster's heartbeat Lease, or nil.
func (r *Reconciler) heartbeatLease(ctx context.Context, cluster string) (*coordinationv1.Lease, error) {
	var lease coordinationv1.Lease
	err := r.leases.Get(ctx, client.ObjectKey{Namespace: ctrlmeshv1alpha1.ClusterNamespace(cluster), Name: ctrlmeshv1alpha1.HeartbeatLeaseName}, &lease)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the heartbeat lease: %w", err)
	}
	return &lease, nil
}

// karmadaRegistration returns what Karmada knows of mc's member; nil where
// the hub serves no Karmada Clusters.
func (r *Reconciler) karmadaRegistration(ctx context.Context, mc *clusterv1.ManagedCluster) (*karmadaRegistration, error) {
	if r.karmadaClusters == nil {
		return nil, nil
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(karmadaClusterGVK.GroupVersion().WithKind(karmadaClusterGVK.Kind + "List"))
	if err := r.karmadaClusters.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing Karmada's Clusters: %w", err)
	}
	k := &karmadaRegistration{name: mc.Name, clusterID: membership.ClaimedClusterID(mc), clusters: make([]clusterv1alpha1.Cluster, len(list.Items))}
	for i := range list.Items {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &k.clusters[i]); err != nil {
			return nil, fmt.Errorf("decoding Karmada's Cluster %s: %w", list.Items[i].GetName(), err)
		}
	}
	return k, nil
}

// judgedStale reports whether the Available condition of a cluster says
// its heartbeat was judged stale: the agent stopped renewing it (OCM's
// reason) — not that there was none yet, and not that the cluster was
// unavailable for another reason (Karmada's Cluster) while the heartbeat
// was fresh and the cluster's proxies may have held valid rules.
func judgedStale(conditions []metav1.Condition) bool {
	c := meta.FindStatusCondition(conditions, clusterv1.ManagedClusterConditionAvailable)
	return c != nil && c.Reason == ctrlmeshv1alpha1.ReasonLeaseUpdateStopped
}

// ensureNamespaces sees to the namespaces of an accepted member: its
// execution namespace karmada-es-<cluster>, which holds its Works, and its
// cluster namespace <cluster>, where its heartbeat Lease lives (labeled as
// OCM's hub labels it).
//
// Where Karmada runs (the hub serves its Clusters) the hub creates neither,
// and holds no right to (KarmadaRBACRules). The execution namespace is
// Karmada's: its cluster controller creates it when the member joins Karmada
// and deletes it, with every Work in it, when the member leaves; one made
// ahead of Karmada would outlive the member's unjoin or hold Works for a
// cluster Karmada never applies to. While Karmada has no Cluster for the
// member, its Available condition says so (ReasonKarmadaClusterNotFound,
// with what to do), and Karmada's Cluster appearing reconciles the member
// again. The cluster namespace is the hub admin's there, made with the
// member's ServiceAccount and RBAC (the hub chart's target=karmada renders
// it, labeled so that Karmada does not copy it into every member).
//
// Elsewhere the hub creates both unless they exist, the execution namespace
// first. Creating and ignoring AlreadyExists needs no right to read
// namespaces.
func (r *Reconciler) ensureNamespaces(ctx context.Context, cluster string) error {
	if r.karmadaClusters != nil {
		return nil
	}
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: names.GenerateExecutionSpaceName(cluster)}},
		{ObjectMeta: metav1.ObjectMeta{Name: ctrlmeshv1alpha1.ClusterNamespace(cluster), Labels: map[string]string{clusterv1.ClusterNameLabelKey: cluster}}},
	} {
		err := r.client.Create(ctx, ns)
		switch {
		case apierrors.IsAlreadyExists(err):
			continue
		case err != nil:
			return fmt.Errorf("creating namespace %s: %w", ns.Name, err)
		}
		ctrl.LoggerFrom(ctx).Info("created a namespace", "namespace", ns.Name)
	}
	return nil
}

// writeConditions sets the controller's conditions in mc's status when they
// differ. The agent writes the same status (its claims) by update: on a
// conflict the latest object is read again and only the conditions set on
// it, so the agent's writes survive.
func (r *Reconciler) writeConditions(ctx context.Context, mc *clusterv1.ManagedCluster, want []metav1.Condition) error {
	latest := mc.DeepCopy()
	conflicted := false
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if conflicted {
			if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(mc), latest); err != nil {
				return err
			}
		}
		if !setConditions(&latest.Status.Conditions, want) {
			return nil
		}
		err := r.client.Status().Update(ctx, latest)
		conflicted = apierrors.IsConflict(err)
		return err
	})
	if err != nil {
		return fmt.Errorf("writing the ManagedCluster's conditions: %w", err)
	}
	return nil
}

// record stores the cluster in the Store, telling Changes when more than
// its heartbeat expiry changed. Reconciles of one cluster never overlap, so
// reading the old record first is no race.
func (r *Reconciler) record(ctx context.Context, mc *clusterv1.ManagedCluster, avail availability) error {
	c := state.Cluster{
		Name:            mc.Name,
		Accepted:        mc.Spec.HubAcceptsClient,
		Available:       avail.status == metav1.ConditionTrue,
		Labels:          mc.Labels,
		HeartbeatExpiry: avail.heartbeatExpiry,
		HeartbeatLapsed: avail.lapsed,
	}
	if !c.Available {
		c.Reason = avail.reason
	}
	old, existed := r.Store.Snapshot().Cluster(c.Name)
	if _, err := r.Store.UpsertCluster(c); err != nil {
		return err
	}
	if existed && old.Accepted == c.Accepted && old.Available == c.Available && old.Reason == c.Reason && old.HeartbeatLapsed == c.HeartbeatLapsed &&
		maps.Equal(old.Labels, c.Labels) {
		return nil
	}
	if !existed || old.Available != c.Available {
		ctrl.LoggerFrom(ctx).Info("cluster availability", "available", c.Available, "reason", avail.reason, "accepted", c.Accepted)
	}
	r.notify(ctx, c.Name)
	return nil
}

func (r *Reconciler) notify(ctx context.Context, cluster string) {
	if r.Changes == nil {
		return
	}
	select {
	case r.Changes <- event.GenericEvent{Object: &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster}}}:
	case <-ctx.Done():
	}
}

// rulesValidity is Options.RulesValidity or its default.
func (r *Reconciler) rulesValidity() time.Duration {
	if r.RulesValidity == 0 {
		return route.FleetValidity
	}
	return r.RulesValidity
}
