// Package policystatus reports on the hub, in each CircuitBreaker's and
// FaultInjection's status, what the members report of it: per member
// cluster, how many of the operator's proxies enforce the policy's
// generation, and (CircuitBreaker) which breakers are open or half-open
// in which pods since when. It reads the route the hub published to each
// member for the policy's ShardingConfig, from the hub's working model
// (which policy generation it holds; the hub's cache holds no Work's
// manifests), and the route status the member reflected into that Work
// (each proxy's applied rules hash and breakers).
package policystatus

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/propagation"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// RBACRules are the rights the status controllers need.
func RBACRules() []rbacv1.PolicyRule {
	group := ctrlmeshv1alpha1.GroupVersion.Group
	return []rbacv1.PolicyRule{
		{APIGroups: []string{group}, Resources: []string{"circuitbreakers", "faultinjections"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{group}, Resources: []string{"circuitbreakers/status", "faultinjections/status"}, Verbs: []string{"update"}},
	}
}

// object is a policy as a client object.
type object interface {
	client.Object
	ctrlmeshv1alpha1.Policy
}

// Reconciler keeps the status of one kind of policy, P.
type Reconciler[P object] struct {
	Client client.Client
	// Store is the hub's working model: the routes the hub published.
	Store *state.Store
	// Works lists the Works of a ShardingConfig: the hub's
	// propagation.Writer, through its cache's index.
	Works interface {
		List(ctx context.Context, config *ctrlmeshv1alpha1.ShardingConfig) ([]workv1alpha1.Work, error)
	}
	// New returns an empty P; NewList an empty list of them.
	New     func() P
	NewList func() client.ObjectList
	// Items returns the policies of a list NewList made.
	Items func(client.ObjectList) []P
	// Kind names P in logs and in the controller's name.
	Kind string
}

// SetupCircuitBreakers and SetupFaultInjections register the status
// controllers of each kind with mgr.
func SetupCircuitBreakers(mgr ctrl.Manager, store *state.Store, works *propagation.Writer) error {
	return (&Reconciler[*ctrlmeshv1alpha1.CircuitBreaker]{Client: mgr.GetClient(), Store: store, Works: works, Kind: "CircuitBreaker",
		New:     func() *ctrlmeshv1alpha1.CircuitBreaker { return &ctrlmeshv1alpha1.CircuitBreaker{} },
		NewList: func() client.ObjectList { return &ctrlmeshv1alpha1.CircuitBreakerList{} },
		Items: func(l client.ObjectList) []*ctrlmeshv1alpha1.CircuitBreaker {
			var out []*ctrlmeshv1alpha1.CircuitBreaker
			for i := range l.(*ctrlmeshv1alpha1.CircuitBreakerList).Items {
				out = append(out, &l.(*ctrlmeshv1alpha1.CircuitBreakerList).Items[i])
			}
			return out
		}}).SetupWithManager(mgr)
}

func SetupFaultInjections(mgr ctrl.Manager, store *state.Store, works *propagation.Writer) error {
	return (&Reconciler[*ctrlmeshv1alpha1.FaultInjection]{Client: mgr.GetClient(), Store: store, Works: works, Kind: "FaultInjection",
		New:     func() *ctrlmeshv1alpha1.FaultInjection { return &ctrlmeshv1alpha1.FaultInjection{} },
		NewList: func() client.ObjectList { return &ctrlmeshv1alpha1.FaultInjectionList{} },
		Items: func(l client.ObjectList) []*ctrlmeshv1alpha1.FaultInjection {
			var out []*ctrlmeshv1alpha1.FaultInjection
			for i := range l.(*ctrlmeshv1alpha1.FaultInjectionList).Items {
				out = append(out, &l.(*ctrlmeshv1alpha1.FaultInjectionList).Items[i])
			}
			return out
		}}).SetupWithManager(mgr)
}

// SetupWithManager registers the controller: it reconciles a policy when
// it changes and when a Work of its ShardingConfig does.
func (r *Reconciler[P]) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(strings.ToLower(r.Kind)+"-status").
		For(r.New()).
		Watches(&workv1alpha1.Work{}, handler.EnqueueRequestsFromMapFunc(r.policiesOfWork)).
		Complete(r)
}

func (r *Reconciler[P]) policiesOfWork(ctx context.Context, obj client.Object) []reconcile.Request {
	config, ok := propagation.ConfigOf(obj)
	if !ok {
		return nil
	}
	list := r.NewList()
	if err := r.Client.List(ctx, list, client.InNamespace(config.Namespace)); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, p := range r.Items(list) {
		if p.ShardingConfigName() == config.Name {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p)})
		}
	}
	return out
}

