package membership

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// Defaults of Heartbeat.
const (
	// DefaultLeaseDuration is the Lease's leaseDurationSeconds: the hub may
	// consider a member gone whose renewTime is older than that.
	DefaultLeaseDuration = 40 * time.Second
	// DefaultRenewInterval is the time between two renewals; four renewals
	// fit into one DefaultLeaseDuration, so three may fail in a row.
	DefaultRenewInterval = 10 * time.Second
)

// Heartbeat renews the member's Lease ctrlmeshv1alpha1.HeartbeatLeaseName
// ("managed-cluster-lease") in its cluster namespace on the hub, as OCM's
// registration agent does; it also writes leaseDurationSeconds and marks
// each renewal as its own (ctrlmeshv1alpha1.HeartbeatRenewalAnnotation),
// which the ctrlmesh hub requires of a heartbeat (OCM's hub takes the
// duration from the ManagedCluster's spec and counts any renewTime). The
// Lease tells the hub the agent is alive; it is not a leader election: the
// agent runs once per member and takes the Lease over from any other
// holder.
type Heartbeat struct {
	// Hub is a client of the hub cluster. Required.
	Hub client.Client
	// ClusterName is the member's name on the hub. Required.
	ClusterName string
	// Identity is the agent's holderIdentity, such as its pod name. Required.
	Identity string
	// LeaseDuration is written as leaseDurationSeconds, rounded up to whole
	// seconds. Default: DefaultLeaseDuration.
	LeaseDuration time.Duration
	// RenewInterval is the time between renewals; it must be shorter than
	// LeaseDuration. Default: DefaultRenewInterval, or a quarter of
	// LeaseDuration when that is shorter.
	RenewInterval time.Duration
	// Witness, when set, is called before each renewal; the function it
	// returns is called after that renewal succeeded. What it read before
	// is then known to precede a renewal the hub observes (the agent grants
	// the proxies' rule renewals so).
	Witness func(ctx context.Context) (renewed func(ctx context.Context))
	// Clock gives the renewTime written: the agent's clock, which may be
	// off the hub's (the hub judges freshness by when it saw a renewal, not
	// by renewTime). Default: the real clock.
	Clock clock.PassiveClock
	// Log receives the start, each new failure (a failure repeating the
	// previous one only at V(1)) and the first renewal after failures.
	// Renewals that succeed as expected log nothing above V(1).
	Log logr.Logger
}

// Namespace is the member's cluster namespace on the hub, where its Lease
// lives.
func (h *Heartbeat) Namespace() string {
	return ctrlmeshv1alpha1.ClusterNamespace(h.ClusterName)
}

func (h *Heartbeat) settings() (leaseDuration, interval time.Duration, err error) {
	if err := validateClusterName(h.ClusterName); err != nil {
		return 0, 0, err
	}
	if h.Hub == nil {
		return 0, 0, errors.New("join: heartbeat without a hub client")
	}
	if h.Identity == "" {
		return 0, 0, errors.New("join: heartbeat without a holder identity")
	}
	if h.RenewInterval < 0 {
		return 0, 0, fmt.Errorf("join: negative renew interval %s", h.RenewInterval)
	}
	// Whole seconds, as leaseDurationSeconds has them.
	seconds, err := leaseDurationSeconds(h.LeaseDuration)
	if err != nil {
		return 0, 0, err
	}
	leaseDuration, interval = time.Duration(seconds)*time.Second, h.RenewInterval
	if interval == 0 {
		interval = min(DefaultRenewInterval, leaseDuration/4)
	}
	if interval >= leaseDuration {
		return 0, 0, fmt.Errorf("join: renew interval %s is not shorter than the lease duration %s", interval, leaseDuration)
	}
	return leaseDuration, interval, nil
}

func (h *Heartbeat) now() time.Time {
	if h.Clock == nil {
		return time.Now()
	}
	return h.Clock.Now()
}

// Run renews the Lease at once and then every RenewInterval until ctx ends,
// when it returns nil. A failed renewal is logged and retried at the next
// tick; Run returns an error only for invalid settings.
func (h *Heartbeat) Run(ctx context.Context) error {
	_, interval, err := h.settings()
	if err != nil {
		return err
	}
	log := h.Log.WithValues("cluster", h.ClusterName, "lease", h.Namespace()+"/"+ctrlmeshv1alpha1.HeartbeatLeaseName)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	failing, started := false, false
	lastErr := ""
	for {
		renewed := func(context.Context) {}
		if h.Witness != nil {
			renewed = h.Witness(ctx)
		}
		if err := h.Renew(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// The same failure again, tick after tick, is logged once.
			if err.Error() != lastErr {
				log.Error(err, "renewing the heartbeat lease failed; retrying", "interval", interval)
			} else {
				log.V(1).Info("renewing the heartbeat lease failed again", "error", err.Error())
			}
			failing, lastErr = true, err.Error()
		} else {
			renewed(ctx)
			lastErr = ""
			switch {
			case !started:
				log.Info("heartbeat started", "interval", interval)
			case failing:
				log.Info("heartbeat renewed again after failures")
			default:
				log.V(1).Info("heartbeat renewed")
			}
			started, failing = true, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// renewalMark is the HeartbeatRenewalAnnotation of a renewal at t: the
// renewTime, as the Lease stores it.
func renewalMark(t metav1.MicroTime) string { return t.UTC().Format(metav1.RFC3339Micro) }

// Renew renews the Lease once, creating it when missing, and marks the
// renewal as the ctrlmesh agent's (HeartbeatRenewalAnnotation).
func (h *Heartbeat) Renew(ctx context.Context) error {
	leaseDuration, _, err := h.settings()
	if err != nil {
		return err
	}
	seconds := int32(leaseDuration / time.Second)
	key := client.ObjectKey{Namespace: h.Namespace(), Name: ctrlmeshv1alpha1.HeartbeatLeaseName}

	var lease coordinationv1.Lease
	err = h.Hub.Get(ctx, key, &lease)
	if apierrors.IsNotFound(err) {
		t := metav1.NewMicroTime(h.now())
		lease = coordinationv1.Lease{
			// Labeled as OCM's hub labels the Lease it creates.
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{clusterv1.ClusterNameLabelKey: h.ClusterName},
				Annotations: map[string]string{ctrlmeshv1alpha1.HeartbeatRenewalAnnotation: renewalMark(t)}},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(h.Identity),
				LeaseDurationSeconds: ptr.To(seconds),
				AcquireTime:          &t,
				RenewTime:            &t,
			},
		}
		if err := h.Hub.Create(ctx, &lease); err != nil {
			return fmt.Errorf("join: creating the heartbeat lease %s: %w", key, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("join: reading the heartbeat lease %s: %w", key, err)
	}
	t := metav1.NewMicroTime(h.now())
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != h.Identity {
		lease.Spec.HolderIdentity = ptr.To(h.Identity)
		lease.Spec.AcquireTime = &t
		lease.Spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
	}
	lease.Spec.LeaseDurationSeconds = ptr.To(seconds)
	lease.Spec.RenewTime = &t
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[ctrlmeshv1alpha1.HeartbeatRenewalAnnotation] = renewalMark(t)
	// An update, not a patch: a conflict means someone else wrote the Lease
	// meanwhile, and the next tick reads it again.
	if err := h.Hub.Update(ctx, &lease); err != nil {
		return fmt.Errorf("join: renewing the heartbeat lease %s: %w", key, err)
	}
	return nil
}
