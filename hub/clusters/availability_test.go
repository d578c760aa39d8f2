package clusters

import (
	"strings"
	"testing"
	"time"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

func TestAssessAvailability(t *testing.T) {
	renewed := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	expiry := renewed.Add(40 * time.Second)
	// marked is a Lease the ctrlmesh agent renewed: marked as its renewal.
	marked := func(spec coordinationv1.LeaseSpec) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			ctrlmeshv1alpha1.HeartbeatRenewalAnnotation: "mark"}}, Spec: spec}
	}
	lease := marked(coordinationv1.LeaseSpec{RenewTime: ptr.To(metav1.NewMicroTime(renewed)), LeaseDurationSeconds: ptr.To[int32](40)})
	karmada := func(conditions ...metav1.Condition) *karmadaRegistration {
		return &karmadaRegistration{name: "member1", clusters: []clusterv1alpha1.Cluster{{
			ObjectMeta: metav1.ObjectMeta{Name: "member1"}, Status: clusterv1alpha1.ClusterStatus{Conditions: conditions}}}}
	}
	ready := metav1.Condition{Type: clusterv1alpha1.ClusterConditionReady, Status: metav1.ConditionTrue, Reason: "ClusterReady"}
	notReady := metav1.Condition{Type: clusterv1alpha1.ClusterConditionReady, Status: metav1.ConditionFalse, Reason: "ClusterNotReachable"}
	// The agent's clock runs an hour behind the hub's: the hub judges by
	// when it saw the renewal, renewed on its own clock.
	short := marked(coordinationv1.LeaseSpec{RenewTime: ptr.To(metav1.NewMicroTime(renewed)), LeaseDurationSeconds: ptr.To[int32](10)})
	boundExpiry := renewed.Add(route.LapseBound(route.FleetValidity))
	skewed := marked(coordinationv1.LeaseSpec{RenewTime: ptr.To(metav1.NewMicroTime(renewed.Add(-time.Hour))), LeaseDurationSeconds: ptr.To[int32](40)})
	// A Lease renewed only by OCM's agent (or created by OCM's hub): a
	// renewTime, no mark of the ctrlmesh agent.
	unmarked := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: ptr.To(metav1.NewMicroTime(renewed))}}
	for _, tc := range []struct {
		name       string
		now        time.Time
		lease      *coordinationv1.Lease
		seenAt     time.Time
		karmada    *karmadaRegistration
		wantStatus metav1.ConditionStatus
		wantReason string
		wantExpiry time.Time
		wantLapsed bool
	}{
		{"no lease", time.Time{}, nil, time.Time{}, nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat, time.Time{}, true},
		{"a lease never renewed", renewed, &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40)}}, time.Time{},
			nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat, time.Time{}, true},
		{"a lease without duration", renewed, marked(coordinationv1.LeaseSpec{RenewTime: lease.Spec.RenewTime}), time.Time{},
			nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat, time.Time{}, true},
		{"a lease renewed by OCM's agent only", renewed, unmarked, time.Time{},
			nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat, time.Time{}, true},
		{"fresh", renewed.Add(10 * time.Second), lease, renewed, nil, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable, expiry, false},
		{"fresh until just before expiry", expiry.Add(-time.Microsecond), lease, renewed, nil, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable, expiry, false},
		{"expired at expiry", expiry, lease, renewed, nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, expiry, true},
		{"expired long ago", expiry.Add(time.Hour), lease, renewed, nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, expiry, true},
		{"fresh and Karmada Ready", renewed, lease, renewed, karmada(ready), metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable, expiry, false},
		{"fresh but Karmada not Ready", renewed, lease, renewed, karmada(notReady), metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady, expiry, false},
		{"fresh but Karmada without Ready", renewed, lease, renewed, karmada(), metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady, expiry, false},
		{"expired and Karmada Ready", expiry, lease, renewed, karmada(ready), metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, expiry, true},
		// Karmada does not know the member: unavailable while the
		// heartbeat is fresh, but never lapsed for it.
		{"fresh but unknown to Karmada", renewed, lease, renewed, &karmadaRegistration{name: "member1"},
			metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNotFound, expiry, false},
		{"expired and unknown to Karmada", expiry, lease, renewed, &karmadaRegistration{name: "member1"},
			metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, expiry, true},
		{"agent clock behind, renewal seen", renewed.Add(10 * time.Second), skewed, renewed, nil, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable, expiry, false},
		{"never seen renewed", renewed, lease, time.Time{}, nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, time.Time{}, true},
		// A lease shorter than the rules validity's bound is fresh for the
		// bound: the agent's last grants may still run.
		{"short lease, fresh past its duration", renewed.Add(20 * time.Second), short, renewed, nil, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable, boundExpiry, false},
		{"short lease, expired at the bound", boundExpiry, short, renewed, nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, boundExpiry, true},
		// A lease deleted after a renewal the hub saw: not fresh, but
		// the grants made before it may run until the bound.
		{"lease deleted after a renewal", renewed.Add(time.Second), nil, renewed, nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, boundExpiry, false},
		{"lease deleted, bound passed", boundExpiry, nil, renewed, nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat, time.Time{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := assessAvailability(tc.now, tc.lease, tc.seenAt, route.FleetValidity, tc.karmada)
			if got.status != tc.wantStatus || got.reason != tc.wantReason || !got.heartbeatExpiry.Equal(tc.wantExpiry) || got.message == "" || got.lapsed != tc.wantLapsed {
				t.Errorf("got %+v, want %s %s expiring %s, lapsed %t", got, tc.wantStatus, tc.wantReason, tc.wantExpiry, tc.wantLapsed)
			}
		})
	}
}

