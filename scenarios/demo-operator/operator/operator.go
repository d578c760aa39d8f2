// Package operator is the demo operator that ctrlmesh's tests and demo shard:
// an ordinary controller-runtime operator that knows nothing of ctrlmesh.
//
// It reconciles ConfigMaps labeled demo.ctrlmesh.io/managed=true in every
// namespace, stamping each with the pod that reconciled it and a hash of its
// data; it elects a leader with a Lease whose holder identity is the pod
// name; and it serves a mutating and a validating admission webhook for
// managed ConfigMaps. Each reconcile is recorded (start, end, pod) so that a
// test can prove no two pods ever reconciled one object at the same time.
package operator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	// ManagedLabel marks the ConfigMaps the operator reconciles, with value
	// ManagedValue.
	ManagedLabel = "demo.ctrlmesh.io/managed"
	// ManagedValue is the value of ManagedLabel on managed ConfigMaps.
	ManagedValue = "true"
	// ReconciledByAnnotation holds the name of the pod that last reconciled
	// the ConfigMap.
	ReconciledByAnnotation = "demo.ctrlmesh.io/reconciled-by"
	// DataHashAnnotation holds DataHash of the ConfigMap as last reconciled.
	DataHashAnnotation = "demo.ctrlmesh.io/data-hash"
	// AdmittedByAnnotation is set by the mutating webhook to the name of the
	// pod that admitted the ConfigMap.
	AdmittedByAnnotation = "demo.ctrlmesh.io/admitted-by"
	// ForbiddenKey is the data key the validating webhook refuses.
	ForbiddenKey = "forbidden"

	// MutatePath and ValidatePath are the webhook server's paths.
	MutatePath   = "/mutate-configmaps"
	ValidatePath = "/validate-configmaps"

	// ControllerName names the ConfigMap controller (logs, metrics).
	ControllerName = "demo-configmaps"

	// DefaultLeaderElectionID is the default name of the Lease lock.
	DefaultLeaderElectionID = "demo-operator"
	// DefaultLeaseDuration, DefaultRenewDeadline and DefaultRetryPeriod are
	// the leader-election timings when Options leaves them zero (the same as
	// controller-runtime's).
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Options configure one operator process ("pod").
type Options struct {
	// Config reaches kube-apiserver, or a ctrlmesh proxy in front of it.
	// Required. Run does not modify it.
	Config *rest.Config
	// PodName identifies this instance: it is the leader-election holder
	// identity and the value of the annotations the operator writes.
	// Required.
	PodName string
	// LeaderElectionID is the name of the Lease lock. Default
	// DefaultLeaderElectionID.
	LeaderElectionID string
	// LeaderElectionNamespace is the namespace of the Lease lock. Required.
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election;
	// zero means the Default… constant. They must satisfy LeaseDuration >
	// RenewDeadline > 1.2 × RetryPeriod (client-go's rule).
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// WebhookPort is the port of the admission webhook server (TLS, all
	// interfaces). 0 runs no webhook server.
	WebhookPort int
	// WebhookCertDir holds tls.crt and tls.key for the webhook server.
	// Empty means controller-runtime's default,
	// $TMPDIR/k8s-webhook-server/serving-certs.
	WebhookCertDir string
	// HealthAddr is the address of the /healthz and /readyz endpoints.
	// Empty or "0" serves none.
	HealthAddr string
	// MetricsAddr is the address of the Prometheus /metrics endpoint.
	// Empty or "0" serves none.
	MetricsAddr string
	// Recorder receives a record of every reconcile. Nil records nothing.
	Recorder Recorder
	// ReconcileDelay is slept at the end of each reconcile (and cut short on
	// shutdown), to widen the window in which two pods could overlap.
	ReconcileDelay time.Duration
	// Logger for the manager and everything it runs. The zero Logger means
	// controller-runtime's global logger (sigs.k8s.io/controller-runtime/pkg/log).
	Logger logr.Logger
}

func (o Options) withDefaults() Options {
	if o.LeaderElectionID == "" {
		o.LeaderElectionID = DefaultLeaderElectionID
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = DefaultRenewDeadline
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if o.HealthAddr == "" {
		o.HealthAddr = "0"
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = "0"
	}
	if o.Recorder == nil {
		o.Recorder = nopRecorder{}
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	if o.Config == nil {
		errs = append(errs, errors.New("no rest config"))
	}
	if o.PodName == "" {
		errs = append(errs, errors.New("no pod name"))
	}
	if o.LeaderElectionNamespace == "" {
		errs = append(errs, errors.New("no leader election namespace"))
	}
	if o.LeaseDuration <= o.RenewDeadline {
		errs = append(errs, fmt.Errorf("lease duration %s must be longer than renew deadline %s", o.LeaseDuration, o.RenewDeadline))
	}
	// client-go's leaderelection.JitterFactor.
	if float64(o.RenewDeadline) <= 1.2*float64(o.RetryPeriod) {
		errs = append(errs, fmt.Errorf("renew deadline %s must be longer than 1.2 × retry period %s", o.RenewDeadline, o.RetryPeriod))
	}
	if o.RetryPeriod < 0 {
		errs = append(errs, fmt.Errorf("retry period %s is negative", o.RetryPeriod))
	}
	if o.WebhookPort < 0 || o.WebhookPort > 65535 {
		errs = append(errs, fmt.Errorf("webhook port %d is out of range 0-65535", o.WebhookPort))
	}
	if o.ReconcileDelay < 0 {
		errs = append(errs, fmt.Errorf("reconcile delay %s is negative", o.ReconcileDelay))
	}
	return errors.Join(errs...)
}

// ManagedSelector selects the ConfigMaps the operator manages.
func ManagedSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{ManagedLabel: ManagedValue})
}

