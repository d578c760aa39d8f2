package webhookutil

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	admissionregistrationv1client "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// ConfigurationKeeper keeps one MutatingWebhookConfiguration as its owner
// wants it: written when wanted, deleted when not, and put back when
// someone else changes or deletes it — a caBundle edited by hand during a
// CA rotation, a kubectl delete. A webhook whose configuration is gone or
// wrong stops admitting what it should (injection, labels) without a sign,
// so the keeper watches the one configuration and restores it at once.
//
// It watches by a field selector on the configuration's name, which RBAC
// authorizes with resourceNames: the owner needs no rights on other
// configurations. It runs on the elected replica only.
type ConfigurationKeeper struct {
	name string
	// configurations reads and writes the API server directly: a cache
	// could still show a configuration the watch already saw deleted.
	configurations admissionregistrationv1client.MutatingWebhookConfigurationInterface
	log            logr.Logger

	mu   sync.Mutex
	want *admissionregistrationv1.MutatingWebhookConfiguration
	set  bool // Set was called: before that the keeper neither writes nor deletes
	kick chan struct{}
}

// NewConfigurationKeeper returns the keeper of the configuration name.
func NewConfigurationKeeper(name string, clientset kubernetes.Interface, log logr.Logger) *ConfigurationKeeper {
	return &ConfigurationKeeper{
		name: name, configurations: clientset.AdmissionregistrationV1().MutatingWebhookConfigurations(),
		log: log.WithValues("mutatingWebhookConfiguration", name), kick: make(chan struct{}, 1),
	}
}

// Set says what the configuration should be; nil deletes it. want's name
// must be the keeper's.
func (k *ConfigurationKeeper) Set(want *admissionregistrationv1.MutatingWebhookConfiguration) {
	k.mu.Lock()
	k.want, k.set = want.DeepCopy(), true
	k.mu.Unlock()
	k.signal()
}

func (k *ConfigurationKeeper) signal() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// NeedLeaderElection is true: one replica writes the configuration.
func (k *ConfigurationKeeper) NeedLeaderElection() bool { return true }

// Start keeps the configuration until ctx ends, retrying failed writes with
// backoff.
func (k *ConfigurationKeeper) Start(ctx context.Context) error {
	byName := fields.OneTermEqualSelector("metadata.name", k.name).String()
	informer := toolscache.NewSharedIndexInformer(&toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return k.configurations.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return k.configurations.Watch(ctx, o)
		},
	}, &admissionregistrationv1.MutatingWebhookConfiguration{}, 0, toolscache.Indexers{})
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.signal() },
		UpdateFunc: func(any, any) { k.signal() },
		DeleteFunc: func(any) { k.signal() },
	}); err != nil {
		return fmt.Errorf("watching MutatingWebhookConfiguration %s: %w", k.name, err)
	}
	// Start returns only after the informer has stopped, so that nothing of
	// it (its reflector's logging, say) outlives the keeper.
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		informer.Run(ctx.Done())
	}()
	defer func() { <-stopped }()

	backoff := time.Second
	retry := time.NewTimer(0)
	<-retry.C
	for {
		select {
		case <-ctx.Done():
			retry.Stop()
			return nil
		case <-k.kick:
		case <-retry.C:
		}
		if err := k.sync(ctx); err != nil {
			k.log.Error(err, "Keeping the webhook configuration failed; retrying", "in", backoff)
			retry.Reset(backoff)
			backoff = min(2*backoff, time.Minute)
			continue
		}
		backoff = time.Second
	}
}

// sync makes the configuration what Set last asked for.
func (k *ConfigurationKeeper) sync(ctx context.Context) error {
	k.mu.Lock()
	want, set := k.want.DeepCopy(), k.set
	k.mu.Unlock()
	if !set {
		return nil
	}
	existing, err := k.configurations.Get(ctx, k.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if want == nil {
			return nil
		}
		if _, err := k.configurations.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating MutatingWebhookConfiguration %s: %w", k.name, err)
		}
		k.log.Info("Wrote the webhook configuration")
		return nil
	case err != nil:
		return fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", k.name, err)
	case want == nil:
		if err := k.configurations.Delete(ctx, k.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &existing.UID}}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting MutatingWebhookConfiguration %s: %w", k.name, err)
		}
		k.log.Info("Deleted the webhook configuration")
		return nil
	case equality.Semantic.DeepEqual(existing.Webhooks, want.Webhooks):
		return nil
	}
	existing.Webhooks = want.Webhooks
	if _, err := k.configurations.Update(ctx, existing, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating MutatingWebhookConfiguration %s: %w", k.name, err)
	}
	k.log.Info("Restored the webhook configuration")
	return nil
}
