// Package workapply is the agent's standalone mode: where no Karmada
// controllers run, it does their work for one member cluster. It watches the
// Karmada Works in the member's execution namespace on the hub
// (karmada-es-<cluster>), applies each Work's one manifest, a ShardRoute, to
// the member, deletes it when the Work goes, and reflects the applied
// object's status and health into the Work's status, following the
// conventions of Karmada's execution and work-status controllers. How the
// ShardRoute rides in the Work and how its status goes back is
// pkg/routework's, which the hub reads with too.
package workapply

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	workv1alpha2 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha2"
	"github.com/karmada-io/karmada/pkg/events"
	"github.com/karmada-io/karmada/pkg/util/names"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

const (
	// ControllerName names the controller, its log and its events.
	ControllerName = "workapply"
	// messageApplied is the Applied condition's message, as Karmada's
	// execution controller writes it.
	messageApplied = "Manifest has been successfully applied"

	// workIndex indexes member ShardRoutes by the Work ("namespace/name")
	// they were applied from.
	workIndex = "workapply.ctrlmesh.io/work"
	// targetIndex indexes Works by the object ("namespace/name") their
	// manifests name, to find the Work an unmanaged, conflicting object blocks.
	targetIndex = "workapply.ctrlmesh.io/target"
)

// MemberRBACRules is the member RBAC the Applier needs: read and write
// ShardRoutes (never their status), and record Events on them; read and
// write ClusterRoles and ClusterRoleBindings for the labeler's rights a Work
// carries, with escalate and bind on ClusterRoles: the API server lets a
// user grant only rights it holds, or escalate and bind, and the labeler
// roles grant what the agent does not hold before them. RBAC cannot
// restrict these to the labeler roles' names (they are per ShardingConfig,
// and create has no name); the agent's ValidatingAdmissionPolicy
// (agent.LabelerRBACPolicy) does, and the Applier applies only what passes
// routework.LabelerRBAC.Check.
func MemberRBACRules() []rbacv1.PolicyRule {
	write := []string{"get", "list", "watch", "create", "update", "delete"}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{ctrlmeshv1alpha1.GroupVersion.Group}, Resources: []string{"shardroutes"}, Verbs: write},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterroles"}, Verbs: append(slices.Clone(write), "escalate", "bind")},
		{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterrolebindings"}, Verbs: write},
	}
}

// Applier applies the Works of one member's execution namespace on the hub
// to the member cluster. The agent cannot add finalizers to Works (its hub
// RBAC allows no update of them), so a Work's deletion is observed: as the
// Work's absence from the hub cache, also after a restart, when every
// applied ShardRoute is mapped back to its Work.
type Applier struct {
	// HubConfig is the agent's hub identity, with the RBAC of
	// join.AgentHubRBAC(ClusterName).
	HubConfig *rest.Config
	// ClusterName is the member's name on the hub.
	ClusterName string
	// Recorder records Events on member objects (the agent may not write
	// Events on the hub).
	Recorder record.EventRecorder
	Log      logr.Logger

	namespace string        // the execution namespace
	hub       client.Client // Works, read from the hub cache
	hubReader client.Reader // Works, read from the hub API server
	member    client.Client // ShardRoutes, read from the member cache
}

