package routestatus

import (
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// renewals records when the agent saw each shard lease renewed, by its own
// clock, and judges the lease's expiry from that, as client-go's leader
// election does. A lease's renewTime was written by its holder's clock, on
// another node: judged against the agent's clock, a minute of skew would
// make every live leader look expired (the agent's clock ahead) or a crashed
// one look alive a minute longer (behind), stalling every handover of its
// buckets. Safe for concurrent use: the watch's predicate and the
// reconciles both record.
type renewals struct {
	clock clock.PassiveClock

	mu   sync.Mutex
	seen map[types.NamespacedName]renewal
}

// renewal is the last renewal of a lease the agent saw.
type renewal struct {
	// spec as seen; any change of it is a renewal (or a new holder).
	spec coordinationv1.LeaseSpec
	// at is when the agent first saw spec.
	at time.Time
}

func newRenewals(c clock.PassiveClock) *renewals {
	return &renewals{clock: c, seen: map[types.NamespacedName]renewal{}}
}

// observe records the lease as seen now and returns when the agent first
// saw its current spec.
func (r *renewals) observe(lease *coordinationv1.Lease) time.Time {
	key := types.NamespacedName{Namespace: lease.Namespace, Name: lease.Name}
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.seen[key]
	if ok && equality.Semantic.DeepEqual(last.spec, lease.Spec) {
		return last.at
	}
	now := r.clock.Now()
	r.seen[key] = renewal{spec: *lease.Spec.DeepCopy(), at: now}
	return now
}

// expiry is when the lease runs out unless renewed: its duration after the
// agent first saw its current renewal. False when the lease does not say
// it was renewed or for how long, so that its holder stands.
func (r *renewals) expiry(lease *coordinationv1.Lease) (time.Time, bool) {
	spec := lease.Spec
	if spec.RenewTime == nil || spec.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	return r.observe(lease).Add(time.Duration(*spec.LeaseDurationSeconds) * time.Second), true
}

// expired tells whether the lease, as last seen, has run out.
func (r *renewals) expired(lease *coordinationv1.Lease) bool {
	at, ok := r.expiry(lease)
	return ok && !at.After(r.clock.Now())
}

// forget drops the record of a deleted lease.
func (r *renewals) forget(lease *coordinationv1.Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.seen, types.NamespacedName{Namespace: lease.Namespace, Name: lease.Name})
}
