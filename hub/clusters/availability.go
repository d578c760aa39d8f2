package clusters

import (
	"fmt"
	"sync"
	"time"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

// availability is the state of a cluster's Available condition.
type availability struct {
	status  metav1.ConditionStatus
	reason  string
	message string
	// heartbeatExpiry is when the heartbeat runs out; zero without one.
	heartbeatExpiry time.Time
	// lapsed: the hub saw no heartbeat recent enough for any rules
	// validity its agent granted to run yet (route.LapseBound), so no
	// proxy there serves rules that expire. Only then may the hub give the
	// cluster's buckets to pods elsewhere without its proxies' consent.
	lapsed bool
}

// karmadaRegistration is what Karmada knows of a member, where the hub
// serves Karmada's Clusters.
type karmadaRegistration struct {
	// name is the member's name: its ManagedCluster's.
	name string
	// clusterID is the ID the member's agent claims (membership.ClaimClusterID):
	// the UID of the member's kube-system namespace, which Karmada writes as
	// its Cluster's spec.id. Empty when it claims none.
	clusterID string
	// clusters are all of Karmada's Clusters.
	clusters []clusterv1alpha1.Cluster
}

// assess returns why Karmada applies no Works to the member, as an
// Available reason and a message saying what to do; "" when its Cluster of
// the member's name is the member (by ID, where both have one) and Ready.
// A nil registration (the hub serves no Karmada Clusters) has nothing to
// say.
//
// Karmada's Works for the member live in karmada-es-<name>, and Karmada
// applies them to its Cluster <name>: to none when there is no such
// Cluster, to another cluster when that Cluster has another ID. The IDs are
// compared only when both are known: Karmada writes spec.id when it joins a
// cluster (karmadactl join, karmada-agent), a Cluster created by hand may
// have none.
func (k *karmadaRegistration) assess() (reason, message string) {
	if k == nil {
		return "", ""
	}
	var byName, byID *clusterv1alpha1.Cluster
	for i := range k.clusters {
		c := &k.clusters[i]
		if c.Name == k.name {
			byName = c
		} else if k.clusterID != "" && c.Spec.ID == k.clusterID && (byID == nil || c.Name < byID.Name) {
			byID = c
		}
	}
	switch {
	case byName != nil && k.clusterID != "" && byName.Spec.ID != "" && byName.Spec.ID != k.clusterID:
		return ctrlmeshv1alpha1.ReasonKarmadaClusterIDMismatch, fmt.Sprintf(
			"Karmada's Cluster %q is another cluster: its spec.id is %s, the agent of this one claims %s (%s). "+
				"The hub places nothing here: Karmada would apply its Works there. Join this member to Karmada under a name of its own, "+
				"and run its agent with that name (--cluster-name), or fix the agent's --cluster-name.",
			k.name, byName.Spec.ID, k.clusterID, membership.ClaimClusterID)
	case byName != nil:
		ready := meta.FindStatusCondition(byName.Status.Conditions, clusterv1alpha1.ClusterConditionReady)
		if ready != nil && ready.Status == metav1.ConditionTrue {
			return "", ""
		}
		why := "no Ready condition"
		if ready != nil {
			why = fmt.Sprintf("Ready is %s (%s)", ready.Status, ready.Reason)
		}
		return ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady, fmt.Sprintf(
			"Karmada's Cluster %q is not ready: %s. The hub places nothing here until Karmada reports it Ready.", k.name, why)
	case byID != nil:
		return ctrlmeshv1alpha1.ReasonKarmadaClusterNameMismatch, fmt.Sprintf(
			"Karmada knows this member as Cluster %q (its spec.id %s is the ID the agent claims as %s), not as %q: "+
				"Works for %q would never be applied, so the hub places nothing here. Run the agent with --cluster-name=%s, "+
				"or join the member to Karmada as %s (karmadactl unjoin %s, then karmadactl join %s --cluster-kubeconfig=<member kubeconfig>).",
			byID.Name, k.clusterID, membership.ClaimClusterID, k.name, k.name, byID.Name, k.name, byID.Name, k.name)
	default:
		return ctrlmeshv1alpha1.ReasonKarmadaClusterNotFound, fmt.Sprintf(
			"Karmada has no Cluster %q: Works for it would never be applied, so the hub places nothing here. "+
				"Join the member to Karmada as %s: karmadactl join %s --cluster-kubeconfig=<member kubeconfig> (Push), "+
				"or karmadactl register with --cluster-name=%s (Pull).", k.name, k.name, k.name, k.name)
	}
}

// heartbeatLifetime is how long after the hub saw a renewal a heartbeat
// counts as fresh: the lease's duration, but never less than the bound of
// the rules validity the agent grants in step with its heartbeat, so that a
// cluster judged unavailable for lack of heartbeat holds no valid rules.
func heartbeatLifetime(lease *coordinationv1.Lease, rulesValidity time.Duration) time.Duration {
	bound := route.LapseBound(rulesValidity)
	if lease == nil || lease.Spec.LeaseDurationSeconds == nil {
		return bound
	}
	return max(time.Duration(*lease.Spec.LeaseDurationSeconds)*time.Second, bound)
}

// assessAvailability decides whether a cluster is available at now, the
// hub's time: while its heartbeat lease is fresh, and, where the hub serves
// Karmada's Clusters (karmada not nil), while Karmada's Cluster of the
// member is Ready (see karmadaRegistration.assess).
//
// Freshness is judged by the hub's own observation, not by the renewTime
// the agent writes: renewedAt is when the hub saw the lease renewed by the
// ctrlmesh agent (its agentRenewal change), on the hub's clock; zero when
// the hub has not seen it renewed. An agent whose clock runs behind or ahead of the hub's writes
// renewTimes the hub cannot compare with its own clock, and would flap.
//
// The heartbeat stays fresh for heartbeatLifetime after the hub saw it
// renewed; a lease deleted after the hub saw it renewed stops being fresh
// at once, but the cluster counts as lapsed only once that lifetime ran out.
func assessAvailability(now time.Time, lease *coordinationv1.Lease, renewedAt time.Time, rulesValidity time.Duration, karmada *karmadaRegistration) availability {
	if agentRenewal(lease) == "" || lease.Spec.LeaseDurationSeconds == nil {
		if expiry := renewedAt.Add(heartbeatLifetime(lease, rulesValidity)); !renewedAt.IsZero() && now.Before(expiry) {
			return availability{status: metav1.ConditionUnknown, reason: ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, heartbeatExpiry: expiry,
				message: "The cluster's heartbeat lease is gone."}
		}
		return availability{status: metav1.ConditionUnknown, reason: ctrlmeshv1alpha1.ReasonNoHeartbeat, lapsed: true,
			message: "The cluster's agent has not renewed its heartbeat lease yet."}
	}
	if renewedAt.IsZero() {
		return availability{status: metav1.ConditionUnknown, reason: ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, lapsed: true,
			message: "The cluster's agent stopped renewing its heartbeat lease."}
	}
	expiry := renewedAt.Add(heartbeatLifetime(lease, rulesValidity))
	if !now.Before(expiry) {
		return availability{status: metav1.ConditionUnknown, reason: ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, heartbeatExpiry: expiry, lapsed: true,
			message: "The cluster's agent stopped renewing its heartbeat lease."}
	}
	// A fresh heartbeat of a cluster Karmada does not apply Works to:
	// unavailable, so that the hub places nothing there, but not lapsed —
	// its proxies may hold rules the agent keeps valid, so its buckets move
	// only as any unavailable cluster's do.
	if reason, message := karmada.assess(); reason != "" {
		return availability{status: metav1.ConditionFalse, reason: reason, heartbeatExpiry: expiry, message: message}
	}
	return availability{status: metav1.ConditionTrue, reason: ctrlmeshv1alpha1.ReasonClusterAvailable, heartbeatExpiry: expiry,
		message: "The cluster's agent renews its heartbeat lease."}
}

// renewals remembers, per cluster, when the hub saw its heartbeat lease
// renewed. It is the hub's memory, lost on restart: a restarted hub takes a
// lease it first reads as renewed then — so a dead agent is judged gone one
// lease duration after the restart, never earlier than it could be —
// unless its predecessor had judged it stale (Available with reason
// ReasonLeaseUpdateStopped, see judgedStale): that one stays stale until
// the hub sees a renewal, so a restart neither revives a lost member nor
// writes its conditions.
type renewals struct {
	mu   sync.Mutex
	seen map[string]renewal
}

// agentRenewal is the ctrlmesh agent's mark of its last renewal of lease
// (ctrlmeshv1alpha1.HeartbeatRenewalAnnotation); "" for none or no lease.
//
// The Lease is OCM's, and where OCM's registration agent (the klusterlet)
// runs in the member too it renews the same Lease's renewTime; only the
// ctrlmesh agent grants its proxies rules validity in step with its
// renewals, so only its renewals keep the cluster fresh for the hub:
// otherwise a live klusterlet would keep a cluster whose ctrlmesh agent is
// dead from ever lapsing, and its buckets from moving. The klusterlet keeps
// the annotation (it reads the Lease, sets renewTime and updates it) but
// never changes it.
func agentRenewal(lease *coordinationv1.Lease) string {
	if lease == nil {
		return ""
	}
	return lease.Annotations[ctrlmeshv1alpha1.HeartbeatRenewalAnnotation]
}

type renewal struct {
	// mark is the agent's mark of its renewal (agentRenewal): its
	// renewTime, on the agent's clock, compared only for equality.
	mark string
	// at is when the hub saw it, on the hub's clock; zero for "not seen
	// renewed".
	at time.Time
}

// observe returns when the hub saw the cluster's lease renewed, given the
// lease read now and whether the cluster was last judged stale.
func (r *renewals) observe(cluster string, lease *coordinationv1.Lease, judgedStale bool, now time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.seen[cluster]
	mark := agentRenewal(lease)
	if mark == "" {
		// A lease deleted after a renewal the hub saw: that renewal
		// still bounds the validity the agent granted.
		return last.at
	}
	switch {
	case ok && last.mark == mark:
		return last.at
	case ok || !judgedStale:
		last = renewal{mark: mark, at: now}
	default:
		last = renewal{mark: mark}
	}
	if r.seen == nil {
		r.seen = map[string]renewal{}
	}
	r.seen[cluster] = last
	return last.at
}

// forget drops what the hub saw of a cluster that is gone.
func (r *renewals) forget(cluster string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.seen, cluster)
}

