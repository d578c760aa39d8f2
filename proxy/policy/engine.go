package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"reflect"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// Verdict is what the engine decided for a request.
type Verdict int

const (
	// Pass: forward the request (after Delay, if any).
	Pass Verdict = iota
	// RateLimited: answer 429 with Retry-After.
	RateLimited
	// BreakerOpen: fail fast with 503 and Retry-After.
	BreakerOpen
	// Denied: answer 403 with the rule's reason.
	Denied
	// Aborted: an injected fault; answer Status (after Delay, if any).
	Aborted
)

func (v Verdict) String() string {
	return [...]string{"pass", "rate-limited", "breaker-open", "denied", "aborted"}[v]
}

// Decision is the engine's answer for one request. A forwarded request's
// outcome must be told to Done, which the breakers count.
type Decision struct {
	Verdict Verdict
	// Status to answer with, for every verdict but Pass.
	Status int
	// Message tells the operator why, for every verdict but Pass.
	Message string
	// RetryAfter is when to try again (RateLimited, BreakerOpen).
	RetryAfter time.Duration
	// Delay to wait before forwarding or answering (an injected delay).
	Delay time.Duration
	// Kind, Policy and Rule name the rule that decided; for Pass with a
	// Delay, the fault.
	Kind, Policy, Rule string

	// watching are the breakers that count the request's outcome, probes
	// those of them the request is a half-open probe of.
	watching []*breakerState
	probes   []*breakerState
	verb     string
}

// Watched reports whether breakers wait for the request's outcome (Done).
func (d *Decision) Watched() bool { return len(d.watching) > 0 }

// Verb is the request's verb (API requests) or method (external ones), for
// counting.
func (d *Decision) Verb() string { return d.verb }

// Clock and randomness, replaceable in tests.
type sources struct {
	now   func() time.Time
	float func() float64
}

// Engine enforces a Set. It is safe for concurrent use.
type Engine struct {
	set *Set
	src sources

	mu       sync.Mutex
	buckets  map[key]*bucket
	breakers map[key]*breakerState
	logs     map[key]*countLog
	// changed closes at every change of a breaker's state.
	changed chan struct{}
	// timers turn open breakers half-open on time, so that the change is
	// reported without a request.
	timers []*time.Timer
}

// Option changes an Engine's clock or randomness (tests).
type Option func(*sources)

// WithClock makes the engine read time from now.
func WithClock(now func() time.Time) Option { return func(s *sources) { s.now = now } }

// WithRandom makes the engine draw faults from float, uniform in [0, 1).
func WithRandom(float func() float64) Option { return func(s *sources) { s.float = float } }

// NewEngine enforces set. The state of every rule of prev that set holds
// unchanged (same kind, policy, name and spec) carries over: a reload
// neither refills a bucket nor closes an open breaker.
func NewEngine(set *Set, prev *Engine, opts ...Option) *Engine {
	e := &Engine{set: set, src: sources{now: time.Now, float: rand.Float64},
		buckets: map[key]*bucket{}, breakers: map[key]*breakerState{}, logs: map[key]*countLog{},
		changed: make(chan struct{})}
	if prev != nil {
		e.src = prev.src
	}
	for _, o := range opts {
		o(&e.src)
	}
	if prev != nil {
		prev.mu.Lock()
		defer prev.mu.Unlock()
	}
	now := e.src.now()
	for _, r := range set.rateLimits {
		if old, ok := prevRule(prev, prev.rateLimit, r.key); ok && reflect.DeepEqual(old.spec, r.spec) {
			e.buckets[r.key] = prev.buckets[r.key]
			continue
		}
		e.buckets[r.key] = &bucket{tokens: float64(r.spec.Burst), last: now, rate: float64(r.spec.QPS), size: float64(r.spec.Burst)}
	}
	for _, r := range set.breakers {
		if old, ok := prevRule(prev, prev.breaker, r.key); ok && reflect.DeepEqual(old.spec, r.spec) {
			st := prev.breakers[r.key]
			st.rule = r
			e.breakers[r.key] = st
			if st.state == ctrlmeshv1alpha1.BreakerOpen {
				e.schedule(st.openUntil.Sub(now))
			}
			continue
		}
		e.breakers[r.key] = &breakerState{rule: r, state: ctrlmeshv1alpha1.BreakerClosed, since: now, window: newWindow(r.window)}
	}
	for _, r := range set.denies {
		if r.spec.Limit == nil {
			continue
		}
		if old, ok := prevRule(prev, prev.deny, r.key); ok && reflect.DeepEqual(old.spec, r.spec) {
			e.logs[r.key] = prev.logs[r.key]
			continue
		}
		e.logs[r.key] = &countLog{times: make([]time.Time, 0, r.spec.Limit.Count)}
	}
	return e
}

