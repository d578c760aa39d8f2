package policy

import (
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// clock is a manual clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time       { return c.t }
func (c *clock) step(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }
func res(group, resource string) ctrlmeshv1alpha1.ResourceGroup {
	return ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{group}, Resources: []string{resource}}
}

var (
	getCM     = &Request{Resource: "configmaps", Verb: "get", Namespace: "a", Name: "x"}
	deletePod = &Request{Resource: "pods", Verb: "delete", Namespace: "a", Name: "p"}
	deleteNS  = &Request{Resource: "namespaces", Verb: "delete", Name: "a"}
)

func cbPolicies(spec ctrlmeshv1alpha1.CircuitBreakerSpec) *ctrlmeshv1alpha1.RoutePolicies {
	return &ctrlmeshv1alpha1.RoutePolicies{CircuitBreakers: []ctrlmeshv1alpha1.RouteCircuitBreaker{{Name: "cb", Generation: 1, Spec: spec}}}
}

func mustEngine(t *testing.T, p *ctrlmeshv1alpha1.RoutePolicies, target Target, c *clock, prev *Engine, float func() float64) *Engine {
	t.Helper()
	set, err := Compile(p, target)
	if err != nil {
		t.Fatal(err)
	}
	opts := []Option{WithClock(c.now)}
	if float != nil {
		opts = append(opts, WithRandom(float))
	}
	e := NewEngine(set, prev, opts...)
	t.Cleanup(e.Stop)
	return e
}

func TestMatch(t *testing.T) {
	tests := []struct {
		name  string
		match ctrlmeshv1alpha1.TrafficMatch
		req   Request
		want  bool
	}{
		{"resource", ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "pods")}}, *deletePod, true},
		{"other resource", ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "pods")}}, *getCM, false},
		{"other group", ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("apps", "pods")}}, *deletePod, false},
		{"wildcards", ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("*", "*")}, Verbs: []ctrlmeshv1alpha1.Verb{"*"}}, *getCM, true},
		{"verb", ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "pods")}, Verbs: []ctrlmeshv1alpha1.Verb{"get"}}, *deletePod, false},
		{"namespace", ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "pods")}, Namespaces: []string{"b"}}, *deletePod, false},
		{"cluster-scoped under namespaces", ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "namespaces")}, Namespaces: []string{"a"}}, *deleteNS, false},
		{"name", ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "pods")}, Names: []string{"p"}}, *deletePod, true},
		{"list under names", ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "pods")}, Names: []string{"p"}}, Request{Resource: "pods", Verb: "list"}, false},
		{"api request, host match", ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"*"}}, *getCM, false},
		{"host", ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"api.example.com"}}, Request{Host: "api.example.com", Method: "GET", Path: "/"}, true},
		{"host suffix", ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"*.example.com"}}, Request{Host: "a.b.example.com", Tunnel: true}, true},
		{"suffix is not its own subdomain", ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"*.example.com"}}, Request{Host: "example.com", Tunnel: true}, false},
		{"suffix needs the dot", ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"*.example.com"}}, Request{Host: "badexample.com", Tunnel: true}, false},
		{"method", ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"*"}, Methods: []string{"POST"}}, Request{Host: "h", Method: "GET", Path: "/"}, false},
		{"path prefix", ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"*"}, PathPrefixes: []string{"/v1/"}}, Request{Host: "h", Method: "GET", Path: "/v1/pay"}, true},
		{"tunnel under methods", ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"*"}, Methods: []string{"GET"}}, Request{Host: "h", Tunnel: true}, false},
		{"external request, resource match", ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("*", "*")}}, Request{Host: "h", Method: "GET"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := compileMatch(tt.match)
			if got := m.matches(&tt.req); got != tt.want {
				t.Errorf("matches(%+v) = %v, want %v", tt.req, got, tt.want)
			}
		})
	}
}

func TestHostOf(t *testing.T) {
	for in, want := range map[string]string{
		"Example.COM:443": "example.com", "example.com": "example.com", "[::1]:8080": "::1", "[::1]": "::1",
		"10.0.0.1:80": "10.0.0.1", "example.com.": "example.com", "user@evil:80": "", "a/b": "",
	} {
		if got := HostOf(in); got != want {
			t.Errorf("HostOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRateLimit(t *testing.T) {
	c := newClock()
	e := mustEngine(t, cbPolicies(ctrlmeshv1alpha1.CircuitBreakerSpec{RateLimits: []ctrlmeshv1alpha1.RateLimit{{Name: "cm", QPS: 10, Burst: 5,
		Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "configmaps")}}}}}), Target{}, c, nil, nil)
	passed := 0
	for range 5 {
		if d := e.Check(getCM); d.Verdict == Pass {
			passed++
		}
	}
	d := e.Check(getCM)
	if passed != 5 || d.Verdict != RateLimited || d.Status != http.StatusTooManyRequests || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("after the burst: %d passed, then %+v; want 5, then 429 retry after 100ms", passed, d)
	}
	if d := e.Check(deletePod); d.Verdict != Pass {
		t.Fatalf("an unmatched request was limited: %+v", d)
	}
	// Over 10 s at 100 tries a second, 10 a second pass.
	passed = 0
	for range 1000 {
		c.step(10 * time.Millisecond)
		if e.Check(getCM).Verdict == Pass {
			passed++
		}
	}
	if passed != 100 {
		t.Errorf("%d passed in 10s at 10 qps, want 100", passed)
	}
}