// conditions are the ManagedCluster conditions the controller owns, as
// OCM's hub writes them: HubAccepted True while spec.hubAcceptsClient is
// true, False ("denied") once it was True and the acceptance was withdrawn,
// none for a cluster never accepted (OCM's lease controller takes a cluster
// with HubAccepted for one accepted once); and Available. old are the
// conditions the ManagedCluster has.
func conditions(old []metav1.Condition, accepted bool, a availability) []metav1.Condition {
	var out []metav1.Condition
	switch {
	case accepted:
		out = append(out, metav1.Condition{Type: clusterv1.ManagedClusterConditionHubAccepted, Status: metav1.ConditionTrue,
			Reason: ctrlmeshv1alpha1.ReasonClusterAccepted, Message: "Accepted by hub cluster admin"})
	case meta.IsStatusConditionTrue(old, clusterv1.ManagedClusterConditionHubAccepted):
		out = append(out, metav1.Condition{Type: clusterv1.ManagedClusterConditionHubAccepted, Status: metav1.ConditionFalse,
			Reason: ctrlmeshv1alpha1.ReasonClusterDenied, Message: "Denied by hub cluster admin"})
	}
	return append(out, metav1.Condition{
		Type: clusterv1.ManagedClusterConditionAvailable, Status: a.status, Reason: a.reason, Message: a.message,
	})
}

// setConditions sets want in conditions, leaving the others alone, and
// reports whether anything changed.
func setConditions(conditions *[]metav1.Condition, want []metav1.Condition) bool {
	changed := false
	for _, c := range want {
		if meta.SetStatusCondition(conditions, c) {
			changed = true
		}
	}
	return changed
}
