package operator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
)

// TestOnlyTheLeaderReconciles runs two replicas against one Lease: exactly
// one holds it, under its pod name, and only it reconciles; when it stops,
// it releases the Lease, the other takes over and reconciles, and no object
// was ever reconciled by both at once.
func TestOnlyTheLeaderReconciles(t *testing.T) {
	c := member(t)
	ns := newNamespace(t, c, "leader-")
	const lock = "demo-operator-leader-test"

	a := startOperator(t, c, operator.Options{PodName: "pod-a", LeaderElectionID: lock, LeaderElectionNamespace: ns})
	b := startOperator(t, c, operator.Options{PodName: "pod-b", LeaderElectionID: lock, LeaderElectionNamespace: ns})

	var holder string
	eventually(t, 30*time.Second, func() (bool, string) {
		var err error
		holder, err = leaseHolder(c, ns, lock)
		if err != nil {
			return false, err.Error()
		}
		return holder == "pod-a" || holder == "pod-b", fmt.Sprintf("Lease %s/%s holder %q, want pod-a or pod-b", ns, lock, holder)
	})
	leader, follower := a, b
	if holder == "pod-b" {
		leader, follower = b, a
	}
	t.Logf("%s leads, %s follows", leader.pod, follower.pod)

	managed := []string{"one", "two", "three"}
	for i, name := range managed {
		mustCreate(t, c, newConfigMap(ns, name, managedLabels(), map[string]string{"n": fmt.Sprint(i)}))
	}
	for _, name := range managed {
		waitReconciledBy(t, c, ns, name, leader.pod)
	}

	if got, err := leaseHolder(c, ns, lock); err != nil || got != leader.pod {
		t.Fatalf("Lease holder = %q (%v), want %s still", got, err, leader.pod)
	}
	if recs := follower.rec.Records(); len(recs) != 0 {
		t.Fatalf("the follower %s reconciled while %s led: %v", follower.pod, leader.pod, recs)
	}
	leaderRecs := recordsFor(leader.rec.Records(), ns)
	for _, name := range managed {
		if !hasRecord(leaderRecs, name) {
			t.Errorf("the leader has no record of reconciling %s/%s: %v", ns, name, leaderRecs)
		}
	}
	for _, in := range []*instance{a, b} {
		if ok, err := in.running(); !ok {
			t.Fatalf("%s stopped: %v", in.pod, err)
		}
	}

	// The leader steps down: it releases the Lease on the way out.
	if err := leader.stop(); err != nil {
		t.Fatalf("stopping the leader %s: %v", leader.pod, err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		got, err := leaseHolder(c, ns, lock)
		if err != nil {
			return false, err.Error()
		}
		return got == follower.pod, fmt.Sprintf("Lease holder %q, want %s", got, follower.pod)
	})
	mustCreate(t, c, newConfigMap(ns, "after-failover", managedLabels(), map[string]string{"n": "new"}))
	waitReconciledBy(t, c, ns, "after-failover", follower.pod)
	// The new leader lists everything again and takes the old objects over.
	for _, name := range managed {
		waitReconciledBy(t, c, ns, name, follower.pod)
	}

	all := append(recordsFor(leader.rec.Records(), ns), recordsFor(follower.rec.Records(), ns)...)
	if overlaps := operator.Overlaps(all); len(overlaps) != 0 {
		t.Fatalf("double reconciles across the handover: %v", overlaps)
	}
	lastLeader, firstFollower := latestEnd(recordsFor(leader.rec.Records(), ns)), earliestStart(recordsFor(follower.rec.Records(), ns))
	if !lastLeader.Before(firstFollower) {
		t.Fatalf("the new leader started reconciling at %s, before the old one's last reconcile ended at %s", firstFollower, lastLeader)
	}
}

// TestUnmanagedConfigMapsAreNeverReconciled creates ConfigMaps without the
// managed label (or with another value), then a managed one as a barrier:
// once the barrier is reconciled, the others must be untouched and never
// have been reconciled.
func TestUnmanagedConfigMapsAreNeverReconciled(t *testing.T) {
	c := member(t)
	ns := newNamespace(t, c, "unmanaged-")
	op := startOperator(t, c, operator.Options{PodName: "pod-u", LeaderElectionNamespace: ns})

	tests := []struct {
		name   string
		labels map[string]string
	}{
		{name: "no-labels"},
		{name: "other-label", labels: map[string]string{"app": "demo"}},
		{name: "managed-false", labels: map[string]string{operator.ManagedLabel: "false"}},
		{name: "managed-uppercase", labels: map[string]string{operator.ManagedLabel: "TRUE"}},
		{name: "managed-empty", labels: map[string]string{operator.ManagedLabel: ""}},
		{name: "similar-key", labels: map[string]string{"demo.ctrlmesh.io/managed-by": "true"}},
	}
	for _, tt := range tests {
		mustCreate(t, c, newConfigMap(ns, tt.name, tt.labels, map[string]string{"k": "v"}))
	}
	mustCreate(t, c, newConfigMap(ns, "barrier", managedLabels(), map[string]string{"k": "v"}))
	waitReconciledBy(t, c, ns, "barrier", op.pod)

	recs := recordsFor(op.rec.Records(), ns)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cm, err := getConfigMap(c, ns, tt.name)
			if err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{operator.ReconciledByAnnotation, operator.DataHashAnnotation} {
				if v, ok := cm.Annotations[key]; ok {
					t.Errorf("unmanaged ConfigMap has %s=%q", key, v)
				}
			}
			if hasRecord(recs, tt.name) {
				t.Errorf("unmanaged ConfigMap %s/%s was reconciled: %v", ns, tt.name, recs)
			}
		})
	}
}

