package route

import (
	"time"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// FleetValidity is the validity of rules in Fleet scope
// (spec.validitySeconds): how long a proxy serves its rules past the
// sending of its last granted renewal request.
//
// Why rules expire only in Fleet scope: there the hub gives a lost member's
// buckets to pods in other members, and a member cut off from the hub (or
// whose agent is down) cannot learn that; its proxies must stop on their
// own. In PerCluster scope no other cluster's pod can be granted a
// cluster's buckets, so its proxies keep serving through a hub outage.
//
// Why the proxy's own clock is enough: a proxy counts from the moment it
// sent its request, on its monotonic clock; the agent grants a request
// only after it read it and then renewed its heartbeat, which the hub
// observes later still on the hub's monotonic clock. So every proxy's
// validity ends before the hub's last observation plus the validity, in
// real time, whatever the offsets between the clocks; LapseBound adds
// room for the clocks' rates.
const FleetValidity = 30 * time.Second

// LapseBound is how long after the hub last observed a member's heartbeat
// every rules validity granted in that member has surely ended on the
// hub's clock: the validity stretched by 10% for clock rates (real clocks
// drift by parts per million; NTP slews at most 0.05%) plus 2 s.
func LapseBound(validity time.Duration) time.Duration {
	return validity + validity/10 + 2*time.Second
}

// Validity is the validity of a route's rules; 0 when they do not expire.
func Validity(spec *ctrlmeshv1alpha1.ShardRouteSpec) time.Duration {
	return time.Duration(spec.ValiditySeconds) * time.Second
}
