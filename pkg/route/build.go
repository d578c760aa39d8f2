package route

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// Build returns the ShardRoute of one member cluster for the route table of
// config's placement domain: in the config's namespace and name, with the
// config's selectors, controller, webhook, limits, interception, scope and
// bucket count, and the table's shards.
//
// In PerCluster scope the table is the cluster's own. In Fleet scope one
// table spans every selected cluster, and each member's route lists every
// shard, so that its proxies know the whole ownership (no two shards serve a
// bucket, and a namespace a shard serves exactly is excluded everywhere
// else), but lists only the pods of that cluster: pod names are unique only
// within a cluster, and proxies find their own shard by pod name. Webhook
// requests for a namespace served by another cluster's shard therefore find
// no peer to forward to; pod addresses are rarely routable across clusters
// anyway.
//
// A shard whose buckets and namespaces are all pending serves nothing now;
// it is listed with its pending buckets and namespaces and its pods, whose
// proxies take the shard's leader-election lock and serve nothing until the
// grant.
//
// addresses gives the webhook address of pods that have one (the agents
// report them); a pod without one is listed without.
//
// In Fleet scope the rules expire: validity, in whole seconds, becomes the
// route's validitySeconds (see FleetValidity).
//
// The route's routingGeneration is table.Generation, and its rulesHash is
// RulesHash of its spec. The table is checked by Validate, and the route as
// the CRD would check it; fields copied from the config were validated by the
// ShardingConfig CRD and are not checked again.
func Build(config *ctrlmeshv1alpha1.ShardingConfig, cluster string, table Table, addresses map[PodID]string, validity time.Duration) (*ctrlmeshv1alpha1.ShardRoute, error) {
	spec := &config.Spec
	if spec.Scope != ctrlmeshv1alpha1.ScopePerCluster && spec.Scope != ctrlmeshv1alpha1.ScopeFleet {
		return nil, fmt.Errorf("ShardingConfig %s/%s: scope %q is neither %s nor %s", config.Namespace, config.Name, spec.Scope, ctrlmeshv1alpha1.ScopePerCluster, ctrlmeshv1alpha1.ScopeFleet)
	}
	space, err := sharding.NewSpace(int(spec.Sharding.Buckets))
	if err != nil {
		return nil, fmt.Errorf("ShardingConfig %s/%s: sharding.buckets: %w", config.Namespace, config.Name, err)
	}
	route := &ctrlmeshv1alpha1.ShardRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: ctrlmeshv1alpha1.ShardRouteGVK.GroupVersion().String(), Kind: ctrlmeshv1alpha1.ShardRouteGVK.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: config.Name},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster:           cluster,
			RoutingGeneration: table.Generation,
			Scope:             spec.Scope,
			Buckets:           spec.Sharding.Buckets,
			Selector:          *spec.Selector.DeepCopy(),
			Controller:        spec.Controller.DeepCopy(),
			Webhook:           spec.Webhook.DeepCopy(),
			Limits:            spec.Limits.DeepCopy(),
			Interception:      spec.Interception,
			Isolation:         spec.Isolation.DeepCopy(),
		},
	}
	if spec.Canary != nil {
		route.Spec.CanarySelector = spec.Canary.Selector.DeepCopy()
	}
	for _, s := range spec.Subsets {
		route.Spec.Subsets = append(route.Spec.Subsets, ctrlmeshv1alpha1.RouteSubset{Name: s.Name, Selector: *s.Selector.DeepCopy(),
			NamespaceSelector: s.NamespaceSelector.DeepCopy(), NamespaceRegex: s.NamespaceRegex})
	}
	if spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
		route.Spec.ValiditySeconds = int32(validity / time.Second)
	}
	building := func(err error) error {
		return fmt.Errorf("building the ShardRoute of cluster %s for ShardingConfig %s/%s at generation %d: %w", cluster, config.Namespace, config.Name, table.Generation, err)
	}
	if _, err := Validate(space, table.Shards); err != nil {
		return nil, building(err)
	}
	for _, s := range table.Shards {
		if s.servesNothing() {
			continue
		}
		shard, err := routeShard(spec.Scope, cluster, s, addresses)
		if err != nil {
			return nil, building(err)
		}
		route.Spec.Shards = append(route.Spec.Shards, shard)
	}
	route.Spec.RulesHash = RulesHash(&route.Spec)
	if err := checkCRD(&route.Spec); err != nil {
		return nil, fmt.Errorf("the ShardRoute of cluster %s for ShardingConfig %s/%s at generation %d is invalid: %w", cluster, config.Namespace, config.Name, table.Generation, err)
	}
	return route, nil
}