// SetupWithManager registers the Applier with the member cluster's manager.
// It creates the hub cluster, whose cache holds only the Works of the
// execution namespace, and adds it to mgr; the controller runs on the
// elected replica only, as controllers do. mgr's space must know Works and
// ShardRoutes (pkg/space.New does), and its cache must hold all
// ShardRoutes, labeled or not, to see conflicting ones.
func (a *Applier) SetupWithManager(mgr ctrl.Manager) error {
	if a.HubConfig == nil || a.ClusterName == "" || a.Recorder == nil {
		return errors.New("workapply: hub config, cluster name and recorder are all required")
	}
	for _, obj := range []client.Object{&workv1alpha1.Work{}, &ctrlmeshv1alpha1.ShardRoute{}} {
		if _, _, err := mgr.GetScheme().ObjectKinds(obj); err != nil {
			return fmt.Errorf("workapply: the manager's space: %w", err)
		}
	}
	a.namespace = names.GenerateExecutionSpaceName(a.ClusterName)
	hubCluster, err := cluster.New(a.HubConfig, func(o *cluster.Options) {
		o.Scheme = mgr.GetScheme()
		o.Logger = a.Log.WithName("hub")
		o.Cache.DefaultNamespaces = map[string]cache.Config{a.namespace: {}}
	})
	if err != nil {
		return fmt.Errorf("workapply: creating the hub cluster: %w", err)
	}
	if err := mgr.Add(hubCluster); err != nil {
		return fmt.Errorf("workapply: adding the hub cluster to the manager: %w", err)
	}
	a.hub, a.hubReader, a.member = hubCluster.GetClient(), hubCluster.GetAPIReader(), mgr.GetClient()

	ctx := context.Background()
	byWork := func(obj client.Object) []string {
		if work, ok := a.appliedFrom(obj); ok {
			return []string{work.String()}
		}
		return nil
	}
	for _, obj := range []client.Object{&ctrlmeshv1alpha1.ShardRoute{}, &rbacv1.ClusterRole{}, &rbacv1.ClusterRoleBinding{}} {
		if err := mgr.GetFieldIndexer().IndexField(ctx, obj, workIndex, byWork); err != nil {
			return fmt.Errorf("workapply: indexing member %T by Work: %w", obj, err)
		}
	}
	if err := hubCluster.GetFieldIndexer().IndexField(ctx, &workv1alpha1.Work{}, targetIndex, func(obj client.Object) []string {
		return routework.Targets(obj.(*workv1alpha1.Work))
	}); err != nil {
		return fmt.Errorf("workapply: indexing Works by target: %w", err)
	}

	// Status writes of the applier itself change neither generation, labels
	// nor annotations, so they do not come back as work.
	workChanged := predicate.Or[*workv1alpha1.Work](
		predicate.TypedGenerationChangedPredicate[*workv1alpha1.Work]{},
		predicate.TypedLabelChangedPredicate[*workv1alpha1.Work]{},
		predicate.TypedAnnotationChangedPredicate[*workv1alpha1.Work]{},
	)
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WithLogConstructor(func(req *reconcile.Request) logr.Logger {
			if req == nil {
				return a.Log
			}
			return a.Log.WithValues("work", req.NamespacedName)
		}).
		WatchesRawSource(source.Kind(hubCluster.GetCache(), &workv1alpha1.Work{},
			&handler.TypedEnqueueRequestForObject[*workv1alpha1.Work]{}, workChanged)).
		// Every change of a member ShardRoute, its status included, goes to
		// the Work it was applied from (to reapply, reflect its status or,
		// when the Work is gone, delete it) and to the Works it blocks.
		WatchesRawSource(source.Kind(mgr.GetCache(), &ctrlmeshv1alpha1.ShardRoute{},
			handler.TypedEnqueueRequestsFromMapFunc(a.worksOfRoute))).
		// The labeler RBAC applied from a Work goes back to it: changed
		// behind the applier's back it is reapplied, left over once the Work
		// is gone (also after a restart) it is deleted; an object of its
		// name that blocks a Work brings that Work back when it changes.
		WatchesRawSource(source.Kind(mgr.GetCache(), &rbacv1.ClusterRole{},
			handler.TypedEnqueueRequestsFromMapFunc(worksOfRBAC[*rbacv1.ClusterRole](a, "ClusterRole")))).
		WatchesRawSource(source.Kind(mgr.GetCache(), &rbacv1.ClusterRoleBinding{},
			handler.TypedEnqueueRequestsFromMapFunc(worksOfRBAC[*rbacv1.ClusterRoleBinding](a, "ClusterRoleBinding")))).
		Complete(a)
}

// appliedFrom returns the Work of this execution namespace that obj was
// applied from, going by Karmada's label and annotations.
func (a *Applier) appliedFrom(obj client.Object) (types.NamespacedName, bool) {
	work, managed := routework.AppliedFrom(obj)
	return work, managed && work.Namespace == a.namespace && work.Name != ""
}

// worksOfRBAC maps a member ClusterRole or ClusterRoleBinding (kind) to the
// Work it was applied from and to the Works whose manifests name it: those
// it may block as a conflict.
func worksOfRBAC[T client.Object](a *Applier, kind string) handler.TypedMapFunc[T, reconcile.Request] {
	return func(ctx context.Context, obj T) []reconcile.Request {
		return a.worksOf(ctx, obj, routework.Target(kind, "", obj.GetName()))
	}
}

// worksOfRoute maps a member ShardRoute to the Work it was applied from and
// to the Works whose manifests name it: those it may block as a conflict.
func (a *Applier) worksOfRoute(ctx context.Context, route *ctrlmeshv1alpha1.ShardRoute) []reconcile.Request {
	return a.worksOf(ctx, route, routework.Target(shardRouteKind, route.Namespace, route.Name))
}