func TestDeny(t *testing.T) {
	c := newClock()
	e := mustEngine(t, cbPolicies(ctrlmeshv1alpha1.CircuitBreakerSpec{Deny: []ctrlmeshv1alpha1.DenyRule{
		{Name: "no-ns-deletes", Reason: "ask the platform team", Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "namespaces")}, Verbs: []ctrlmeshv1alpha1.Verb{"delete"}}},
		{Name: "pod-deletes", Reason: "at most 3 pod deletes a minute", Limit: &ctrlmeshv1alpha1.CountLimit{Count: 3, PeriodSeconds: 60},
			Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "pods")}, Verbs: []ctrlmeshv1alpha1.Verb{"delete"}}},
	}}), Target{}, c, nil, nil)
	if d := e.Check(deleteNS); d.Verdict != Denied || d.Status != http.StatusForbidden || !strings.Contains(d.Message, "ask the platform team") {
		t.Fatalf("namespace delete: %+v", d)
	}
	if d := e.Check(&Request{Resource: "namespaces", Verb: "get", Name: "a"}); d.Verdict != Pass {
		t.Fatalf("namespace get: %+v", d)
	}
	verdicts := ""
	for i := range 8 {
		c.t = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Add([]time.Duration{0, 10, 20, 30, 59, 60, 61, 79}[i] * time.Second)
		verdicts += map[Verdict]string{Pass: "p", Denied: "d"}[e.Check(deletePod).Verdict]
	}
	// Passed at 0, 10, 20; at 60 the one of 0 is a minute old, at 61 that
	// of 10 is not, at 79 it is: no minute holds more than 3.
	if verdicts != "pppddpdp" {
		t.Errorf("pod deletes at 0,10,20,30,59,60,61,79s: %s, want pppddpdp", verdicts)
	}
}

func TestBreakerOpensAndRecovers(t *testing.T) {
	c := newClock()
	p := cbPolicies(ctrlmeshv1alpha1.CircuitBreakerSpec{Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "cm", FailureRatioPercent: ptr.To[int32](50),
		WindowSeconds: 10, MinRequests: 4, OpenSeconds: 5, HalfOpenProbes: 2,
		Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "configmaps")}}}}})
	e := mustEngine(t, p, Target{}, c, nil, nil)
	call := func(status int) Verdict {
		d := e.Check(getCM)
		if d.Verdict == Pass {
			e.Done(&d, status, time.Millisecond, false)
		}
		return d.Verdict
	}
	// 3 failures are below minRequests; one success makes 3 of 4 = 75 %.
	for _, s := range []int{500, 503, 0} {
		call(s)
	}
	if st, _ := e.Breakers(); len(st) != 0 {
		t.Fatalf("open below minRequests: %+v", st)
	}
	_, changed := e.Breakers()
	call(200)
	st, _ := e.Breakers()
	if len(st) != 1 || st[0].State != ctrlmeshv1alpha1.BreakerOpen || !st[0].LastTransitionTime.Time.Equal(c.t) {
		t.Fatalf("after 3 of 4 failed: %+v", st)
	}
	select {
	case <-changed:
	default:
		t.Fatal("opening did not signal a change")
	}
	d := e.Check(getCM)
	if d.Verdict != BreakerOpen || d.Status != http.StatusServiceUnavailable || d.RetryAfter != 5*time.Second || !strings.Contains(d.Message, "3 of 4 requests failed") {
		t.Fatalf("while open: %+v", d)
	}
	c.step(5 * time.Second)
	st, _ = e.Breakers()
	if len(st) != 1 || st[0].State != ctrlmeshv1alpha1.BreakerHalfOpen {
		t.Fatalf("after the recovery window: %+v", st)
	}
	// Two probes pass; a third request meanwhile fails fast.
	p1, p2 := e.Check(getCM), e.Check(getCM)
	if p1.Verdict != Pass || p2.Verdict != Pass || e.Check(getCM).Verdict != BreakerOpen {
		t.Fatalf("half-open probes: %v %v", p1.Verdict, p2.Verdict)
	}
	e.Done(&p1, 200, time.Millisecond, false)
	e.Done(&p2, 500, time.Millisecond, false)
	if st, _ := e.Breakers(); len(st) != 1 || st[0].State != ctrlmeshv1alpha1.BreakerOpen {
		t.Fatalf("a failed probe did not reopen: %+v", st)
	}
	c.step(5 * time.Second)
	p1, p2 = e.Check(getCM), e.Check(getCM)
	e.Done(&p1, 200, time.Millisecond, false)
	e.Done(&p2, 404, time.Millisecond, false)
	if st, _ := e.Breakers(); len(st) != 0 {
		t.Fatalf("two good probes did not close: %+v", st)
	}
	// Closed with a fresh window: one failure opens nothing.
	if call(500); e.Check(getCM).Verdict != Pass {
		t.Fatal("the window was not reset on closing")
	}
}