// routeShard is the RouteShard of one shard in cluster.
func routeShard(scope ctrlmeshv1alpha1.ShardingScope, cluster string, s Shard, addresses map[PodID]string) (ctrlmeshv1alpha1.RouteShard, error) {
	shard := ctrlmeshv1alpha1.RouteShard{
		ID:                s.ID,
		Buckets:           s.Buckets.String(),
		PendingBuckets:    s.PendingBuckets.String(),
		Namespaces:        slices.Clone(s.Namespaces),
		PendingNamespaces: slices.Clone(s.PendingNamespaces),
		Canary:            s.Canary,
		Subset:            s.Subset,
	}
	for _, pod := range s.Pods {
		if pod.Cluster != cluster {
			if scope == ctrlmeshv1alpha1.ScopePerCluster {
				return ctrlmeshv1alpha1.RouteShard{}, fmt.Errorf("shard %q: pod %s is of another cluster, but in %s scope the table is that of cluster %s alone", s.ID, pod, scope, cluster)
			}
			continue
		}
		shard.Pods = append(shard.Pods, ctrlmeshv1alpha1.RoutePod{Name: pod.Name, Address: addresses[pod]})
	}
	return shard, nil
}

// RulesHash identifies a route spec: the hex SHA-256 of its JSON with
// rulesHash left out. The routing generation is part of it, so that a pod's
// appliedRulesHash names exactly one generation of the route.
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

// checkCRD checks what Build derives from the table against the ShardRoute
// CRD's schema, so that the hub learns of a route the members' API servers
// would refuse before it publishes it.
func checkCRD(spec *ctrlmeshv1alpha1.ShardRouteSpec) error {
	var errs []error
	if spec.Cluster == "" || len(spec.Cluster) > maxClusterName {
		errs = append(errs, fmt.Errorf("spec.cluster %q must have 1 to %d characters", spec.Cluster, maxClusterName))
	}
	if spec.RoutingGeneration < 1 {
		errs = append(errs, fmt.Errorf("spec.routingGeneration is %d: a table of generation 0 is nothing published", spec.RoutingGeneration))
	}
	if spec.RulesHash == "" || len(spec.RulesHash) > maxRulesHash {
		errs = append(errs, fmt.Errorf("spec.rulesHash must have 1 to %d characters", maxRulesHash))
	}
	if len(spec.Shards) > maxShards {
		errs = append(errs, fmt.Errorf("spec.shards: %d shards, at most %d", len(spec.Shards), maxShards))
	}
	for _, s := range spec.Shards {
		errs = append(errs, checkShardCRD(s)...)
	}
	return errors.Join(errs...)
}

func checkShardCRD(s ctrlmeshv1alpha1.RouteShard) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("shard %q: "+format, append([]any{s.ID}, args...)...))
	}
	if len(s.ID) > maxShardID || !shardIDPattern.MatchString(s.ID) {
		fail("the ID must be a DNS label of at most %d characters", maxShardID)
	}
	if s.Buckets == "" && s.PendingBuckets == "" && len(s.Namespaces) == 0 && len(s.PendingNamespaces) == 0 {
		fail("has no buckets, pending buckets, namespaces or pending namespaces")
	}
	if len(s.Buckets) > maxBucketsString || len(s.PendingBuckets) > maxBucketsString {
		fail("buckets and pendingBuckets may have at most %d characters each", maxBucketsString)
	}
	if len(s.Namespaces) > maxNamespaces {
		fail("%d namespaces, at most %d", len(s.Namespaces), maxNamespaces)
	}
	if len(s.PendingNamespaces) > maxNamespaces {
		fail("%d pending namespaces, at most %d", len(s.PendingNamespaces), maxNamespaces)
	}
	for _, ns := range s.Namespaces {
		if len(ns) > maxNamespace {
			fail("namespace %q is longer than %d characters", ns, maxNamespace)
		}
	}
	if len(s.Pods) > maxPods {
		fail("%d pods in this cluster, at most %d", len(s.Pods), maxPods)
	}
	for _, p := range s.Pods {
		if p.Name == "" || len(p.Name) > maxPodName || len(p.Address) > maxAddress {
			fail("pod %q: names have 1 to %d characters, addresses at most %d", p.Name, maxPodName, maxAddress)
		}
	}
	return errs
}