func prevRule[R any](prev *Engine, find func(key) (R, bool), k key) (R, bool) {
	if prev == nil {
		var zero R
		return zero, false
	}
	return find(k)
}

func (e *Engine) rateLimit(k key) (*rateLimitRule, bool) { return findKey(e.set.rateLimits, k) }
func (e *Engine) breaker(k key) (*breakerRule, bool)     { return findKey(e.set.breakers, k) }
func (e *Engine) deny(k key) (*denyRule, bool)           { return findKey(e.set.denies, k) }

type keyed interface{ ruleKey() key }

func (k key) ruleKey() key { return k }

func findKey[R keyed](rules []R, k key) (R, bool) {
	for _, r := range rules {
		if r.ruleKey() == k {
			return r, true
		}
	}
	var zero R
	return zero, false
}

// Set is the rules the engine enforces.
func (e *Engine) Set() *Set { return e.set }

// Stop releases the engine's timers and signals a change to those waiting
// on Breakers; call it when a new engine replaces it.
func (e *Engine) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, t := range e.timers {
		t.Stop()
	}
	e.timers = nil
	e.signal()
}

// Check decides r. The order is the order of cost to the operator: a deny
// rule refuses before anything counts the request, an open breaker fails
// it fast, a rate limit refuses it before a fault is drawn.
func (e *Engine) Check(r *Request) Decision {
	d := e.check(r)
	d.verb = r.Verb
	if !r.API() {
		d.verb = r.Method
		if r.Tunnel {
			d.verb = "CONNECT"
		}
	}
	return d
}