// Reconcile writes one policy's status from its ShardingConfig's Works.
func (r *Reconciler[P]) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	policy := r.New()
	if err := r.Client.Get(ctx, req.NamespacedName, policy); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	status := policy.PolicyStatus()
	next := ctrlmeshv1alpha1.PolicyStatus{ObservedGeneration: policy.GetGeneration(), Conditions: slices.Clone(status.Conditions)}
	cond := metav1.Condition{Type: ctrlmeshv1alpha1.ConditionEnforced, ObservedGeneration: policy.GetGeneration()}
	var sc ctrlmeshv1alpha1.ShardingConfig
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: policy.ShardingConfigName()}, &sc)
	switch {
	case apierrors.IsNotFound(err):
		cond.Status, cond.Reason = metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonShardingConfigNotFound
		cond.Message = fmt.Sprintf("ShardingConfig %s/%s does not exist: create it, or name an existing one in spec.shardingConfig.name", req.Namespace, policy.ShardingConfigName())
	case err != nil:
		return reconcile.Result{}, err
	default:
		works, err := r.Works.List(ctx, &sc)
		if err != nil {
			return reconcile.Result{}, err
		}
		routes := map[string]*ctrlmeshv1alpha1.ShardRoute{}
		for _, p := range r.Store.Snapshot().PublishedOf(client.ObjectKeyFromObject(&sc)) {
			routes[p.Cluster] = p.Route
		}
		next.Clusters = Clusters(r.Kind, policy.GetName(), policy.GetGeneration(), works, routes)
		var pending []string
		for _, c := range next.Clusters {
			if c.Enforcing < c.Proxies || c.Proxies == 0 {
				pending = append(pending, fmt.Sprintf("%s (%d of %d proxies)", c.Cluster, c.Enforcing, c.Proxies))
			}
		}
		switch {
		case len(next.Clusters) == 0:
			cond.Status, cond.Reason = metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonPolicyPending
			cond.Message = fmt.Sprintf("ShardingConfig %s has no rules in any member yet", sc.Name)
		case len(pending) > 0:
			cond.Status, cond.Reason = metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonPolicyPending
			cond.Message = "not every proxy enforces generation " + fmt.Sprint(policy.GetGeneration()) + " yet in: " + strings.Join(pending, ", ")
		default:
			cond.Status, cond.Reason = metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonPolicyEnforced
			cond.Message = fmt.Sprintf("every proxy in %d member clusters enforces generation %d", len(next.Clusters), policy.GetGeneration())
		}
	}
	meta.SetStatusCondition(&next.Conditions, cond)
	if equality.Semantic.DeepEqual(*status, next) {
		return reconcile.Result{}, nil
	}
	*status = next
	if err := r.Client.Status().Update(ctx, policy); err != nil {
		return reconcile.Result{}, fmt.Errorf("writing the status of %s %s: %w", r.Kind, req.NamespacedName, err)
	}
	return reconcile.Result{}, nil
}

// Clusters is the per-member status of the policy kind/name at generation
// from the Works of its ShardingConfig and routes, the routes published to
// them by cluster: a cluster's proxies are the pods its route status
// lists; those enforcing it report the hash of its published route, which
// carries that generation of the policy; its breakers are those the
// proxies report not closed, each in its state furthest from closed. A
// cluster without a published route has no proxy enforcing the policy.
func Clusters(kind, name string, generation int64, works []workv1alpha1.Work, routes map[string]*ctrlmeshv1alpha1.ShardRoute) []ctrlmeshv1alpha1.PolicyClusterStatus {
	var out []ctrlmeshv1alpha1.PolicyClusterStatus
	for i := range works {
		work := &works[i]
		report, err := routework.ReadStatus(work)
		if err != nil {
			continue
		}
		route := routes[report.Cluster]
		carried := route != nil && carries(route, kind, name, generation)
		c := ctrlmeshv1alpha1.PolicyClusterStatus{Cluster: report.Cluster}
		breakers := map[string]*ctrlmeshv1alpha1.ClusterBreakerStatus{}
		for _, p := range report.Route.Pods {
			if p.Shard == "" && !p.Ready && p.Address == "" {
				continue // not a candidate (another selector's pod)
			}
			c.Proxies++
			if carried && p.AppliedRulesHash == route.Spec.RulesHash {
				c.Enforcing++
			}
			if kind != "CircuitBreaker" {
				continue
			}
			for _, b := range p.Breakers {
				if b.Policy != name {
					continue
				}
				cur, ok := breakers[b.Name]
				switch {
				case !ok || rank(b.State) > rank(cur.State):
					breakers[b.Name] = &ctrlmeshv1alpha1.ClusterBreakerStatus{Name: b.Name, State: b.State, Pods: []string{p.Name}, LastTransitionTime: b.LastTransitionTime}
				case b.State == cur.State:
					cur.Pods = append(cur.Pods, p.Name)
					if cur.LastTransitionTime.Before(&b.LastTransitionTime) {
						cur.LastTransitionTime = b.LastTransitionTime
					}
				}
			}
		}
		for _, name := range slices.Sorted(maps.Keys(breakers)) {
			b := breakers[name]
			slices.Sort(b.Pods)
			c.Breakers = append(c.Breakers, *b)
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b ctrlmeshv1alpha1.PolicyClusterStatus) int { return cmp.Compare(a.Cluster, b.Cluster) })
	return out
}

func carries(route *ctrlmeshv1alpha1.ShardRoute, kind, name string, generation int64) bool {
	p := route.Spec.Policies
	if p == nil {
		return false
	}
	if kind == "CircuitBreaker" {
		return slices.ContainsFunc(p.CircuitBreakers, func(cb ctrlmeshv1alpha1.RouteCircuitBreaker) bool {
			return cb.Name == name && cb.Generation == generation
		})
	}
	return slices.ContainsFunc(p.FaultInjections, func(fi ctrlmeshv1alpha1.RouteFaultInjection) bool {
		return fi.Name == name && fi.Generation == generation
	})
}

func rank(s ctrlmeshv1alpha1.BreakerState) int {
	switch s {
	case ctrlmeshv1alpha1.BreakerOpen:
		return 2
	case ctrlmeshv1alpha1.BreakerHalfOpen:
		return 1
	}
	return 0
}