// worksOf maps a member object, target to routework.Targets, to the Work it
// was applied from and to the Works whose manifests name it.
func (a *Applier) worksOf(ctx context.Context, obj client.Object, target string) []reconcile.Request {
	var requests []reconcile.Request
	if work, ok := a.appliedFrom(obj); ok {
		requests = append(requests, reconcile.Request{NamespacedName: work})
	}
	var works workv1alpha1.WorkList
	if err := a.hub.List(ctx, &works, client.InNamespace(a.namespace), client.MatchingFields{targetIndex: target}); err != nil {
		a.Log.Error(err, "listing the Works that target a member object", "target", target)
		return requests
	}
	for _, w := range works.Items {
		requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&w)})
	}
	return requests
}

// Reconcile applies one Work, or deletes what was applied from it when it
// is gone.
func (a *Applier) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := logr.FromContextOrDiscard(ctx)
	var work workv1alpha1.Work
	err := a.hub.Get(ctx, req.NamespacedName, &work)
	if apierrors.IsNotFound(err) || (err == nil && !work.DeletionTimestamp.IsZero()) {
		return reconcile.Result{}, errors.Join(
			a.deleteAppliedRoutes(ctx, log, req.NamespacedName, nil),
			deleteAppliedRBAC(ctx, a, log, req.NamespacedName, "", &rbacv1.ClusterRoleBindingList{}),
			deleteAppliedRBAC(ctx, a, log, req.NamespacedName, "", &rbacv1.ClusterRoleList{}))
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("reading Work %s: %w", req.NamespacedName, err)
	}

	manifests, err := routework.DecodeAll(&work)
	if err != nil {
		// Only a new Work spec can fix its manifest: no retry.
		return reconcile.Result{}, a.writeStatus(ctx, &work, failed(&work, err), nil)
	}
	applied, err := a.apply(ctx, &work, manifests.Route)
	if err == nil {
		err = a.applyLabelerRBAC(ctx, log, &work, manifests.Labeler)
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		// The member cache was behind; the retry sees the object as it is,
		// and the Work's status is not worth a transient failure.
		return reconcile.Result{}, err
	}
	if err != nil {
		statusErr := a.writeStatus(ctx, &work, failed(&work, err), nil)
		var conflict *conflictError
		if errors.As(err, &conflict) || apierrors.IsInvalid(err) {
			// Retrying cannot help: a change of the Work or of the
			// conflicting object brings the Work back.
			return reconcile.Result{}, statusErr
		}
		return reconcile.Result{}, errors.Join(err, statusErr)
	}
	// A Work whose manifest now names another object leaves the old one.
	keep := client.ObjectKeyFromObject(applied)
	if err := a.deleteAppliedRoutes(ctx, log, req.NamespacedName, &keep); err != nil {
		return reconcile.Result{}, err
	}
	manifest := routework.ManifestStatus(applied)
	return reconcile.Result{}, a.writeStatus(ctx, &work, metav1.Condition{
		Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonWorkAppliedSuccessful,
		Message: messageApplied, ObservedGeneration: work.Generation,
	}, &manifest)
}

func failed(work *workv1alpha1.Work, err error) metav1.Condition {
	return metav1.Condition{
		Type: workv1alpha1.WorkApplied, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonWorkAppliedFailed,
		Message: err.Error(), ObservedGeneration: work.Generation,
	}
}

// conflictError is an object in the member, of a manifest's kind and name,
// that was not applied from the Work. A ShardRoute may be taken over with
// Karmada's overwrite annotation; labeler RBAC never is: the applier grants
// no rights through an object someone else made.
type conflictError struct {
	kind    string
	object  string // namespace/name, or the name of a cluster-scoped object
	cluster string
	owner   string // the Work it was applied from, if any
}

func (e *conflictError) Error() string {
	whose := "it was not applied from a Work"
	if e.owner != "" {
		whose = "it was applied from Work " + e.owner
	}
	if e.kind != shardRouteKind {
		return fmt.Sprintf("%s %s already exists in cluster %s and %s (or binds another role); delete it there", e.kind, e.object, e.cluster, whose)
	}
	return fmt.Sprintf("%s %s already exists in cluster %s and %s; delete it there, or annotate this Work with %s=%s to take it over",
		e.kind, e.object, e.cluster, whose, workv1alpha2.ResourceConflictResolutionAnnotation, workv1alpha2.ResourceConflictResolutionOverwrite)
}

const shardRouteKind = "ShardRoute"

