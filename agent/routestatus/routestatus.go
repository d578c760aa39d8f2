// Package routestatus is the agent's ShardRoute status controller: for every
// ShardRoute in the member cluster it reports the candidate pods, the leader
// of every shard and whether the rules are valid and applied by every proxy.
//
// The status has two kinds of writers. The agent writes everything by a
// plain Update of the status subresource, carrying the resourceVersion it
// read; each pod's proxy writes only its own
// status.pods[name=<pod>].appliedRulesHash by server-side apply, as field
// manager ctrlmeshv1alpha1.ProxyFieldManager(pod). They coexist because:
//
//   - the agent copies every appliedRulesHash from the status it read, and
//     the resourceVersion makes the server refuse the Update (409) when a
//     report landed since; so the agent never changes a reported hash and
//     never becomes a manager of that field, and a proxy's later apply finds
//     no conflict (it would not need its ForceOwnership);
//   - an Update is not an apply: it may remove whole entries that other
//     managers own fields in, and the server then drops those fields from
//     their managers (the manager entry of a gone pod's proxy disappears).
//     A server-side apply by the agent could not do this: leaving an entry
//     out of an apply only gives up the applier's own fields, so an entry a
//     proxy wrote would outlive its pod.
//
// A refused Update is not retried at once: the write that made the cached
// route stale is on its way as a watch event, and reconciles the route again.
package routestatus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// ControllerName names the controller, its logger and the source of its Events.
const ControllerName = "shardroute-status"

// Reconciler keeps the status of ShardRoutes current. Build it with its
// options and call SetupWithManager on the member cluster's manager, whose
// cache should be configured with CacheByObject.
type Reconciler struct {
	// Mode is the selector mode the proxies run in. In label mode rules are
	// also refused when a label selector cannot state a shard's ownership;
	// empty checks as range mode, which refuses only what both modes refuse.
	Mode rules.Mode
	// Clock is the agent's clock, by which a shard lease's expiry is
	// judged: its duration after the agent saw it renewed (see renewals).
	// Default: the real clock.
	Clock clock.PassiveClock

	client   client.Client
	recorder record.EventRecorder
	renewals *renewals
	scopes   rules.Scopes
}

// SetupWithManager registers the controller with mgr. It runs only on the
// elected leader when mgr has leader election on.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	r.renewals = newRenewals(r.Clock)
	r.client = mgr.GetClient()
	r.recorder = mgr.GetEventRecorderFor(ControllerName)
	// The proxies build the same scope lookup over discovery (proxy/run.go).
	r.scopes = rules.NewMapperScopes(mgr.GetRESTMapper())
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&ctrlmeshv1alpha1.ShardRoute{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.routesSelecting), builder.WithPredicates(podChanged)).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(r.routesLockedBy), builder.WithPredicates(leaseChanged(r.renewals))).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.routesWithNamespaceRules), builder.WithPredicates(namespaceChanged)).
		Complete(r)
}

// Reconcile writes the status of one ShardRoute when it differs from what
// the cache shows, and asks to come back when a shard's lease expires.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	var route ctrlmeshv1alpha1.ShardRoute
	if err := r.client.Get(ctx, req.NamespacedName, &route); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var pods corev1.PodList
	if err := r.client.List(ctx, &pods, client.InNamespace(route.Namespace)); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the pods in %s: %w", route.Namespace, err)
	}
	leases, err := r.shardLeases(ctx, &route)
	if err != nil {
		return ctrl.Result{}, err
	}

	status := route.Status.DeepCopy()
	status.ObservedGeneration = route.Generation
	status.ObservedRoutingGeneration = route.Spec.RoutingGeneration
	candidates, others := podStatuses(&route, pods.Items)
	status.Pods = mergeByName(candidates, others)
	var nextExpiry time.Time
	status.Leaders, nextExpiry = leaders(leases, candidates, r.Clock.Now(), r.renewals.expiry)
	if status.Subsets, err = r.subsetStatuses(ctx, &route); err != nil {
		return ctrl.Result{}, err
	}
	refusal, err := r.recheckRules(&route)
	if refusal != nil {
		meta.SetStatusCondition(&status.Conditions, *refusal)
	}
	meta.SetStatusCondition(&status.Conditions, proxiesReady(&route, candidates))

	result := ctrl.Result{}
	if !nextExpiry.IsZero() {
		// Come back once, just after the lease runs out unless renewed.
		result.RequeueAfter = nextExpiry.Sub(r.Clock.Now()) + time.Millisecond
	}
	if err != nil {
		// Discovery failed: the rules are neither good nor refused yet.
		log.Info("Cannot check the rules while discovery fails; retrying", "in", discoveryRetry, "error", err.Error())
		if result.RequeueAfter == 0 || result.RequeueAfter > discoveryRetry {
			result.RequeueAfter = discoveryRetry
		}
	}
	if equality.Semantic.DeepEqual(status, &route.Status) {
		return result, nil
	}
	updated := route.DeepCopy()
	updated.Status = *status
	if err := r.client.Status().Update(ctx, updated); err != nil {
		if apierrors.IsConflict(err) {
			log.V(1).Info("status changed since read; waiting for the newer route")
			return result, nil
		}
		return ctrl.Result{}, fmt.Errorf("updating the status of ShardRoute %s: %w", req.NamespacedName, err)
	}
	log.V(1).Info("status written", "resourceVersion", updated.ResourceVersion)
	if refusal != nil && refusal.Status == metav1.ConditionFalse {
		// Once per refused generation: the status now records the refusal.
		r.recorder.Eventf(&route, corev1.EventTypeWarning, ctrlmeshv1alpha1.ReasonInvalidRules,
			"rules %s (routing generation %d) refused: %s", route.Spec.RulesHash, route.Spec.RoutingGeneration, refusal.Message)
	}
	return result, nil
}

