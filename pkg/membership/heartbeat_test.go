package membership_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
)

func createNamespace(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if err := hub.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// leaseRenewTime reads the heartbeat Lease; zero time when it is missing.
func leaseRenewTime(t *testing.T, ctx context.Context, ns string) (*coordinationv1.Lease, time.Time) {
	t.Helper()
	var lease coordinationv1.Lease
	err := hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: ctrlmeshv1alpha1.HeartbeatLeaseName}, &lease)
	if apierrors.IsNotFound(err) {
		return nil, time.Time{}
	}
	if err != nil {
		t.Fatal(err)
	}
	if lease.Spec.RenewTime == nil {
		t.Fatalf("lease %s/%s has no renewTime", ns, lease.Name)
	}
	return &lease, lease.Spec.RenewTime.Time
}

func TestHeartbeatRenewsUntilStopped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const interval = 200 * time.Millisecond
	cluster := unique("heartbeat")
	hb := &membership.Heartbeat{
		Hub: hub.Client, ClusterName: cluster, Identity: "agent-pod-0",
		LeaseDuration: 2 * time.Second, RenewInterval: interval, Log: testr.New(t),
	}
	ns := hb.Namespace()
	if ns != cluster {
		t.Fatalf("namespace %q", ns)
	}
	createNamespace(t, ctx, ns)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- hb.Run(runCtx) }()

	// The Lease appears and its renewTime advances, renewal after renewal.
	var renewals []time.Time
	deadline := time.Now().Add(20 * time.Second)
	for len(renewals) < 4 && time.Now().Before(deadline) {
		if lease, rt := leaseRenewTime(t, ctx, ns); lease != nil && (len(renewals) == 0 || rt.After(renewals[len(renewals)-1])) {
			if got := *lease.Spec.HolderIdentity; got != "agent-pod-0" {
				t.Errorf("holderIdentity %q", got)
			}
			if got := *lease.Spec.LeaseDurationSeconds; got != 2 {
				t.Errorf("leaseDurationSeconds %d, want 2", got)
			}
			// Marked as the ctrlmesh agent's renewal, for the hub.
			if got, want := lease.Annotations[ctrlmeshv1alpha1.HeartbeatRenewalAnnotation], lease.Spec.RenewTime.UTC().Format(metav1.RFC3339Micro); got != want {
				t.Errorf("renewal mark %q, want the renewTime %q", got, want)
			}
			// Labeled as OCM's hub labels the Lease it creates.
			if got := lease.Labels[clusterv1.ClusterNameLabelKey]; got != cluster {
				t.Errorf("lease label %s=%q, want %q", clusterv1.ClusterNameLabelKey, got, cluster)
			}
			renewals = append(renewals, rt)
		}
		time.Sleep(interval / 4)
	}
	if len(renewals) < 4 {
		t.Fatalf("renewTime advanced %d times in 20 s, want 4: %v", len(renewals)-1, renewals)
	}
	// Each renewTime is taken after a read of the Lease, which a loaded
	// machine may slow for one renewal and not the next: single gaps may be
	// short, but renewals must come about every interval on average and
	// never stall.
	for i := 1; i < len(renewals); i++ {
		if gap := renewals[i].Sub(renewals[i-1]); gap > 10*interval {
			t.Errorf("renewal %d came %s after the previous, interval %s", i, gap, interval)
		}
	}
	if mean := renewals[len(renewals)-1].Sub(renewals[0]) / time.Duration(len(renewals)-1); mean < interval/2 {
		t.Errorf("renewals came every %s on average, interval %s", mean, interval)
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v after cancel, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	_, last := leaseRenewTime(t, ctx, ns)
	time.Sleep(4 * interval)
	if _, rt := leaseRenewTime(t, ctx, ns); !rt.Equal(last) {
		t.Errorf("renewTime advanced from %s to %s after the heartbeat stopped", last, rt)
	}
}

// A new agent takes the Lease over from the one before.
func TestHeartbeatTakesOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster := unique("heartbeat-takeover")
	old := &membership.Heartbeat{Hub: hub.Client, ClusterName: cluster, Identity: "agent-old"}
	createNamespace(t, ctx, old.Namespace())
	if err := old.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	lease, _ := leaseRenewTime(t, ctx, old.Namespace())
	if *lease.Spec.LeaseDurationSeconds != int32(membership.DefaultLeaseDuration/time.Second) {
		t.Errorf("default leaseDurationSeconds %d", *lease.Spec.LeaseDurationSeconds)
	}
	if err := (&membership.Heartbeat{Hub: hub.Client, ClusterName: cluster, Identity: "agent-new"}).Renew(ctx); err != nil {
		t.Fatal(err)
	}
	lease, _ = leaseRenewTime(t, ctx, old.Namespace())
	if *lease.Spec.HolderIdentity != "agent-new" || lease.Spec.LeaseTransitions == nil || *lease.Spec.LeaseTransitions != 1 {
		t.Errorf("after the take-over: holder %q, transitions %v", *lease.Spec.HolderIdentity, lease.Spec.LeaseTransitions)
	}
	if !lease.Spec.AcquireTime.Equal(lease.Spec.RenewTime) {
		t.Errorf("acquireTime %s, renewTime %s: want equal at a take-over", lease.Spec.AcquireTime, lease.Spec.RenewTime)
	}
}

// Run survives a missing namespace: it logs, retries, and renews once the hub
// creates the namespace.
func TestHeartbeatRecovers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hb := &membership.Heartbeat{Hub: hub.Client, ClusterName: unique("heartbeat-late-ns"), Identity: "agent",
		LeaseDuration: time.Second, RenewInterval: 100 * time.Millisecond, Log: testr.New(t)}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- hb.Run(runCtx) }()
	time.Sleep(300 * time.Millisecond)
	if lease, _ := leaseRenewTime(t, ctx, hb.Namespace()); lease != nil {
		t.Fatal("lease exists before its namespace")
	}
	createNamespace(t, ctx, hb.Namespace())
	deadline := time.Now().Add(10 * time.Second)
	for {
		if lease, _ := leaseRenewTime(t, ctx, hb.Namespace()); lease != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no lease 10 s after the namespace appeared")
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestHeartbeatRejectsBadSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		hb   membership.Heartbeat
		want string
	}{
		{"no cluster", membership.Heartbeat{Hub: hub.Client, Identity: "a"}, "no cluster name"},
		{"no hub", membership.Heartbeat{ClusterName: "c", Identity: "a"}, "without a hub client"},
		{"no identity", membership.Heartbeat{Hub: hub.Client, ClusterName: "c"}, "without a holder identity"},
		{"interval equal to duration", membership.Heartbeat{Hub: hub.Client, ClusterName: "c", Identity: "a",
			LeaseDuration: 10 * time.Second, RenewInterval: 10 * time.Second}, "not shorter than the lease duration"},
		{"interval beyond the default duration", membership.Heartbeat{Hub: hub.Client, ClusterName: "c", Identity: "a",
			RenewInterval: time.Minute}, "not shorter than the lease duration 40s"},
		{"negative", membership.Heartbeat{Hub: hub.Client, ClusterName: "c", Identity: "a", LeaseDuration: -time.Second}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.hb.Run(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: err = %v, want one containing %q", err, tc.want)
			}
			if err := tc.hb.Renew(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Renew: err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
