package policy

import (
	"errors"
	"fmt"
	"slices"
	"time"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// Target is the pod a Set is compiled for: faults may be limited to
// shards, or to the canary shard.
type Target struct {
	// Shard the pod serves, "" for none.
	Shard string
	// Canary is true when that shard is the canary shard.
	Canary bool
}

// Set is the policies of a route compiled for one pod. It is immutable; an
// Engine enforces it.
type Set struct {
	rateLimits []*rateLimitRule
	breakers   []*breakerRule
	denies     []*denyRule
	faults     []*faultRule

	// The rules that can match a request, in their order, so that a check
	// looks at those only: byResource for the API requests of each resource
	// a rule names, anyResource for those of others (rules naming "*"),
	// external for requests through the forward proxy. Nil when there
	// would be too many resources to index: every rule is looked at.
	byResource  map[groupResource]*Set
	anyResource *Set
	external    *Set
}

type groupResource struct{ group, resource string }

// maxIndexed bounds the resources a Set indexes.
const maxIndexed = 512

// index fills byResource, anyResource and external.
func (s *Set) index() {
	grs := map[groupResource]bool{}
	for _, m := range s.matchers() {
		for _, rg := range m.resources {
			for _, g := range rg.APIGroups {
				for _, r := range rg.Resources {
					if g != "*" && r != "*" {
						grs[groupResource{g, r}] = true
					}
				}
			}
		}
	}
	if len(grs) > maxIndexed {
		return
	}
	s.byResource = map[groupResource]*Set{}
	for gr := range grs {
		s.byResource[gr] = s.filter(func(m *matcher) bool { return len(m.resources) > 0 && m.matchesResource(gr.group, gr.resource) })
	}
	// No request is of the resource "\x00", so only wildcards match it.
	s.anyResource = s.filter(func(m *matcher) bool { return len(m.resources) > 0 && m.matchesResource("\x00", "\x00") })
	s.external = s.filter(func(m *matcher) bool { return len(m.hosts) > 0 })
}

func (s *Set) matchers() []*matcher {
	var out []*matcher
	for _, r := range s.rateLimits {
		out = append(out, &r.match)
	}
	for _, r := range s.breakers {
		out = append(out, &r.match)
	}
	for _, r := range s.denies {
		out = append(out, &r.match)
	}
	for _, r := range s.faults {
		out = append(out, &r.match)
	}
	return out
}

func (s *Set) filter(keep func(*matcher) bool) *Set {
	return &Set{
		rateLimits: filtered(s.rateLimits, func(r *rateLimitRule) bool { return keep(&r.match) }),
		breakers:   filtered(s.breakers, func(r *breakerRule) bool { return keep(&r.match) }),
		denies:     filtered(s.denies, func(r *denyRule) bool { return keep(&r.match) }),
		faults:     filtered(s.faults, func(r *faultRule) bool { return keep(&r.match) }),
	}
}

func filtered[R any](rules []R, keep func(R) bool) []R {
	var out []R
	for _, r := range rules {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// candidates is the Set of the rules that can match r.
func (s *Set) candidates(r *Request) *Set {
	switch {
	case s.byResource == nil:
		return s
	case !r.API():
		return s.external
	}
	if sub, ok := s.byResource[groupResource{r.Group, r.Resource}]; ok {
		return sub
	}
	return s.anyResource
}

// Empty reports whether the set holds no rule: the proxy then skips the
// engine altogether.
func (s *Set) Empty() bool {
	return s == nil || len(s.rateLimits)+len(s.breakers)+len(s.denies)+len(s.faults) == 0
}

// key names one rule across reloads: its kind, policy and name.
type key struct{ kind, policy, name string }

type rateLimitRule struct {
	key
	match matcher
	spec  ctrlmeshv1alpha1.RateLimit
}

type breakerRule struct {
	key
	match      matcher
	spec       ctrlmeshv1alpha1.Breaker
	window     time.Duration
	open       time.Duration
	minReqs    int64
	probes     int64
	failRatio  int64 // percent, 0 for none
	slowAfter  time.Duration
	slowRatio  int64
	limitedMax int64 // 0 for none
	// policy is the CircuitBreaker's name: the breaker counts the refusals
	// of that CircuitBreaker's rate limits.
	policy string
}

type denyRule struct {
	key
	match  matcher
	spec   ctrlmeshv1alpha1.DenyRule
	period time.Duration
}

type faultRule struct {
	key
	match   matcher
	spec    ctrlmeshv1alpha1.Fault
	percent float64
	delay   time.Duration
	abort   int
}

// Rule kinds, the "kind" of decisions and metrics.
const (
	KindRateLimit = "rateLimit"
	KindBreaker   = "breaker"
	KindDeny      = "deny"
	KindFault     = "fault"
)

// Compile reads the policies of a route for the pod target. It checks what
// the CRDs check (a route read from a file never met the API server) and
// fills the CRDs' defaults; any error refuses the whole route, so that the
// proxy keeps its last good rules.
func Compile(p *ctrlmeshv1alpha1.RoutePolicies, target Target) (*Set, error) {
	set := &Set{}
	if p == nil {
		return set, nil
	}
	var errs []error
	for _, cb := range p.CircuitBreakers {
		at := func(kind string, i int) string { return fmt.Sprintf("CircuitBreaker %q %s[%d]", cb.Name, kind, i) }
		for i, rl := range cb.Spec.RateLimits {
			if err := checkMatch(rl.Match); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", at("rateLimits", i), err))
			}
			if rl.QPS < 1 || rl.Burst < 1 {
				errs = append(errs, fmt.Errorf("%s: qps and burst must be at least 1 (have %d and %d)", at("rateLimits", i), rl.QPS, rl.Burst))
			}
			set.rateLimits = append(set.rateLimits, &rateLimitRule{key: key{KindRateLimit, cb.Name, rl.Name}, match: compileMatch(rl.Match), spec: rl})
		}
		for i, b := range cb.Spec.Breakers {
			if err := checkMatch(b.Match); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", at("breakers", i), err))
			}
			if b.FailureRatioPercent == nil && b.SlowCalls == nil && b.RateLimited == nil {
				errs = append(errs, fmt.Errorf("%s: a breaker needs a trigger: failureRatioPercent, slowCalls or rateLimited", at("breakers", i)))
			}
			r := &breakerRule{key: key{KindBreaker, cb.Name, b.Name}, match: compileMatch(b.Match), spec: b, policy: cb.Name,
				window: seconds(b.WindowSeconds, 60), open: seconds(b.OpenSeconds, 30),
				minReqs: int64(orDefault(b.MinRequests, 10)), probes: int64(orDefault(b.HalfOpenProbes, 1))}
			if b.FailureRatioPercent != nil {
				r.failRatio = int64(*b.FailureRatioPercent)
			}
			if b.SlowCalls != nil {
				r.slowAfter, r.slowRatio = time.Duration(b.SlowCalls.ThresholdMilliseconds)*time.Millisecond, int64(b.SlowCalls.RatioPercent)
			}
			if b.RateLimited != nil {
				r.limitedMax = int64(*b.RateLimited)
			}
			if r.failRatio < 0 || r.failRatio > 100 || r.slowRatio < 0 || r.slowRatio > 100 || r.limitedMax < 0 ||
				(b.SlowCalls != nil && (r.slowAfter <= 0 || r.slowRatio == 0)) {
				errs = append(errs, fmt.Errorf("%s: ratios must be 1 to 100 percent, thresholds positive", at("breakers", i)))
			}
			set.breakers = append(set.breakers, r)
		}
		for i, d := range cb.Spec.Deny {
			if err := checkMatch(d.Match); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", at("deny", i), err))
			}
			if d.Reason == "" {
				errs = append(errs, fmt.Errorf("%s: a deny rule needs a reason", at("deny", i)))
			}
			r := &denyRule{key: key{KindDeny, cb.Name, d.Name}, match: compileMatch(d.Match), spec: d}
			if d.Limit != nil {
				if d.Limit.Count < 1 || d.Limit.Count > maxDenyCount || d.Limit.PeriodSeconds < 1 {
					errs = append(errs, fmt.Errorf("%s: limit.count must be 1 to %d and limit.periodSeconds at least 1", at("deny", i), maxDenyCount))
				}
				r.period = seconds(d.Limit.PeriodSeconds, 1)
			}
			set.denies = append(set.denies, r)
		}
	}
	for _, fi := range p.FaultInjections {
		for i, f := range fi.Spec.Faults {
			at := fmt.Sprintf("FaultInjection %q faults[%d]", fi.Name, i)
			if err := checkMatch(f.Match); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", at, err))
			}
			if f.Delay == nil && f.Abort == nil {
				errs = append(errs, fmt.Errorf("%s: a fault needs a delay, an abort or both", at))
			}
			if f.Percent < 1 || f.Percent > 100 {
				errs = append(errs, fmt.Errorf("%s: percent must be 1 to 100 (have %d)", at, f.Percent))
			}
			if f.Abort != nil && (f.Abort.StatusCode < 400 || f.Abort.StatusCode > 599) {
				errs = append(errs, fmt.Errorf("%s: abort.statusCode must be 400 to 599 (have %d)", at, f.Abort.StatusCode))
			}
			if f.Delay != nil && f.Delay.Milliseconds < 1 {
				errs = append(errs, fmt.Errorf("%s: delay.milliseconds must be at least 1", at))
			}
			if (len(f.Shards) > 0 && !slices.Contains(f.Shards, target.Shard)) || (f.CanaryOnly && !target.Canary) {
				continue // not this pod's fault
			}
			r := &faultRule{key: key{KindFault, fi.Name, f.Name}, match: compileMatch(f.Match), spec: f, percent: float64(f.Percent) / 100}
			if f.Delay != nil {
				r.delay = time.Duration(f.Delay.Milliseconds) * time.Millisecond
			}
			if f.Abort != nil {
				r.abort = int(f.Abort.StatusCode)
			}
			set.faults = append(set.faults, r)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("traffic policies: %w", err)
	}
	set.index()
	return set, nil
}

// maxDenyCount bounds a deny rule's count: the engine remembers that many
// times per rule.
const maxDenyCount = 100000

func checkMatch(m ctrlmeshv1alpha1.TrafficMatch) error {
	switch {
	case (len(m.Resources) > 0) == (len(m.Hosts) > 0):
		return errors.New("a match names either resources or hosts, exactly one of them")
	case len(m.Hosts) > 0 && (len(m.Verbs) > 0 || len(m.Namespaces) > 0 || len(m.Names) > 0):
		return errors.New("verbs, namespaces and names match API requests only")
	case len(m.Resources) > 0 && (len(m.Methods) > 0 || len(m.PathPrefixes) > 0):
		return errors.New("methods and pathPrefixes match external requests only")
	}
	return nil
}

func orDefault(v, def int32) int32 {
	if v <= 0 {
		return def
	}
	return v
}

func seconds(v, def int32) time.Duration { return time.Duration(orDefault(v, def)) * time.Second }
