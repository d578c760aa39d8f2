package labeler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// Defaults of Options.
const (
	DefaultPeriod      = 10 * time.Minute
	DefaultPageSize    = 500
	DefaultQPS         = 20
	DefaultBurst       = 40
	DefaultConcurrency = 8
	DefaultRetryPeriod = 5 * time.Second
	// maxRetryPeriod bounds the doubling retries of failed sweeps: rights
	// that land after a while are used within a minute.
	maxRetryPeriod = time.Minute
	// maxErrors bounds the patch errors one sweep reports; the rest are
	// counted.
	maxErrors = 10
)

// Options configure a Labeler.
type Options struct {
	// Targets say what to label.
	Targets Targets
	// Client reads and patches the objects and lists namespaces. Its
	// rest.Config's own QPS and Burst limit it too.
	Client dynamic.Interface
	// Registerer receives the labeler's metrics. Nil registers nothing.
	Registerer prometheus.Registerer
	// Log receives the sweeps' summaries and errors; never one line per object.
	Log logr.Logger
	// Period between sweeps. Default DefaultPeriod.
	Period time.Duration
	// PageSize is the limit of each list request. Default DefaultPageSize.
	PageSize int64
	// QPS and Burst rate-limit the sweep's requests (lists and patches).
	// Defaults DefaultQPS and DefaultBurst.
	QPS   float64
	Burst int
	// Concurrency bounds the patches in flight. Default DefaultConcurrency.
	Concurrency int
	// RetryPeriod is the first wait before sweeping again after a sweep
	// that failed for some resource (it doubles up to Period). Default
	// DefaultRetryPeriod.
	RetryPeriod time.Duration
	// OnSweep, if set, receives every sweep's result, from Run's goroutine:
	// the agent reports it in the ShardRoutes' status.
	OnSweep func(SweepResult)
}

// Labeler sweeps the objects of its targets and labels those that need it.
type Labeler struct {
	targets     Targets
	client      dynamic.Interface
	log         logr.Logger
	period      time.Duration
	pageSize    int64
	limiter     *rate.Limiter
	concurrency int
	retryPeriod time.Duration
	onSweep     func(SweepResult)
	metrics     *metrics
}

// New checks opts, registers the metrics and returns a Labeler.
func New(opts Options) (*Labeler, error) {
	if err := opts.Targets.Validate(); err != nil {
		return nil, err
	}
	if opts.Client == nil {
		return nil, errors.New("labeler: no client")
	}
	l := &Labeler{
		targets:     opts.Targets,
		client:      opts.Client,
		log:         opts.Log,
		period:      opts.Period,
		pageSize:    opts.PageSize,
		concurrency: opts.Concurrency,
		retryPeriod: opts.RetryPeriod,
		onSweep:     opts.OnSweep,
	}
	if l.retryPeriod <= 0 {
		l.retryPeriod = DefaultRetryPeriod
	}
	if l.period <= 0 {
		l.period = DefaultPeriod
	}
	if l.pageSize <= 0 {
		l.pageSize = DefaultPageSize
	}
	if l.concurrency <= 0 {
		l.concurrency = DefaultConcurrency
	}
	qps, burst := opts.QPS, opts.Burst
	if qps <= 0 {
		qps = DefaultQPS
	}
	if burst <= 0 {
		burst = DefaultBurst
	}
	l.limiter = rate.NewLimiter(rate.Limit(qps), burst)
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	l.metrics = m
	return l, nil
}

// Run sweeps now and then every period until ctx ends. A sweep that failed
// for some resource (the agent may lack the rights on it, until the hub's
// labeler ClusterRole lands) is retried sooner: after RetryPeriod, doubling
// up to a minute (or the period, if shorter). Run returns nil when ctx ends.
//
// Run only in label mode: in range mode objects need no labels, and the
// caller does not run the Labeler at all.
func (l *Labeler) Run(ctx context.Context) error {
	ticker := time.NewTicker(l.period)
	defer ticker.Stop()
	retry := min(l.retryPeriod, l.period)
	for {
		start := time.Now()
		res, err := l.Sweep(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if l.onSweep != nil {
			l.onSweep(res)
		}
		// After a failure, the retry or the next period, whichever is first.
		retryTimer := time.NewTimer(retry)
		retryAfter := retryTimer.C
		if err != nil {
			l.log.Error(err, "Sweep failed; sweeping again soon", "unlabeled", res.Unlabeled, "patched", res.Patched, "duration", time.Since(start), "retryIn", retry)
			retry = min(2*retry, l.period, maxRetryPeriod)
		} else {
			l.log.V(1).Info("Sweep done", "scanned", res.Scanned, "unlabeled", res.Unlabeled, "patched", res.Patched, "duration", time.Since(start))
			retry = min(l.retryPeriod, l.period)
			retryAfter = nil
		}
		select {
		case <-ctx.Done():
			retryTimer.Stop()
			return nil
		case <-ticker.C:
		case <-retryAfter:
		}
		retryTimer.Stop()
	}
}

// SweepResult counts one sweep's objects, over all resources.
type SweepResult struct {
	// Scanned objects in controlled namespaces.
	Scanned int
	// Unlabeled objects found lacking a label or holding a wrong one.
	Unlabeled int
	// Patched objects: Unlabeled minus those gone or failed.
	Patched int
	// Swept are the resources the sweep went through, in order.
	Swept []schema.GroupVersionResource
	// Failed holds, per resource, why some of its objects may be left
	// unlabeled: its list or some patches failed, or the namespaces could
	// not be listed (then every resource fails).
	Failed map[schema.GroupVersionResource]error
}

// Sweep lists every object of the targets' resources, page by page, and
// merge-patches the labels of those in controlled namespaces that need it.
// It sets the unlabeled gauge of each resource it lists completely.
func (l *Labeler) Sweep(ctx context.Context) (SweepResult, error) {
	total := SweepResult{Swept: l.targets.Resources, Failed: map[schema.GroupVersionResource]error{}}
	controlled, err := l.controlledNamespaces(ctx)
	if err != nil {
		for _, gvr := range l.targets.Resources {
			total.Failed[gvr] = err
		}
		return total, err
	}
	var errs []error
	for _, gvr := range l.targets.Resources {
		if ctx.Err() != nil {
			total.Failed[gvr] = ctx.Err()
			continue
		}
		res, err := l.sweepResource(ctx, gvr, controlled)
		total.Scanned += res.Scanned
		total.Unlabeled += res.Unlabeled
		total.Patched += res.Patched
		if err != nil {
			total.Failed[gvr] = err
			errs = append(errs, err)
		}
	}
	return total, errors.Join(errs...)
}

// controlledNamespaces lists the namespaces the targets select.
func (l *Labeler) controlledNamespaces(ctx context.Context) (map[string]bool, error) {
	sel, err := l.targets.namespaceSelector()
	if err != nil {
		return nil, err
	}
	nsGVR := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	out := map[string]bool{}
	opts := metav1.ListOptions{LabelSelector: sel.String(), Limit: l.pageSize}
	for {
		if err := l.limiter.Wait(ctx); err != nil {
			return nil, fmt.Errorf("labeler: listing namespaces: %w", err)
		}
		list, err := l.client.Resource(nsGVR).List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("labeler: listing namespaces: %w", err)
		}
		for _, ns := range list.Items {
			if !isSystemNamespace(ns.GetName()) {
				out[ns.GetName()] = true
			}
		}
		if opts.Continue = list.GetContinue(); opts.Continue == "" {
			return out, nil
		}
	}
}

