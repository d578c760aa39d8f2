// Package propagation carries the rules the hub publishes to the member
// clusters and brings their reports back. BuildRoute turns one placement
// domain's placement.Rules into the ShardRoute of one member cluster; a
// Writer keeps one Karmada Work per (ShardingConfig, cluster) holding that
// ShardRoute as its one manifest; ReadStatus decodes what the member
// reflected into the Work's status: whether the route is applied, its
// health, and the agent's report of candidate pods, acknowledgements and
// leaders.
//
// The Works follow Karmada's conventions, so that either Karmada's
// execution and work-status controllers or the ctrlmesh agent in standalone
// mode (agent/workapply) can apply them.
package propagation

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// shardRouteKind is the kind of the one manifest of every Work.
var shardRouteKind = ctrlmeshv1alpha1.GroupVersion.WithKind("ShardRoute")

// BuildRoute returns the ShardRoute of one member cluster for the rules of
// config's placement domain: in the config's namespace and name, with the
// config's selectors, controller, webhook, limits, scope and bucket count,
// and the rules' shards.
//
// In PerCluster scope the rules are the cluster's own. In Fleet scope one set
// of rules spans every selected cluster, and each member's route lists every
// shard, so that its proxies know the whole ownership (no two shards serve a
// bucket, and a namespace a shard serves exactly is excluded everywhere
// else), but lists only the pods of that cluster: pod names are unique only
// within a cluster, and proxies find their own shard by pod name. Webhook
// requests for a namespace served by another cluster's shard therefore find
// no peer to forward to; pod addresses are rarely routable across clusters
// anyway.
//
// A rule shard whose buckets and namespaces are all pending serves nothing
// now; it is listed with its pending buckets and namespaces and its pods,
// whose proxies take the shard's leader-election lock and serve nothing
// until the grant.
//
// addresses gives the webhook address of pods that have one (the agents
// report them); a pod without one is listed without.
//
// The route's routingGeneration is rules.Generation, and its rulesHash is
// RulesHash of its spec. The route is checked as the CRD and the proxies
// would check it; fields copied from the config were validated by the
// ShardingConfig CRD and are not checked again.
func BuildRoute(config *ctrlmeshv1alpha1.ShardingConfig, cluster string, rules placement.Rules, addresses map[placement.PodID]string) (*ctrlmeshv1alpha1.ShardRoute, error) {
	spec := &config.Spec
	if spec.Scope != ctrlmeshv1alpha1.ScopePerCluster && spec.Scope != ctrlmeshv1alpha1.ScopeFleet {
		return nil, fmt.Errorf("ShardingConfig %s/%s: scope %q is neither %s nor %s", config.Namespace, config.Name, spec.Scope, ctrlmeshv1alpha1.ScopePerCluster, ctrlmeshv1alpha1.ScopeFleet)
	}
	space, err := sharding.NewSpace(int(spec.Sharding.Buckets))
	if err != nil {
		return nil, fmt.Errorf("ShardingConfig %s/%s: sharding.buckets: %w", config.Namespace, config.Name, err)
	}
	route := &ctrlmeshv1alpha1.ShardRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: shardRouteKind.GroupVersion().String(), Kind: shardRouteKind.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: config.Name},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster:           cluster,
			RoutingGeneration: rules.Generation,
			Scope:             spec.Scope,
			Buckets:           spec.Sharding.Buckets,
			Selector:          *spec.Selector.DeepCopy(),
			Controller:        spec.Controller.DeepCopy(),
			Webhook:           spec.Webhook.DeepCopy(),
			Limits:            spec.Limits.DeepCopy(),
		},
	}
	if spec.Canary != nil {
		route.Spec.CanarySelector = spec.Canary.Selector.DeepCopy()
	}
	for _, rs := range rules.Shards {
		shard, err := routeShard(space, spec.Scope, cluster, rs, addresses)
		if err != nil {
			return nil, fmt.Errorf("building the ShardRoute of cluster %s for ShardingConfig %s/%s at generation %d: %w", cluster, config.Namespace, config.Name, rules.Generation, err)
		}
		if shard != nil {
			route.Spec.Shards = append(route.Spec.Shards, *shard)
		}
	}
	route.Spec.RulesHash = RulesHash(&route.Spec)
	if err := validateRoute(route); err != nil {
		return nil, fmt.Errorf("the ShardRoute of cluster %s for ShardingConfig %s/%s at generation %d is invalid: %w", cluster, config.Namespace, config.Name, rules.Generation, err)
	}
	return route, nil
}