func (e *Engine) check(r *Request) Decision {
	if e == nil || e.set.Empty() {
		return Decision{}
	}
	set := e.set.candidates(r)
	if set.Empty() {
		return Decision{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.src.now()

	for _, d := range set.denies {
		if !d.match.matches(r) {
			continue
		}
		if log := e.logs[d.key]; log != nil {
			if log.allow(now, int(d.spec.Limit.Count), d.period) {
				continue
			}
			return Decision{Verdict: Denied, Status: http.StatusForbidden, Kind: KindDeny, Policy: d.policy, Rule: d.name,
				Message: fmt.Sprintf("denied by CircuitBreaker %s, rule %s (more than %d such requests in %ds): %s", d.policy, d.name, d.spec.Limit.Count, d.spec.Limit.PeriodSeconds, d.spec.Reason)}
		}
		return Decision{Verdict: Denied, Status: http.StatusForbidden, Kind: KindDeny, Policy: d.policy, Rule: d.name,
			Message: fmt.Sprintf("denied by CircuitBreaker %s, rule %s: %s", d.policy, d.name, d.spec.Reason)}
	}

	var dec Decision
	for _, b := range set.breakers {
		if !b.match.matches(r) {
			continue
		}
		st := e.breakers[b.key]
		switch st.current(now) {
		case ctrlmeshv1alpha1.BreakerOpen:
			return Decision{Verdict: BreakerOpen, Status: http.StatusServiceUnavailable, Kind: KindBreaker, Policy: b.policy, Rule: b.name,
				RetryAfter: st.openUntil.Sub(now),
				Message:    fmt.Sprintf("circuit breaker %s of CircuitBreaker %s is open until %s: %s", b.name, b.policy, st.openUntil.UTC().Format(time.RFC3339), st.why)}
		case ctrlmeshv1alpha1.BreakerHalfOpen:
			if st.probesSent >= b.probes {
				return Decision{Verdict: BreakerOpen, Status: http.StatusServiceUnavailable, Kind: KindBreaker, Policy: b.policy, Rule: b.name,
					RetryAfter: time.Second,
					Message:    fmt.Sprintf("circuit breaker %s of CircuitBreaker %s is half-open and its probes are out", b.name, b.policy)}
			}
			dec.probes = append(dec.probes, st)
		}
		dec.watching = append(dec.watching, st)
	}

	var wait time.Duration
	var limited *rateLimitRule
	for _, l := range set.rateLimits {
		if !l.match.matches(r) {
			continue
		}
		if w := e.buckets[l.key].wait(now); w > 0 && w > wait {
			wait, limited = w, l
		}
	}
	if limited != nil {
		for _, st := range dec.watching {
			if st.rule.policy == limited.policy && st.rule.limitedMax > 0 {
				st.window.add(now, sample{limited: 1})
				e.evaluate(st, now)
			}
		}
		return Decision{Verdict: RateLimited, Status: http.StatusTooManyRequests, RetryAfter: wait,
			Kind: KindRateLimit, Policy: limited.policy, Rule: limited.name,
			Message: fmt.Sprintf("rate limit %s of CircuitBreaker %s: %d requests a second, bursts of %d", limited.name, limited.policy, limited.spec.QPS, limited.spec.Burst)}
	}
	for _, l := range set.rateLimits {
		if l.match.matches(r) {
			e.buckets[l.key].take()
		}
	}
	for _, st := range dec.probes {
		st.probesSent++
	}

	for _, f := range set.faults {
		if !f.match.matches(r) || !f.inWindow(now) || e.src.float() >= f.percent {
			continue
		}
		dec.Delay, dec.Kind, dec.Policy, dec.Rule = f.delay, KindFault, f.policy, f.name
		if f.abort != 0 {
			dec.Verdict, dec.Status = Aborted, f.abort
			dec.Message = fmt.Sprintf("fault %s of FaultInjection %s injected", f.name, f.policy)
		}
		break
	}
	return dec
}

// Done tells the breakers that watched d's request its outcome: the
// status answered (0 when no answer came) and how long it took. Watches
// are never slow. Injected aborts count as failures: they stand for the
// upstream's failures, so a FaultInjection can exercise a breaker.
func (e *Engine) Done(d *Decision, status int, elapsed time.Duration, watch bool) {
	if e == nil || len(d.watching) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.src.now()
	failed := status == 0 || status >= 500 || status == http.StatusTooManyRequests
	for _, st := range d.watching {
		if e.breakers[st.rule.key] != st {
			continue // replaced by a reload meanwhile
		}
		slow := !watch && st.rule.slowAfter > 0 && elapsed > st.rule.slowAfter
		probe := false
		for _, p := range d.probes {
			probe = probe || p == st
		}
		switch {
		case probe && st.state == ctrlmeshv1alpha1.BreakerHalfOpen:
			if failed || slow {
				e.open(st, now, "a half-open probe failed")
			} else if st.probesPassed++; st.probesPassed >= st.rule.probes {
				e.transition(st, ctrlmeshv1alpha1.BreakerClosed, now)
				st.window = newWindow(st.rule.window)
			}
		case st.state == ctrlmeshv1alpha1.BreakerClosed:
			s := sample{total: 1}
			if failed {
				s.failed = 1
			}
			if slow {
				s.slow = 1
			}
			st.window.add(now, s)
			e.evaluate(st, now)
		}
	}
}

// evaluate opens a closed breaker whose window crossed a trigger.
func (e *Engine) evaluate(st *breakerState, now time.Time) {
	if st.state != ctrlmeshv1alpha1.BreakerClosed {
		return
	}
	sum := st.window.sum(now)
	r := st.rule
	switch {
	case r.limitedMax > 0 && sum.limited >= r.limitedMax:
		e.open(st, now, fmt.Sprintf("%d requests were rate limited within %s", sum.limited, r.window))
	case sum.total < r.minReqs:
	case r.failRatio > 0 && sum.failed*100 >= r.failRatio*sum.total:
		e.open(st, now, fmt.Sprintf("%d of %d requests failed within %s", sum.failed, sum.total, r.window))
	case r.slowRatio > 0 && sum.slow*100 >= r.slowRatio*sum.total:
		e.open(st, now, fmt.Sprintf("%d of %d requests took longer than %s within %s", sum.slow, sum.total, r.slowAfter, r.window))
	}
}

func (e *Engine) open(st *breakerState, now time.Time, why string) {
	st.openUntil, st.why = now.Add(st.rule.open), why
	e.transition(st, ctrlmeshv1alpha1.BreakerOpen, now)
	e.schedule(st.rule.open)
}

func (e *Engine) transition(st *breakerState, to ctrlmeshv1alpha1.BreakerState, now time.Time) {
	st.state, st.since, st.probesSent, st.probesPassed = to, now, 0, 0
	e.signal()
}

// schedule signals a change after d: when an open breaker turns half-open.
func (e *Engine) schedule(d time.Duration) {
	e.timers = append(e.timers, time.AfterFunc(max(d, 0), func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.signal()
	}))
}

func (e *Engine) signal() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// Breakers returns the state of every breaker that is not closed, and a
// channel that closes at the next change.
func (e *Engine) Breakers() ([]ctrlmeshv1alpha1.PodBreakerStatus, <-chan struct{}) {
	if e == nil {
		return nil, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.src.now()
	var out []ctrlmeshv1alpha1.PodBreakerStatus
	for _, b := range e.set.breakers {
		st := e.breakers[b.key]
		state := st.current(now)
		if state == ctrlmeshv1alpha1.BreakerClosed {
			continue
		}
		since := st.since
		if state != st.state { // half-open by time, not yet by a request
			since = st.openUntil
		}
		out = append(out, ctrlmeshv1alpha1.PodBreakerStatus{Policy: b.policy, Name: b.name, State: state,
			LastTransitionTime: metav1.NewTime(since.Truncate(time.Second))})
	}
	return out, e.changed
}

// bucket is a token bucket.
type bucket struct {
	tokens, rate, size float64
	last               time.Time
}

func (b *bucket) refill(now time.Time) {
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = math.Min(b.size, b.tokens+elapsed.Seconds()*b.rate)
		b.last = now
	}
}

// wait is 0 when a token is there, else how long until one is.
func (b *bucket) wait(now time.Time) time.Duration {
	b.refill(now)
	// The epsilon absorbs the rounding of many small refills.
	if b.tokens >= 1-1e-9 {
		return 0
	}
	return time.Duration(math.Ceil((1 - b.tokens) / b.rate * float64(time.Second)))
}

func (b *bucket) take() { b.tokens = math.Max(b.tokens-1, 0) }

// countLog remembers when the last count requests were let through: a
// sliding window, exact for any span of one period.
type countLog struct {
	times []time.Time // a ring once full
	next  int
}

func (c *countLog) allow(now time.Time, count int, period time.Duration) bool {
	if len(c.times) < count {
		c.times = append(c.times, now)
		return true
	}
	if now.Sub(c.times[c.next]) < period {
		return false
	}
	c.times[c.next] = now
	c.next = (c.next + 1) % count
	return true
}

type breakerState struct {
	rule         *breakerRule
	state        ctrlmeshv1alpha1.BreakerState
	since        time.Time
	openUntil    time.Time
	why          string
	probesSent   int64
	probesPassed int64
	window       *window
}

// current is the breaker's state at now: an open breaker whose recovery
// window passed is half-open.
func (st *breakerState) current(now time.Time) ctrlmeshv1alpha1.BreakerState {
	if st.state == ctrlmeshv1alpha1.BreakerOpen && !now.Before(st.openUntil) {
		st.state, st.since, st.probesSent, st.probesPassed = ctrlmeshv1alpha1.BreakerHalfOpen, st.openUntil, 0, 0
	}
	return st.state
}

func (f *faultRule) inWindow(now time.Time) bool {
	w := f.spec.Window
	return w == nil || ((w.Start == nil || !now.Before(w.Start.Time)) && (w.End == nil || now.Before(w.End.Time)))
}

// sample is what a window counts.
type sample struct{ total, failed, slow, limited int64 }

func (s *sample) plus(o sample) {
	s.total += o.total
	s.failed += o.failed
	s.slow += o.slow
	s.limited += o.limited
}

// window is a sliding window of one-second slots with running sums.
type window struct {
	slots []sample
	last  int64 // the second of the newest slot
	sums  sample
}

func newWindow(d time.Duration) *window {
	return &window{slots: make([]sample, max(int(d/time.Second), 1))}
}

// advance drops the slots that fell out of the window by second sec.
func (w *window) advance(sec int64) {
	n := int64(len(w.slots))
	if sec-w.last >= n {
		clear(w.slots)
		w.sums = sample{}
	} else {
		for s := w.last + 1; s <= sec; s++ {
			old := &w.slots[s%n]
			w.sums.plus(sample{-old.total, -old.failed, -old.slow, -old.limited})
			*old = sample{}
		}
	}
	if sec > w.last {
		w.last = sec
	}
}

func (w *window) add(now time.Time, s sample) {
	sec := now.Unix()
	w.advance(sec)
	w.slots[w.last%int64(len(w.slots))].plus(s)
	w.sums.plus(s)
}

func (w *window) sum(now time.Time) sample {
	w.advance(now.Unix())
	return w.sums
}