// target is an object to patch.
type target struct {
	namespace, name string
}

// sweepResource sweeps one resource: it lists page by page while a bounded
// pool of workers patches what the pages turned up.
func (l *Labeler) sweepResource(ctx context.Context, gvr schema.GroupVersionResource, controlled map[string]bool) (SweepResult, error) {
	var res SweepResult
	log := l.log.WithValues("resource", resourceName(gvr))
	resource := l.client.Resource(gvr)

	work := make(chan target)
	var (
		mu       sync.Mutex
		patchErr []error
		dropped  int
		patched  int
		wg       sync.WaitGroup
	)
	for range l.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range work {
				ok, err := l.patch(ctx, resource, t)
				mu.Lock()
				switch {
				case err == nil:
					if ok {
						patched++
					}
				case len(patchErr) < maxErrors:
					patchErr = append(patchErr, err)
				default:
					dropped++
				}
				mu.Unlock()
			}
		}()
	}

	listErr := func() error {
		defer close(work)
		opts := metav1.ListOptions{Limit: l.pageSize}
		for {
			if err := l.limiter.Wait(ctx); err != nil {
				return fmt.Errorf("labeler: listing %s: %w", resourceName(gvr), err)
			}
			list, err := resource.List(ctx, opts)
			if err != nil {
				return fmt.Errorf("labeler: listing %s: %w", resourceName(gvr), err)
			}
			for i := range list.Items {
				obj := &list.Items[i]
				ns := obj.GetNamespace()
				if !controlled[ns] {
					continue
				}
				res.Scanned++
				if !needsLabels(obj.GetLabels(), DesiredLabels(l.targets.Space, ns)) {
					continue
				}
				res.Unlabeled++
				select {
				case work <- target{namespace: ns, name: obj.GetName()}:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if opts.Continue = list.GetContinue(); opts.Continue == "" {
				return nil
			}
		}
	}()
	wg.Wait()
	res.Patched = patched
	l.metrics.labelsWritten.WithLabelValues(resourceName(gvr)).Add(float64(patched))
	if listErr == nil {
		l.metrics.unlabeled.WithLabelValues(resourceName(gvr)).Set(float64(res.Unlabeled))
	}
	if dropped > 0 {
		patchErr = append(patchErr, fmt.Errorf("labeler: %d more patch errors", dropped))
	}
	err := errors.Join(append([]error{listErr}, patchErr...)...)
	if res.Unlabeled > 0 || err != nil {
		log.Info("Labeled objects", "scanned", res.Scanned, "unlabeled", res.Unlabeled, "patched", patched, "notPatched", res.Unlabeled-patched)
	}
	return res, err
}

// patch merge-patches the desired labels onto one object and reports whether
// it did. An object deleted meanwhile is not an error.
func (l *Labeler) patch(ctx context.Context, resource dynamic.NamespaceableResourceInterface, t target) (bool, error) {
	body, err := mergePatch(DesiredLabels(l.targets.Space, t.namespace))
	if err != nil {
		return false, err
	}
	if err := l.limiter.Wait(ctx); err != nil {
		return false, fmt.Errorf("labeler: patching %s/%s: %w", t.namespace, t.name, err)
	}
	_, err = resource.Namespace(t.namespace).Patch(ctx, t.name, types.MergePatchType, body, metav1.PatchOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("labeler: patching %s/%s: %w", t.namespace, t.name, err)
	}
	return true, nil
}

// mergePatch is a JSON merge patch that sets labels and nothing else.
func mergePatch(labels map[string]string) ([]byte, error) {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return nil, fmt.Errorf("labeler: encoding the patch: %w", err)
	}
	return body, nil
}

// resourceName names a resource in metrics, logs and errors: "v1/configmaps",
// "apps/v1/deployments".
func resourceName(gvr schema.GroupVersionResource) string {
	return gvr.GroupVersion().String() + "/" + gvr.Resource
}