// routeShard is the RouteShard of one rule shard in cluster, nil when the
// shard cannot be expressed (see BuildRoute).
func routeShard(space sharding.Space, scope ctrlmeshv1alpha1.ShardingScope, cluster string, rs placement.RuleShard, addresses map[placement.PodID]string) (*ctrlmeshv1alpha1.RouteShard, error) {
	// A zero Set has no space (and cannot be printed).
	for _, set := range []struct {
		what string
		set  sharding.Set
	}{{"buckets", rs.Buckets}, {"pending buckets", rs.PendingBuckets}} {
		if set.set.Space() != space {
			return nil, fmt.Errorf("shard %q: %s are a set of %d buckets, the ShardingConfig has %d", rs.ID, set.what, set.set.Space().Buckets(), space.Buckets())
		}
	}
	if rs.Buckets.IsEmpty() && rs.PendingBuckets.IsEmpty() && len(rs.Namespaces) == 0 && len(rs.PendingNamespaces) == 0 {
		// A shard of nothing at all (a canary step of nothing but
		// namespaces others hold nothing of): the CRD refuses it, and its
		// pods serve nothing unlisted too.
		return nil, nil
	}
	shard := &ctrlmeshv1alpha1.RouteShard{
		ID:                rs.ID,
		Buckets:           rs.Buckets.String(),
		PendingBuckets:    rs.PendingBuckets.String(),
		Namespaces:        slices.Clone(rs.Namespaces),
		PendingNamespaces: slices.Clone(rs.PendingNamespaces),
		Canary:            rs.Canary,
	}
	for _, pod := range rs.Pods {
		if pod.Cluster != cluster {
			if scope == ctrlmeshv1alpha1.ScopePerCluster {
				return nil, fmt.Errorf("shard %q: pod %s is of another cluster, but in %s scope the rules are those of cluster %s alone", rs.ID, pod, scope, cluster)
			}
			continue
		}
		shard.Pods = append(shard.Pods, ctrlmeshv1alpha1.RoutePod{Name: pod.Name, Address: addresses[pod]})
	}
	return shard, nil
}