// Run runs the operator until ctx is done, then releases the Lease if it
// holds it and returns nil. It returns an error if the operator cannot start
// or fails, including when it loses the Lease it held (the process is then
// expected to exit, as any controller-runtime operator does).
func Run(ctx context.Context, opts Options) error {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return fmt.Errorf("demo operator: invalid options: %w", err)
	}
	cfg := rest.CopyConfig(opts.Config)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "demo-operator/" + opts.PodName
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("demo operator %s: building the scheme: %w", opts.PodName, err)
	}
	lock, err := newLeaseLock(cfg, opts)
	if err != nil {
		return fmt.Errorf("demo operator %s: %w", opts.PodName, err)
	}

	mgrOpts := manager.Options{
		Scheme: scheme,
		Logger: opts.Logger,
		Cache: cache.Options{
			// The operator sends its own selector on list and watch; a
			// ctrlmesh proxy ANDs the shard's selector into the same request.
			ByObject: map[client.Object]cache.ByObject{
				&corev1.ConfigMap{}: {Label: ManagedSelector()},
			},
		},
		LeaderElection:                      true,
		LeaderElectionID:                    opts.LeaderElectionID,
		LeaderElectionNamespace:             opts.LeaderElectionNamespace,
		LeaderElectionResourceLockInterface: lock,
		LeaderElectionReleaseOnCancel:       true,
		LeaseDuration:                       ptr.To(opts.LeaseDuration),
		RenewDeadline:                       ptr.To(opts.RenewDeadline),
		RetryPeriod:                         ptr.To(opts.RetryPeriod),
		HealthProbeBindAddress:              opts.HealthAddr,
		Metrics:                             metricsserver.Options{BindAddress: opts.MetricsAddr},
		// Controller names must be unique per process, and tests run several
		// operators in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
	if opts.WebhookPort != 0 {
		mgrOpts.WebhookServer = webhook.NewServer(webhook.Options{Port: opts.WebhookPort, CertDir: opts.WebhookCertDir})
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return fmt.Errorf("demo operator %s: creating the manager: %w", opts.PodName, err)
	}

	r := &reconciler{client: mgr.GetClient(), pod: opts.PodName, delay: opts.ReconcileDelay, recorder: opts.Recorder}
	if err := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&corev1.ConfigMap{}).
		Complete(r); err != nil {
		return fmt.Errorf("demo operator %s: creating the controller: %w", opts.PodName, err)
	}

	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("demo operator %s: adding the health check: %w", opts.PodName, err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("demo operator %s: adding the readiness check: %w", opts.PodName, err)
	}
	if opts.WebhookPort != 0 {
		decoder := admission.NewDecoder(scheme)
		srv := mgr.GetWebhookServer()
		srv.Register(MutatePath, &webhook.Admission{Handler: &mutator{pod: opts.PodName, decoder: decoder}})
		srv.Register(ValidatePath, &webhook.Admission{Handler: &validator{pod: opts.PodName, decoder: decoder}})
		if err := mgr.AddReadyzCheck("webhook", srv.StartedChecker()); err != nil {
			return fmt.Errorf("demo operator %s: adding the webhook readiness check: %w", opts.PodName, err)
		}
	}

	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("demo operator %s: %w", opts.PodName, err)
	}
	return nil
}

// newLeaseLock builds the Lease lock with the pod name as holder identity.
// controller-runtime's own lock would use "<hostname>_<uuid>".
func newLeaseLock(cfg *rest.Config, opts Options) (resourcelock.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent += "/leader-election"
	// As controller-runtime does: a hung request must not outlive the renew
	// deadline, or one slow response would cost the lease.
	cfg.Timeout = max(time.Second, opts.RenewDeadline/2)
	coordination, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the Lease client: %w", err)
	}
	return &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: opts.LeaderElectionNamespace, Name: opts.LeaderElectionID},
		Client:     coordination,
		LockConfig: resourcelock.ResourceLockConfig{Identity: opts.PodName},
	}, nil
}