// TestRenewals: the hub takes a lease as renewed when it sees the ctrlmesh
// agent's mark of its renewal change (not renewTime alone, which OCM's agent
// renews too), on its own clock, whatever the agent's clock says; a lease first
// read after a restart counts as renewed then, unless the cluster was
// judged stale.
func TestRenewals(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	leaseAt := func(renew time.Time) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{ctrlmeshv1alpha1.HeartbeatRenewalAnnotation: renew.Format(time.RFC3339Nano)}},
			Spec:       coordinationv1.LeaseSpec{RenewTime: ptr.To(metav1.NewMicroTime(renew)), LeaseDurationSeconds: ptr.To[int32](40)}}
	}
	// byOCM is lease renewed by OCM's agent at renew: renewTime changed,
	// the ctrlmesh agent's mark not.
	byOCM := func(lease *coordinationv1.Lease, renew time.Time) *coordinationv1.Lease {
		lease = lease.DeepCopy()
		lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(renew))
		return lease
	}
	agentClock := t0.Add(-time.Hour) // an hour behind
	var r renewals
	for i, step := range []struct {
		lease       *coordinationv1.Lease
		judgedStale bool
		now         time.Time
		want        time.Time
	}{
		{leaseAt(agentClock), false, t0, t0},                                                                                                        // first read, not judged stale: renewed now
		{leaseAt(agentClock), false, t0.Add(5 * time.Second), t0},                                                                                   // unchanged: still the first sighting
		{leaseAt(agentClock.Add(10 * time.Second)), false, t0.Add(10 * time.Second), t0.Add(10 * time.Second)},                                      // renewed
		{nil, false, t0.Add(11 * time.Second), t0.Add(10 * time.Second)},                                                                            // lease gone: the renewal seen still bounds the agent's grants
		{leaseAt(agentClock.Add(20 * time.Second)), false, t0.Add(20 * time.Second), t0.Add(20 * time.Second)},                                      // created again: renewed
		{byOCM(leaseAt(agentClock.Add(20*time.Second)), agentClock.Add(30*time.Second)), false, t0.Add(30 * time.Second), t0.Add(20 * time.Second)}, // OCM's agent: not a renewal
	} {
		if got := r.observe("member1", step.lease, step.judgedStale, step.now); !got.Equal(step.want) {
			t.Errorf("step %d: renewed at %v, want %v", i, got, step.want)
		}
	}
	// A restarted hub, whose predecessor judged the cluster stale.
	var restarted renewals
	for i, step := range []struct {
		lease       *coordinationv1.Lease
		judgedStale bool
		now         time.Time
		want        time.Time
	}{
		{leaseAt(agentClock.Add(20 * time.Second)), true, t0.Add(20 * time.Second), time.Time{}},              // first read, judged stale: not seen renewed
		{leaseAt(agentClock.Add(20 * time.Second)), true, t0.Add(25 * time.Second), time.Time{}},              // unchanged
		{leaseAt(agentClock.Add(30 * time.Second)), true, t0.Add(30 * time.Second), t0.Add(30 * time.Second)}, // renewed: seen
	} {
		if got := restarted.observe("member1", step.lease, step.judgedStale, step.now); !got.Equal(step.want) {
			t.Errorf("restarted, step %d: renewed at %v, want %v", i, got, step.want)
		}
	}
}