// apply creates or updates the member's ShardRoute from desired, the Work's
// manifest, and returns it as stored. It writes spec, labels and
// annotations only: an update never changes the status subresource.
func (a *Applier) apply(ctx context.Context, work *workv1alpha1.Work, desired *ctrlmeshv1alpha1.ShardRoute) (*ctrlmeshv1alpha1.ShardRoute, error) {
	labels, annotations := routework.AppliedLabels(work), routework.AppliedAnnotations(work)
	key := client.ObjectKeyFromObject(desired)

	var current ctrlmeshv1alpha1.ShardRoute
	err := a.member.Get(ctx, key, &current)
	if apierrors.IsNotFound(err) {
		// Create, not an apply: if the cache missed an object someone just
		// created, the create fails and the retry sees the conflict.
		route := &ctrlmeshv1alpha1.ShardRoute{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: key.Namespace, Name: key.Name,
				Labels:      merged(desired.Labels, labels),
				Annotations: merged(desired.Annotations, annotations),
			},
			Spec: desired.Spec,
		}
		if err := a.member.Create(ctx, route, client.FieldOwner(ctrlmeshv1alpha1.WorkApplyFieldManager)); err != nil {
			return nil, fmt.Errorf("creating ShardRoute %s: %w", key, err)
		}
		return route, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ShardRoute %s: %w", key, err)
	}

	owner, _ := routework.AppliedFrom(&current)
	if owner != client.ObjectKeyFromObject(work) && !overwrites(work, desired) {
		conflict := &conflictError{kind: shardRouteKind, object: key.String(), cluster: a.ClusterName}
		if owner.Name != "" {
			conflict.owner = owner.String()
		}
		a.Recorder.Eventf(&current, corev1.EventTypeWarning, events.EventReasonSyncWorkloadFailed,
			"Not applying Work %s/%s of the hub to this ShardRoute: it was not created from that Work. Delete it, or annotate the Work with %s=%s to take it over",
			work.Namespace, work.Name, workv1alpha2.ResourceConflictResolutionAnnotation, workv1alpha2.ResourceConflictResolutionOverwrite)
		return nil, conflict
	}

	// Labels and annotations that others set in the member stay, as Karmada
	// retains them; the manifest's and the Work's win.
	route := current.DeepCopy()
	route.Labels = merged(current.Labels, desired.Labels, labels)
	route.Annotations = merged(current.Annotations, desired.Annotations, annotations)
	route.Spec = desired.Spec
	if equality.Semantic.DeepEqual(route, &current) {
		return &current, nil
	}
	// The cached resourceVersion makes a stale view fail with a conflict.
	if err := a.member.Update(ctx, route, client.FieldOwner(ctrlmeshv1alpha1.WorkApplyFieldManager)); err != nil {
		return nil, fmt.Errorf("updating ShardRoute %s: %w", key, err)
	}
	return route, nil
}

// overwrites tells whether the Work, or its manifest as Karmada's binding
// controller would put it there, asks to take over an existing object.
func overwrites(work *workv1alpha1.Work, desired *ctrlmeshv1alpha1.ShardRoute) bool {
	const key, overwrite = workv1alpha2.ResourceConflictResolutionAnnotation, workv1alpha2.ResourceConflictResolutionOverwrite
	return work.Annotations[key] == overwrite || desired.Annotations[key] == overwrite
}

// merged returns the union of maps, later ones winning.
func merged(maps ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range maps {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// deleteAppliedRoutes deletes the member ShardRoutes applied from the Work,
// except keep.
func (a *Applier) deleteAppliedRoutes(ctx context.Context, log logr.Logger, work types.NamespacedName, keep *types.NamespacedName) error {
	var routes ctrlmeshv1alpha1.ShardRouteList
	if err := a.member.List(ctx, &routes, client.MatchingFields{workIndex: work.String()}); err != nil {
		return fmt.Errorf("listing the ShardRoutes applied from Work %s: %w", work, err)
	}
	for i := range routes.Items {
		route := &routes.Items[i]
		key := client.ObjectKeyFromObject(route)
		if keep != nil && key == *keep {
			continue
		}
		// The preconditions keep a stale cache from deleting an object that
		// was recreated or handed to another Work meanwhile.
		err := a.member.Delete(ctx, route, client.Preconditions{UID: &route.UID, ResourceVersion: &route.ResourceVersion})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting ShardRoute %s of Work %s: %w", key, work, err)
		}
		log.V(1).Info("deleted the ShardRoute of a Work that is gone or names another object", "shardRoute", key)
	}
	return nil
}
