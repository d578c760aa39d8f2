package routestatus

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// ValidityGrants grants the proxies' requests to renew the validity of rules that
// expire (spec.validitySeconds, Fleet scope), in step with the heartbeat:
// Collect, called before the agent renews its heartbeat lease on the hub,
// reads the requests the ShardRoutes' status shows; the function it returns,
// called once that renewal succeeded, grants them. A proxy counts its
// validity from when it sent the request, which was before the agent read
// it, which was before the renewal the hub observes: so every validity ends
// before the hub's last observation of the heartbeat plus the validity, and
// the hub gives a lost member's buckets elsewhere only after that
// (route.LapseBound).
//
// A request is granted only while the member holds the rules the hub
// publishes for it: the agent reads the route's Work on the hub afresh after
// the renewal, and grants nothing for a route the Work has moved past (or
// no longer carries). A member that was cut off from the hub comes back with
// rules whose buckets the hub may have given away meanwhile; its proxies
// stay lapsed until the rules the hub publishes now arrive.
type ValidityGrants struct {
	// Member lists the ShardRoutes (a cached client is fine: a request in
	// the cache was written before it got there) and writes their status.
	Member client.Client
	// MemberReader reads a ShardRoute uncached before its status is
	// written, so that a conflict is retried with the newest one.
	MemberReader client.Reader
	// Hub reads the cluster's Works, uncached: the read must follow the
	// heartbeat renewal.
	Hub client.Client
	// Cluster is the member's name on the hub.
	Cluster string
	Log     logr.Logger
}

// requested are the renewal requests of one route, by pod, as read before
// a heartbeat renewal, with the rules they were read beside.
type requested struct {
	route      types.NamespacedName
	generation int64
	rulesHash  string
	byPod      map[string]int64
}

// Collect reads the requests not granted yet; the function it returns grants
// them, and is to be called only after a heartbeat renewal that followed
// Collect succeeded.
func (g *ValidityGrants) Collect(ctx context.Context) func(context.Context) {
	var list ctrlmeshv1alpha1.ShardRouteList
	if err := g.Member.List(ctx, &list); err != nil {
		g.Log.Error(err, "Listing the ShardRoutes for their renewal requests failed; granting none this heartbeat")
		return func(context.Context) {}
	}
	var pending []requested
	for _, route := range list.Items {
		if route.Spec.ValiditySeconds == 0 {
			continue
		}
		r := requested{route: client.ObjectKeyFromObject(&route), generation: route.Spec.RoutingGeneration, rulesHash: route.Spec.RulesHash, byPod: map[string]int64{}}
		for _, p := range route.Status.Pods {
			if p.RenewalRequest != 0 && p.RenewalRequest != p.RenewalGranted {
				r.byPod[p.Name] = p.RenewalRequest
			}
		}
		if len(r.byPod) > 0 {
			pending = append(pending, r)
		}
	}
	return func(ctx context.Context) {
		for _, r := range pending {
			if err := g.grant(ctx, r); err != nil {
				g.Log.Error(err, "Granting renewal requests failed; the proxies ask again and are granted at a later heartbeat", "shardRoute", r.route)
			}
		}
	}
}

// grant grants r's requests if the hub still publishes r's rules.
func (g *ValidityGrants) grant(ctx context.Context, r requested) error {
	var work workv1alpha1.Work
	if err := g.Hub.Get(ctx, routework.WorkKey(g.Cluster, r.route.Namespace, r.route.Name), &work); err != nil {
		if apierrors.IsNotFound(err) {
			g.Log.V(1).Info("The hub publishes no rules for the ShardRoute any more; granting no renewal", "shardRoute", r.route)
			return nil
		}
		return fmt.Errorf("reading the ShardRoute's Work on the hub: %w", err)
	}
	published, err := routework.Decode(&work)
	if err != nil {
		return fmt.Errorf("reading the ShardRoute's Work on the hub: %w", err)
	}
	if !work.DeletionTimestamp.IsZero() || published.Spec.RoutingGeneration != r.generation || published.Spec.RulesHash != r.rulesHash {
		g.Log.Info("The member does not hold the rules the hub publishes; granting no renewal until it does",
			"shardRoute", r.route, "memberGeneration", r.generation, "hubGeneration", published.Spec.RoutingGeneration, "workDeleting", !work.DeletionTimestamp.IsZero())
		return nil
	}
	// The requests were read before the renewal; the route read now may
	// show newer ones, which wait for the next heartbeat.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var route ctrlmeshv1alpha1.ShardRoute
		if err := g.MemberReader.Get(ctx, r.route, &route); err != nil {
			return client.IgnoreNotFound(err)
		}
		changed := false
		for i := range route.Status.Pods {
			p := &route.Status.Pods[i]
			if request, ok := r.byPod[p.Name]; ok && p.RenewalGranted != request {
				p.RenewalGranted, changed = request, true
			}
		}
		if !changed {
			return nil
		}
		return g.Member.Status().Update(ctx, &route)
	})
	if err != nil {
		return fmt.Errorf("writing the grants into the status of ShardRoute %s: %w", r.route, err)
	}
	return nil
}