// RulesHash identifies a route spec: the hex SHA-256 of its JSON with
// rulesHash left out. The routing generation is part of it, so that a pod's
// appliedRulesHash names exactly one generation of the rules.
func RulesHash(spec *ctrlmeshv1alpha1.ShardRouteSpec) string {
	unhashed := *spec
	unhashed.RulesHash = ""
	// encoding/json writes struct fields in order and map keys sorted; a
	// spec of strings, numbers and maps of strings cannot fail to marshal.
	data, _ := json.Marshal(unhashed)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Bounds and patterns of the ShardRoute CRD.
const (
	maxClusterName   = 48
	maxShards        = 4096
	maxShardID       = 50
	maxBucketsString = 16384
	maxNamespaces    = 64
	maxNamespace     = 63
	maxPods          = 16
	maxPodName       = 253
	maxAddress       = 253
	maxRulesHash     = 64
)

var shardIDPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// validateRoute checks what BuildRoute derives from the rules against the
// ShardRoute CRD's schema, and the rules against what proxies refuse: a
// bucket, namespace or pod in two shards.
func validateRoute(route *ctrlmeshv1alpha1.ShardRoute) error {
	spec := &route.Spec
	var errs []error
	if spec.Cluster == "" || len(spec.Cluster) > maxClusterName {
		errs = append(errs, fmt.Errorf("spec.cluster %q must have 1 to %d characters", spec.Cluster, maxClusterName))
	}
	if spec.RoutingGeneration < 1 {
		errs = append(errs, fmt.Errorf("spec.routingGeneration is %d: rules of generation 0 are nothing published", spec.RoutingGeneration))
	}
	if spec.RulesHash == "" || len(spec.RulesHash) > maxRulesHash {
		errs = append(errs, fmt.Errorf("spec.rulesHash must have 1 to %d characters", maxRulesHash))
	}
	if len(spec.Shards) > maxShards {
		errs = append(errs, fmt.Errorf("spec.shards: %d shards, at most %d", len(spec.Shards), maxShards))
	}
	// The CRD checked the config's bucket count, so the space is valid.
	space := sharding.MustSpace(int(spec.Buckets))
	served, _ := space.NewSet()    // the empty set cannot fail
	shardOf := map[string]string{} // shard IDs, namespaces and pods seen, to their shard
	for _, s := range spec.Shards {
		errs = append(errs, validateShard(space, s, served, shardOf)...)
		if set, err := space.ParseSet(s.Buckets); err == nil {
			served = served.Union(set)
		}
	}
	return errors.Join(errs...)
}

func validateShard(space sharding.Space, s ctrlmeshv1alpha1.RouteShard, servedBefore sharding.Set, shardOf map[string]string) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("shard %q: "+format, append([]any{s.ID}, args...)...))
	}
	if len(s.ID) > maxShardID || !shardIDPattern.MatchString(s.ID) {
		fail("the ID must be a DNS label of at most %d characters", maxShardID)
	}
	if _, ok := shardOf["shard/"+s.ID]; ok {
		fail("is listed twice")
	}
	shardOf["shard/"+s.ID] = s.ID
	if s.Buckets == "" && s.PendingBuckets == "" && len(s.Namespaces) == 0 && len(s.PendingNamespaces) == 0 {
		fail("has no buckets, pending buckets, namespaces or pending namespaces")
	}
	if len(s.PendingNamespaces) > maxNamespaces {
		fail("%d pending namespaces, at most %d", len(s.PendingNamespaces), maxNamespaces)
	}
	if len(s.Buckets) > maxBucketsString || len(s.PendingBuckets) > maxBucketsString {
		fail("buckets and pendingBuckets may have at most %d characters each", maxBucketsString)
	}
	if set, err := space.ParseSet(s.Buckets); err != nil {
		fail("buckets: %v", err)
	} else if both := set.Intersection(servedBefore); !both.IsEmpty() {
		fail("buckets %s are served by another shard too", both)
	}
	if len(s.Namespaces) > maxNamespaces {
		fail("%d namespaces, at most %d", len(s.Namespaces), maxNamespaces)
	}
	for _, ns := range s.Namespaces {
		if len(ns) > maxNamespace {
			fail("namespace %q is longer than %d characters", ns, maxNamespace)
		}
		if prev, ok := shardOf["namespace/"+ns]; ok {
			fail("namespace %q is served by shard %q too", ns, prev)
		}
		shardOf["namespace/"+ns] = s.ID
	}
	if len(s.Pods) > maxPods {
		fail("%d pods in this cluster, at most %d", len(s.Pods), maxPods)
	}
	for _, p := range s.Pods {
		if p.Name == "" || len(p.Name) > maxPodName || len(p.Address) > maxAddress {
			fail("pod %q: names have 1 to %d characters, addresses at most %d", p.Name, maxPodName, maxAddress)
		}
		if prev, ok := shardOf["pod/"+p.Name]; ok {
			fail("pod %q is listed in shard %q too", p.Name, prev)
		}
		shardOf["pod/"+p.Name] = s.ID
	}
	return errs
}
