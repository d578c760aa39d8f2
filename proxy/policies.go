package proxy

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/apistatus"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/request"
	"github.com/ctrlmesh/ctrlmesh/proxy/policy"
)

// setPoliciesLocked puts the traffic policies of snap in force, carrying
// over the state of the rules that did not change. The caller holds mu.
func (p *Proxy) setPoliciesLocked(set *policy.Set) {
	old := p.policies.Load()
	if old != nil && old.Set() == set {
		return
	}
	p.policies.Store(policy.NewEngine(set, old))
	if old != nil {
		old.Stop()
	}
}

// Breakers returns the proxy's breakers that are not closed, and a channel
// that closes when that may have changed (a breaker's state, or the rules).
func (p *Proxy) Breakers() ([]ctrlmeshv1alpha1.PodBreakerStatus, <-chan struct{}) {
	e := p.policies.Load()
	if e == nil {
		never := make(chan struct{})
		return nil, never
	}
	return e.Breakers()
}

// checkPolicies decides an API request by the traffic policies. It answers
// the requests they refuse or abort, and waits out injected delays; it
// returns the writer to serve the others with, and a function to call
// once they are served (nil when no breaker watches the request), or
// false when the request was answered.
func (p *Proxy) checkPolicies(w http.ResponseWriter, r *http.Request, info *request.RequestInfo) (http.ResponseWriter, func(), bool) {
	e := p.policies.Load()
	if e == nil {
		return w, nil, true
	}
	req := policy.Request{Group: info.APIGroup, Resource: info.Resource, Verb: info.Verb, Namespace: info.Namespace, Name: info.Name}
	d := e.Check(&req)
	if !p.enforce(w, r, &d, p.refuseAPI) {
		if d.Watched() {
			// An injected abort stands for the upstream's failure; a client
			// gone during an injected delay is no success either (a
			// half-open probe must not close the breaker by it).
			status := 0
			if d.Verdict == policy.Aborted && r.Context().Err() == nil {
				status = d.Status
			}
			e.Done(&d, status, d.Delay, info.Verb == "watch")
		}
		return w, nil, false
	}
	if !d.Watched() {
		return w, nil, true
	}
	watch := info.Verb == "watch"
	rec := &outcomeRecorder{ResponseWriter: w, start: time.Now()}
	if watch {
		// A watch's outcome is its answer's status: it is meant to stay
		// open, and a half-open probe must not hold its slot for minutes.
		rec.onHeader = func(status int) { e.Done(&d, status, 0, true) }
	}
	return rec, func() {
		if !watch || rec.status == 0 {
			e.Done(&d, rec.status, time.Since(rec.start), watch)
		}
	}, true
}

// enforce answers d's refusals and aborts with refuse, and waits out its
// delay; it reports whether the request goes on. Every decision a rule
// made is counted, every injected fault too.
func (p *Proxy) enforce(w http.ResponseWriter, r *http.Request, d *policy.Decision, refuse func(http.ResponseWriter, *policy.Decision)) bool {
	if d.Kind == "" {
		return true
	}
	p.metrics.policyDecisions.With(d.Kind, d.Policy, d.Rule, d.Verdict.String()).Inc()
	if d.Kind == policy.KindFault {
		if d.Delay > 0 {
			p.metrics.faultsInjected.With(d.Policy, d.Rule, "delay").Inc()
			timer := time.NewTimer(d.Delay)
			select {
			case <-timer.C:
			case <-r.Context().Done():
				timer.Stop()
				return false
			}
		}
		if d.Verdict == policy.Aborted {
			p.metrics.faultsInjected.With(d.Policy, d.Rule, "abort").Inc()
		}
	}
	switch d.Verdict {
	case policy.Pass:
		return true
	case policy.RateLimited, policy.BreakerOpen:
		// client-go waits Retry-After (whole seconds) before retrying a 429
		// or 503.
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(d.RetryAfter.Seconds())))))
	}
	refuse(w, d)
	return false
}

// refuseAPI answers an API request a policy refused or aborted with a
// Status, which client-go decodes.
func (p *Proxy) refuseAPI(w http.ResponseWriter, d *policy.Decision) {
	p.count(d.Verb(), outcomePolicy)
	apistatus.Write(w, int32(d.Status), statusReason(d), "ctrlmesh proxy: "+d.Message, nil)
}

// statusReason is the Status reason a refusal is answered with.
func statusReason(d *policy.Decision) metav1.StatusReason {
	switch d.Status {
	case http.StatusForbidden:
		return metav1.StatusReasonForbidden
	case http.StatusTooManyRequests:
		return metav1.StatusReasonTooManyRequests
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return metav1.StatusReasonServiceUnavailable
	case http.StatusGatewayTimeout:
		return metav1.StatusReasonTimeout
	case http.StatusNotFound:
		return metav1.StatusReasonNotFound
	case http.StatusConflict:
		return metav1.StatusReasonConflict
	case http.StatusBadRequest:
		return metav1.StatusReasonBadRequest
	}
	if d.Status >= 500 {
		return metav1.StatusReasonInternalError
	}
	return metav1.StatusReason(fmt.Sprintf("Status%d", d.Status))
}

// outcomeRecorder remembers the status of a response for the breakers.
type outcomeRecorder struct {
	http.ResponseWriter
	start    time.Time
	status   int
	onHeader func(int)
	// err is the forward proxy's error reaching the host, if any.
	err error
}

func (o *outcomeRecorder) WriteHeader(code int) {
	if o.status == 0 && code >= 200 {
		o.status = code
		if o.onHeader != nil {
			o.onHeader(code)
		}
	}
	o.ResponseWriter.WriteHeader(code)
}

func (o *outcomeRecorder) Write(b []byte) (int, error) {
	if o.status == 0 {
		o.WriteHeader(http.StatusOK)
	}
	return o.ResponseWriter.Write(b)
}

func (o *outcomeRecorder) Flush() {
	if f, ok := o.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (o *outcomeRecorder) Unwrap() http.ResponseWriter { return o.ResponseWriter }