// setConditions leaves the conditions of others alone and reports changes
// of its own only.
func TestSetConditions(t *testing.T) {
	joined := metav1.Condition{Type: clusterv1.ManagedClusterConditionJoined, Status: metav1.ConditionTrue, Reason: "ManagedClusterJoined"}
	existing := []metav1.Condition{joined}
	avail := availability{status: metav1.ConditionTrue, reason: ctrlmeshv1alpha1.ReasonClusterAvailable, message: "m"}
	if !setConditions(&existing, conditions(existing, true, avail)) {
		t.Fatal("no change reported for new conditions")
	}
	if len(existing) != 3 || existing[0] != joined {
		t.Fatalf("conditions %+v", existing)
	}
	if setConditions(&existing, conditions(existing, true, avail)) {
		t.Error("a change reported for the same conditions")
	}
	avail.status, avail.reason = metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped
	if !setConditions(&existing, conditions(existing, true, avail)) {
		t.Error("no change reported when availability changed")
	}
}

// conditions follows OCM's hub: no HubAccepted before the first acceptance,
// True while accepted, False ("denied") once withdrawn.
func TestConditionsAcceptance(t *testing.T) {
	avail := availability{status: metav1.ConditionUnknown, reason: ctrlmeshv1alpha1.ReasonNoHeartbeat, message: "m"}
	accepted := metav1.Condition{Type: clusterv1.ManagedClusterConditionHubAccepted, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonClusterAccepted}
	denied := metav1.Condition{Type: clusterv1.ManagedClusterConditionHubAccepted, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonClusterDenied}
	for _, tc := range []struct {
		name     string
		old      []metav1.Condition
		accepted bool
		want     *metav1.Condition // HubAccepted; nil for none
	}{
		{"never accepted", nil, false, nil},
		{"accepted", nil, true, &accepted},
		{"still accepted", []metav1.Condition{accepted}, true, &accepted},
		{"acceptance withdrawn", []metav1.Condition{accepted}, false, &denied},
		{"still denied", []metav1.Condition{denied}, false, nil},
		{"accepted again", []metav1.Condition{denied}, true, &accepted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := conditions(tc.old, tc.accepted, avail)
			var hubAccepted *metav1.Condition
			for i := range got {
				if got[i].Type == clusterv1.ManagedClusterConditionHubAccepted {
					hubAccepted = &got[i]
				}
			}
			switch {
			case tc.want == nil && hubAccepted != nil:
				t.Errorf("HubAccepted written: %+v", *hubAccepted)
			case tc.want != nil && (hubAccepted == nil || hubAccepted.Status != tc.want.Status || hubAccepted.Reason != tc.want.Reason):
				t.Errorf("HubAccepted = %+v, want %s %s", hubAccepted, tc.want.Status, tc.want.Reason)
			}
			if last := got[len(got)-1]; last.Type != clusterv1.ManagedClusterConditionAvailable || last.Reason != avail.reason {
				t.Errorf("Available = %+v", last)
			}
		})
	}
}