// discoveryRetry is how soon rules that discovery kept from being checked
// are checked again.
const discoveryRetry = 5 * time.Second

// recheckRules returns the RulesApplied condition for a generation of the
// route the status does not describe yet, and nil when it does. Like the
// proxies, which offer each generation once, the agent checks each
// generation once: a resource that the API server learns later does not
// turn refused rules into good ones. A check that discovery kept from
// finishing (rules.ErrDiscovery) decides nothing: no condition, and the
// error, so that the generation is checked again rather than refused for
// good — a refusal would stall the hub's handover until the next
// generation.
func (r *Reconciler) recheckRules(route *ctrlmeshv1alpha1.ShardRoute) (*metav1.Condition, error) {
	if cond := meta.FindStatusCondition(route.Status.Conditions, ctrlmeshv1alpha1.ConditionRulesApplied); cond != nil &&
		cond.ObservedGeneration == route.Generation && route.Status.ObservedGeneration == route.Generation {
		return nil, nil
	}
	cond := metav1.Condition{
		Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonRulesValid,
		Message: "the proxies can enforce the rules", ObservedGeneration: route.Generation,
	}
	switch err := checkRules(route, r.Mode, r.scopes); {
	case errors.Is(err, rules.ErrDiscovery):
		return nil, err
	case err != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonInvalidRules, err.Error()
	}
	return &cond, nil
}

// checkRules refuses what a proxy would refuse. A proxy compiles the rules
// for its own pod: with a pod the shards do not list, Compile checks what
// all pods share; each listed pod adds the checks of its own shard.
func checkRules(route *ctrlmeshv1alpha1.ShardRoute, mode rules.Mode, scopes rules.Scopes) error {
	if _, err := metav1.LabelSelectorAsSelector(&route.Spec.Selector); err != nil {
		return fmt.Errorf("spec.selector: %w", err)
	}
	if _, err := metav1.LabelSelectorAsSelector(route.Spec.CanarySelector); err != nil {
		return fmt.Errorf("spec.canarySelector: %w", err)
	}
	for i := range route.Spec.Subsets {
		s := &route.Spec.Subsets[i]
		if _, err := metav1.LabelSelectorAsSelector(&s.Selector); err != nil {
			return fmt.Errorf("spec.subsets[%s].selector: %w", s.Name, err)
		}
		if _, err := namespaceRules(s); err != nil {
			return fmt.Errorf("spec.subsets[%s]: %w", s.Name, err)
		}
	}
	if _, err := rules.Compile(route, "", mode, scopes); err != nil {
		return err
	}
	for _, shard := range route.Spec.Shards {
		for _, pod := range shard.Pods {
			if _, err := rules.Compile(route, pod.Name, mode, scopes); err != nil {
				return err
			}
		}
	}
	return nil
}

// shardLeases returns the renamed leader-election Lease of every shard that
// has one, by shard ID.
func (r *Reconciler) shardLeases(ctx context.Context, route *ctrlmeshv1alpha1.ShardRoute) (map[string]*coordinationv1.Lease, error) {
	if route.Spec.Controller == nil {
		return nil, nil
	}
	// Every shard's renamed lock, not only those of the shards in the spec:
	// a shard the hub dissolved may still have a live leader, which the hub
	// must see before it grants that shard's buckets elsewhere.
	var list coordinationv1.LeaseList
	if err := r.client.List(ctx, &list, client.InNamespace(route.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the leases in %s: %w", route.Namespace, err)
	}
	prefix := shardLockName(route, "")
	leases := map[string]*coordinationv1.Lease{}
	for i := range list.Items {
		if shard, ok := strings.CutPrefix(list.Items[i].Name, prefix); ok && shard != "" {
			leases[shard] = &list.Items[i]
		}
	}
	return leases, nil
}
