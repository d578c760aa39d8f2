package clusters

import (
	"testing"
	"time"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
)

func TestAssessAvailability(t *testing.T) {
	renewed := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	expiry := renewed.Add(40 * time.Second)
	lease := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
		RenewTime: ptr.To(metav1.NewMicroTime(renewed)), LeaseDurationSeconds: ptr.To[int32](40)}}
	karmada := func(conditions ...metav1.Condition) *clusterv1alpha1.Cluster {
		return &clusterv1alpha1.Cluster{Status: clusterv1alpha1.ClusterStatus{Conditions: conditions}}
	}
	ready := metav1.Condition{Type: clusterv1alpha1.ClusterConditionReady, Status: metav1.ConditionTrue, Reason: "ClusterReady"}
	notReady := metav1.Condition{Type: clusterv1alpha1.ClusterConditionReady, Status: metav1.ConditionFalse, Reason: "ClusterNotReachable"}
	for _, tc := range []struct {
		name       string
		now        time.Time
		lease      *coordinationv1.Lease
		karmada    *clusterv1alpha1.Cluster
		wantStatus metav1.ConditionStatus
		wantReason string
		wantExpiry time.Time
	}{
		{"no lease", renewed, nil, nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat, time.Time{}},
		{"a lease never renewed", renewed, &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40)}},
			nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat, time.Time{}},
		{"a lease without duration", renewed, &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: lease.Spec.RenewTime}},
			nil, metav1.ConditionUnknown, ctrlmeshv1alpha1.ReasonNoHeartbeat, time.Time{}},
		{"fresh", renewed.Add(10 * time.Second), lease, nil, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable, expiry},
		{"fresh until just before expiry", expiry.Add(-time.Microsecond), lease, nil, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable, expiry},
		{"expired at expiry", expiry, lease, nil, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, expiry},
		{"expired long ago", expiry.Add(time.Hour), lease, nil, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, expiry},
		{"fresh and Karmada Ready", renewed, lease, karmada(ready), metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable, expiry},
		{"fresh but Karmada not Ready", renewed, lease, karmada(notReady), metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady, expiry},
		{"fresh but Karmada without Ready", renewed, lease, karmada(), metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady, expiry},
		{"expired and Karmada Ready", expiry, lease, karmada(ready), metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped, expiry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := assessAvailability(tc.now, tc.lease, tc.karmada)
			if got.status != tc.wantStatus || got.reason != tc.wantReason || !got.heartbeatExpiry.Equal(tc.wantExpiry) || got.message == "" {
				t.Errorf("got %+v, want %s %s expiring %s", got, tc.wantStatus, tc.wantReason, tc.wantExpiry)
			}
		})
	}
}

// setConditions leaves the conditions of others alone and reports changes
// of its own only.
func TestSetConditions(t *testing.T) {
	joined := metav1.Condition{Type: clusterv1.ManagedClusterConditionJoined, Status: metav1.ConditionTrue, Reason: "ManagedClusterJoined"}
	existing := []metav1.Condition{joined}
	avail := availability{status: metav1.ConditionTrue, reason: ctrlmeshv1alpha1.ReasonClusterAvailable, message: "m"}
	if !setConditions(&existing, conditions(true, avail)) {
		t.Fatal("no change reported for new conditions")
	}
	if len(existing) != 3 || existing[0] != joined {
		t.Fatalf("conditions %+v", existing)
	}
	if setConditions(&existing, conditions(true, avail)) {
		t.Error("a change reported for the same conditions")
	}
	avail.status, avail.reason = metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonLeaseUpdateStopped
	if !setConditions(&existing, conditions(true, avail)) {
		t.Error("no change reported when availability changed")
	}
}