func TestBreakerTriggers(t *testing.T) {
	match := ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "configmaps")}}
	t.Run("slow calls", func(t *testing.T) {
		c := newClock()
		e := mustEngine(t, cbPolicies(ctrlmeshv1alpha1.CircuitBreakerSpec{Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "slow", Match: match, MinRequests: 2,
			SlowCalls: &ctrlmeshv1alpha1.SlowCalls{ThresholdMilliseconds: 100, RatioPercent: 50}}}}), Target{}, c, nil, nil)
		call := func(elapsed time.Duration, watch bool) {
			d := e.Check(getCM)
			e.Done(&d, 200, elapsed, watch)
		}
		call(time.Second, true) // watches are never slow
		call(time.Second, true)
		call(time.Second, false)
		if e.Check(getCM).Verdict != Pass {
			t.Fatal("open at 1 slow call of 3 (watches counted as slow)")
		}
		call(time.Second, false)
		if e.Check(getCM).Verdict != BreakerOpen {
			t.Fatal("2 slow calls of 4 at 50 % did not open")
		}
	})
	t.Run("rate limited", func(t *testing.T) {
		c := newClock()
		e := mustEngine(t, cbPolicies(ctrlmeshv1alpha1.CircuitBreakerSpec{
			RateLimits: []ctrlmeshv1alpha1.RateLimit{{Name: "cm", Match: match, QPS: 1, Burst: 1}},
			Breakers:   []ctrlmeshv1alpha1.Breaker{{Name: "runaway", Match: match, RateLimited: ptr.To[int32](3), WindowSeconds: 60}}}), Target{}, c, nil, nil)
		var verdicts []Verdict
		for range 6 {
			verdicts = append(verdicts, e.Check(getCM).Verdict)
		}
		want := []Verdict{Pass, RateLimited, RateLimited, RateLimited, BreakerOpen, BreakerOpen}
		for i := range want {
			if verdicts[i] != want[i] {
				t.Fatalf("verdicts %v, want %v", verdicts, want)
			}
		}
	})
	t.Run("window slides", func(t *testing.T) {
		c := newClock()
		e := mustEngine(t, cbPolicies(ctrlmeshv1alpha1.CircuitBreakerSpec{Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "f", Match: match, MinRequests: 2,
			WindowSeconds: 10, FailureRatioPercent: ptr.To[int32](100)}}}), Target{}, c, nil, nil)
		d := e.Check(getCM)
		e.Done(&d, 500, 0, false)
		c.step(10 * time.Second)
		d = e.Check(getCM)
		e.Done(&d, 500, 0, false)
		if e.Check(getCM).Verdict != Pass {
			t.Fatal("a failure 10s old still counted in a 10s window")
		}
	})
}