// karmadaRegistration.assess decides by name and by the ID the agent claims
// (Karmada's spec.id, the member's kube-system UID).
func TestKarmadaRegistration(t *testing.T) {
	ready := metav1.Condition{Type: clusterv1alpha1.ClusterConditionReady, Status: metav1.ConditionTrue, Reason: "ClusterReady"}
	notReady := metav1.Condition{Type: clusterv1alpha1.ClusterConditionReady, Status: metav1.ConditionFalse, Reason: "ClusterNotReachable"}
	cluster := func(name, id string, conditions ...metav1.Condition) clusterv1alpha1.Cluster {
		return clusterv1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: clusterv1alpha1.ClusterSpec{ID: id},
			Status: clusterv1alpha1.ClusterStatus{Conditions: conditions}}
	}
	for _, tc := range []struct {
		name       string
		k          *karmadaRegistration
		wantReason string
		wantIn     []string // in the message
	}{
		{"no Karmada", nil, "", nil},
		{"Ready, same ID", &karmadaRegistration{name: "m1", clusterID: "uid-1", clusters: []clusterv1alpha1.Cluster{cluster("m1", "uid-1", ready)}}, "", nil},
		{"Ready, Cluster without ID", &karmadaRegistration{name: "m1", clusterID: "uid-1", clusters: []clusterv1alpha1.Cluster{cluster("m1", "", ready)}}, "", nil},
		{"Ready, agent claims no ID", &karmadaRegistration{name: "m1", clusters: []clusterv1alpha1.Cluster{cluster("m1", "uid-1", ready)}}, "", nil},
		{"not Ready", &karmadaRegistration{name: "m1", clusterID: "uid-1", clusters: []clusterv1alpha1.Cluster{cluster("m1", "uid-1", notReady)}},
			ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady, []string{`"m1"`, "ClusterNotReachable"}},
		{"no Ready condition", &karmadaRegistration{name: "m1", clusters: []clusterv1alpha1.Cluster{cluster("m1", "")}},
			ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady, []string{"no Ready condition"}},
		{"no Clusters at all", &karmadaRegistration{name: "m1", clusterID: "uid-1"},
			ctrlmeshv1alpha1.ReasonKarmadaClusterNotFound, []string{"karmadactl join m1", "--cluster-name=m1"}},
		{"other Clusters only", &karmadaRegistration{name: "m1", clusterID: "uid-1", clusters: []clusterv1alpha1.Cluster{cluster("m2", "uid-2", ready)}},
			ctrlmeshv1alpha1.ReasonKarmadaClusterNotFound, []string{"karmadactl join m1"}},
		{"known under another name", &karmadaRegistration{name: "m1", clusterID: "uid-1", clusters: []clusterv1alpha1.Cluster{cluster("m2", "uid-2", ready), cluster("edge", "uid-1", ready)}},
			ctrlmeshv1alpha1.ReasonKarmadaClusterNameMismatch, []string{`"edge"`, "--cluster-name=edge", "karmadactl unjoin edge", "karmadactl join m1", "uid-1"}},
		{"same name, another cluster", &karmadaRegistration{name: "m1", clusterID: "uid-1", clusters: []clusterv1alpha1.Cluster{cluster("m1", "uid-9", ready)}},
			ctrlmeshv1alpha1.ReasonKarmadaClusterIDMismatch, []string{"uid-9", "uid-1"}},
		{"same name, another cluster, and this one under another name", &karmadaRegistration{name: "m1", clusterID: "uid-1",
			clusters: []clusterv1alpha1.Cluster{cluster("m1", "uid-9", ready), cluster("edge", "uid-1", ready)}},
			ctrlmeshv1alpha1.ReasonKarmadaClusterIDMismatch, []string{"uid-9"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason, message := tc.k.assess()
			if reason != tc.wantReason || (reason != "") != (message != "") {
				t.Fatalf("assess() = %q, %q; want reason %q", reason, message, tc.wantReason)
			}
			for _, w := range tc.wantIn {
				if !strings.Contains(message, w) {
					t.Errorf("message %q lacks %q", message, w)
				}
			}
		})
	}
}

// judgedStale: only the heartbeat's own verdict "stopped" makes a restarted
// hub wait for a renewal; a cluster unavailable for Karmada's reasons had a
// fresh heartbeat, whose grants may still run. Before, every Available False
// counted, so a restarted hub took such a cluster for lapsed.
func TestJudgedStale(t *testing.T) {
	avail := func(status metav1.ConditionStatus, reason string) []metav1.Condition {
		return []metav1.Condition{{Type: clusterv1.ManagedClusterConditionAvailable, Status: status, Reason: reason}}
	}
	for _, tc := range []struct {
		name       string
		conditions []metav1.Condition
		want       bool
	}{
		{"no condition", nil, false},
		{"available", avail(metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable), false},
		{"lease stopped", avail(metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped), true},
		{"lease stopped, as False before", avail(metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped), true},
		{"no heartbeat yet", avail(metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat), false},
		{"Karmada not Ready", avail(metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady), false},
		{"unknown to Karmada", avail(metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNotFound), false},
		{"another name in Karmada", avail(metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNameMismatch), false},
		{"another cluster in Karmada", avail(metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterIDMismatch), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judgedStale(tc.conditions); got != tc.want {
				t.Errorf("judgedStale = %t, want %t", got, tc.want)
			}
		})
	}
}