// TestReconcileKeepsAnnotationsCurrent checks what the reconciler writes for
// each starting state, that it writes nothing when the annotations are
// already right, and that it follows data changes without looping.
func TestReconcileKeepsAnnotationsCurrent(t *testing.T) {
	c := member(t)
	ns := newNamespace(t, c, "reconcile-")
	const pod = "pod-r"
	data := map[string]string{"greeting": "hello"}
	rightHash := operator.DataHash(newConfigMap(ns, "x", nil, data))

	tests := []struct {
		name        string
		annotations map[string]string
		wantWrite   bool
	}{
		{name: "no-annotations", wantWrite: true},
		{name: "other-pod", annotations: map[string]string{operator.ReconciledByAnnotation: "pod-old", operator.DataHashAnnotation: rightHash}, wantWrite: true},
		{name: "stale-hash", annotations: map[string]string{operator.ReconciledByAnnotation: pod, operator.DataHashAnnotation: "0000000000000000"}, wantWrite: true},
		{name: "already-right", annotations: map[string]string{operator.ReconciledByAnnotation: pod, operator.DataHashAnnotation: rightHash}, wantWrite: false},
	}
	created := map[string]string{} // name → resourceVersion at creation
	for _, tt := range tests {
		cm := newConfigMap(ns, tt.name, managedLabels(), data)
		cm.Annotations = tt.annotations
		mustCreate(t, c, cm)
		created[tt.name] = cm.ResourceVersion
	}
	op := startOperator(t, c, operator.Options{PodName: pod, LeaderElectionNamespace: ns})

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cm := waitReconciledBy(t, c, ns, tt.name, pod)
			eventually(t, 30*time.Second, func() (bool, string) {
				return hasRecord(op.rec.Records(), tt.name), "no reconcile recorded"
			})
			if wrote := cm.ResourceVersion != created[tt.name]; wrote != tt.wantWrite {
				t.Fatalf("resourceVersion %s → %s: wrote=%v, want %v", created[tt.name], cm.ResourceVersion, wrote, tt.wantWrite)
			}
		})
	}

	// A data change is followed by a new hash, then nothing more.
	cm, err := getConfigMap(c, ns, "no-annotations")
	if err != nil {
		t.Fatal(err)
	}
	before := cm.Annotations[operator.DataHashAnnotation]
	cm.Data["greeting"] = "bonjour"
	if err := c.Client.Update(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	cm = waitReconciledBy(t, c, ns, "no-annotations", pod)
	if cm.Annotations[operator.DataHashAnnotation] == before {
		t.Fatalf("data-hash did not change with the data: %s", before)
	}
	settled := cm.ResourceVersion
	count := len(recordsOf(op.rec.Records(), ns, "no-annotations"))
	time.Sleep(2 * time.Second)
	cm, err = getConfigMap(c, ns, "no-annotations")
	if err != nil {
		t.Fatal(err)
	}
	if cm.ResourceVersion != settled {
		t.Fatalf("the ConfigMap kept changing after it was reconciled: resourceVersion %s → %s", settled, cm.ResourceVersion)
	}
	// The reconcile that patched may not have been recorded yet, and its
	// patch causes one more event, hence one more reconcile that writes
	// nothing; a hot loop would be many more.
	if n := len(recordsOf(op.rec.Records(), ns, "no-annotations")); n > count+2 {
		t.Fatalf("reconciled %d more times after settling: a hot loop", n-count)
	}
}

func hasRecord(records []operator.Reconcile, name string) bool {
	for _, r := range records {
		if r.Name == name {
			return true
		}
	}
	return false
}

func recordsOf(records []operator.Reconcile, ns, name string) []operator.Reconcile {
	var out []operator.Reconcile
	for _, r := range records {
		if r.Namespace == ns && r.Name == name {
			out = append(out, r)
		}
	}
	return out
}

func latestEnd(records []operator.Reconcile) time.Time {
	var t time.Time
	for _, r := range records {
		if r.End.After(t) {
			t = r.End
		}
	}
	return t
}

func earliestStart(records []operator.Reconcile) time.Time {
	if len(records) == 0 {
		return time.Time{}
	}
	t := records[0].Start
	for _, r := range records[1:] {
		if r.Start.Before(t) {
			t = r.Start
		}
	}
	return t
}
