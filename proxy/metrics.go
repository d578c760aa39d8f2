package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics of one proxy, on a registry of its own (no process-wide globals).
type Metrics struct {
	Registry *prometheus.Registry

	requests          *prometheus.CounterVec
	injectedSelectors *prometheus.CounterVec
	fencedWrites      prometheus.Counter
	lockRenames       prometheus.Counter
	relistsForced     *prometheus.CounterVec
	unsharded         *prometheus.CounterVec
	rulesLoaded       *prometheus.CounterVec
	rulesInfo         *prometheus.GaugeVec
	validityLapses    prometheus.Counter
	policyDecisions   *prometheus.CounterVec
	faultsInjected    *prometheus.CounterVec
	forwardRequests   *prometheus.CounterVec
	isolated          prometheus.Counter
	insideNamespaces  prometheus.Gauge
}

// Request outcomes, the "outcome" label of ctrlmesh_proxy_requests_total.
const (
	outcomePassthrough = "passthrough"
	outcomeSharded     = "sharded"
	outcomeFenced      = "fenced"
	outcomeLock        = "lock-renamed"
	outcomeUnavailable = "unavailable"
	outcomeRefused     = "refused"
	// outcomePolicy: refused or aborted by a traffic policy.
	outcomePolicy = "policy"
)

// NewMetrics registers the proxy's metrics, plus Go and process collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_requests_total",
			Help: "API requests handled, by verb and outcome (passthrough, sharded, fenced, lock-renamed, unavailable, refused, policy).",
		}, []string{"verb", "outcome"}),
		injectedSelectors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_injected_selectors_total",
			Help: "List and watch requests narrowed to the shard, by mode (range, label).",
		}, []string{"mode"}),
		fencedWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_fenced_writes_total",
			Help: "Writes refused because their namespace is outside the shard.",
		}),
		lockRenames: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_lock_renames_total",
			Help: "Leader-election lock requests renamed to the shard's lock.",
		}),
		relistsForced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_relists_forced_total",
			Help: "Watches ended with 410 Expired so the operator relists, by reason (rules-changed, stale-resource-version).",
		}, []string{"reason"}),
		unsharded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_unsharded_responses_total",
			Help: "Range-mode list and watch responses refused because the API server did not prove it applied the shardSelector (a kube-apiserver without the ShardedListAndWatch gate), by verb.",
		}, []string{"verb"}),
		rulesLoaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_rules_loads_total",
			Help: "Rules offered to the proxy, by result (applied, refused).",
		}, []string{"result"}),
		rulesInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ctrlmesh_proxy_rules_info",
			Help: "The rules in force: 1 for the enforced hash, routing generation, shard and mode.",
		}, []string{"hash", "generation", "shard", "mode"}),
		validityLapses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_validity_lapses_total",
			Help: "Times the rules' validity (Fleet scope) ran out without a renewal, so the proxy stopped serving its shard.",
		}),
		policyDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_policy_decisions_total",
			Help: "Requests a traffic-policy rule decided, by rule kind (rateLimit, breaker, deny, fault), policy, rule and verdict (pass, rate-limited, breaker-open, denied, aborted).",
		}, []string{"kind", "policy", "rule", "verdict"}),
		faultsInjected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_faults_injected_total",
			Help: "Faults injected, by FaultInjection, fault and effect (delay, abort).",
		}, []string{"policy", "fault", "effect"}),
		forwardRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_forward_requests_total",
			Help: "External requests the forward proxy handled, by method (CONNECT for HTTPS tunnels; other for unusual methods) and outcome (forwarded, tunneled, failed, policy, refused, unavailable). Their policy decisions and faults count in ctrlmesh_proxy_policy_decisions_total and ctrlmesh_proxy_faults_injected_total, as API requests' do.",
		}, []string{"method", "outcome"}),
		isolated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ctrlmesh_proxy_isolation_refusals_total",
			Help: "Requests refused because their namespace is outside the operator's namespace isolation (or its labels are not confirmed).",
		}),
		insideNamespaces: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ctrlmesh_proxy_isolation_namespaces",
			Help: "Namespaces confirmed inside the operator's namespace isolation (0 while their labels cannot be confirmed).",
		}),
	}
	m.Registry.MustRegister(m.policyDecisions, m.faultsInjected, m.forwardRequests,
		m.requests, m.injectedSelectors, m.fencedWrites, m.lockRenames, m.relistsForced, m.unsharded,
		m.rulesLoaded, m.rulesInfo, m.validityLapses, m.isolated, m.insideNamespaces, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