func TestFaults(t *testing.T) {
	c := newClock()
	start := metav1.NewTime(c.t.Add(time.Minute))
	p := &ctrlmeshv1alpha1.RoutePolicies{FaultInjections: []ctrlmeshv1alpha1.RouteFaultInjection{{Name: "fi", Generation: 1, Spec: ctrlmeshv1alpha1.FaultInjectionSpec{Faults: []ctrlmeshv1alpha1.Fault{
		{Name: "later", Percent: 100, Abort: &ctrlmeshv1alpha1.FaultAbort{StatusCode: 500}, Window: &ctrlmeshv1alpha1.FaultWindow{Start: &start},
			Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "configmaps")}}},
		{Name: "canary", Percent: 100, CanaryOnly: true, Abort: &ctrlmeshv1alpha1.FaultAbort{StatusCode: 502},
			Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "pods")}}},
		{Name: "half", Percent: 50, Delay: &ctrlmeshv1alpha1.FaultDelay{Milliseconds: 200}, Abort: &ctrlmeshv1alpha1.FaultAbort{StatusCode: 503},
			Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "configmaps")}}},
	}}}}}
	draws := []float64{0.49, 0.5}
	float := func() float64 { f := draws[0]; draws = append(draws[1:], f); return f }
	e := mustEngine(t, p, Target{Shard: "0"}, c, nil, float)
	if d := e.Check(deletePod); d.Verdict != Pass || d.Delay != 0 {
		t.Fatalf("the canary's fault hit a pod of shard 0: %+v", d)
	}
	d := e.Check(getCM)
	if d.Verdict != Aborted || d.Status != 503 || d.Delay != 200*time.Millisecond || d.Rule != "half" {
		t.Fatalf("draw 0.49 under 50 %%: %+v", d)
	}
	if d := e.Check(getCM); d.Verdict != Pass || d.Delay != 0 {
		t.Fatalf("draw 0.5 under 50 %%: %+v", d)
	}
	c.step(time.Minute)
	if d := e.Check(getCM); d.Verdict != Aborted || d.Status != 500 {
		t.Fatalf("in its window: %+v", d)
	}
	canary := mustEngine(t, p, Target{Shard: "canary", Canary: true}, c, nil, float)
	if d := canary.Check(deletePod); d.Verdict != Aborted || d.Status != 502 {
		t.Fatalf("the canary's fault on the canary: %+v", d)
	}
}

// TestReloadKeepsState: an unchanged rule keeps its state over a reload, a
// changed one starts afresh.
func TestReloadKeepsState(t *testing.T) {
	c := newClock()
	spec := ctrlmeshv1alpha1.CircuitBreakerSpec{
		RateLimits: []ctrlmeshv1alpha1.RateLimit{{Name: "cm", QPS: 1, Burst: 1, Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "configmaps")}}}},
		Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "b", MinRequests: 1, FailureRatioPercent: ptr.To[int32](100),
			Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "pods")}}}},
	}
	e := mustEngine(t, cbPolicies(spec), Target{}, c, nil, nil)
	e.Check(getCM)
	d := e.Check(deletePod)
	e.Done(&d, 500, 0, false)
	same := mustEngine(t, cbPolicies(spec), Target{}, c, e, nil)
	if same.Check(getCM).Verdict != RateLimited || same.Check(deletePod).Verdict != BreakerOpen {
		t.Fatal("an unchanged reload refilled the bucket or closed the breaker")
	}
	spec.RateLimits[0].Burst = 2
	spec.Breakers[0].OpenSeconds = 10
	changed := mustEngine(t, cbPolicies(spec), Target{}, c, same, nil)
	if changed.Check(getCM).Verdict != Pass || changed.Check(deletePod).Verdict != Pass {
		t.Fatal("changed rules kept the old state")
	}
}

func TestCompileRefuses(t *testing.T) {
	tests := []struct {
		name string
		p    *ctrlmeshv1alpha1.RoutePolicies
		want string
	}{
		{"match both", cbPolicies(ctrlmeshv1alpha1.CircuitBreakerSpec{RateLimits: []ctrlmeshv1alpha1.RateLimit{{Name: "x", QPS: 1, Burst: 1,
			Match: ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"a"}, Resources: []ctrlmeshv1alpha1.ResourceGroup{res("", "pods")}}}}}), `CircuitBreaker "cb" rateLimits[0]: a match names either resources or hosts`},
		{"zero qps", cbPolicies(ctrlmeshv1alpha1.CircuitBreakerSpec{RateLimits: []ctrlmeshv1alpha1.RateLimit{{Name: "x", Burst: 1,
			Match: ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"a"}}}}}), "qps and burst must be at least 1"},
		{"no trigger", cbPolicies(ctrlmeshv1alpha1.CircuitBreakerSpec{Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "x",
			Match: ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"a"}}}}}), "a breaker needs a trigger"},
		{"no reason", cbPolicies(ctrlmeshv1alpha1.CircuitBreakerSpec{Deny: []ctrlmeshv1alpha1.DenyRule{{Name: "x",
			Match: ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"a"}}}}}), "a deny rule needs a reason"},
		{"fault without effect", &ctrlmeshv1alpha1.RoutePolicies{FaultInjections: []ctrlmeshv1alpha1.RouteFaultInjection{{Name: "fi", Spec: ctrlmeshv1alpha1.FaultInjectionSpec{
			Faults: []ctrlmeshv1alpha1.Fault{{Name: "x", Percent: 10, Match: ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"a"}}}}}}}}, `FaultInjection "fi" faults[0]: a fault needs a delay, an abort or both`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compile(tt.p, Target{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Compile: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
