package proxy

import (
	vm "github.com/VictoriaMetrics/metrics"

	"github.com/ctrlmesh/ctrlmesh/proxy/internal/metrics"
)

// Metrics of one proxy, on a registry of its own (no process-wide globals).
type Metrics struct {
	Registry *metrics.Registry

	requests          *metrics.CounterVec
	injectedSelectors *metrics.CounterVec
	fencedWrites      *vm.Counter
	lockRenames       *vm.Counter
	relistsForced     *metrics.CounterVec
	unsharded         *metrics.CounterVec
	rulesLoaded       *metrics.CounterVec
	rulesInfo         *metrics.GaugeVec
	validityLapses    *vm.Counter
	policyDecisions   *metrics.CounterVec
	faultsInjected    *metrics.CounterVec
	forwardRequests   *metrics.CounterVec
	isolated          *vm.Counter
	insideNamespaces  *vm.Gauge
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

// NewMetrics registers the proxy's metrics; the registry writes the Go
// runtime's and the process's after them.
func NewMetrics() *Metrics {
	r := metrics.NewRegistry()
	return &Metrics{
		Registry: r,
		requests: r.NewCounterVec("ctrlmesh_proxy_requests_total",
			"API requests handled, by verb and outcome (passthrough, sharded, fenced, lock-renamed, unavailable, refused, policy).", "verb", "outcome"),
		injectedSelectors: r.NewCounterVec("ctrlmesh_proxy_injected_selectors_total",
			"List and watch requests narrowed to the shard, by mode (range, label).", "mode"),
		fencedWrites: r.NewCounter("ctrlmesh_proxy_fenced_writes_total",
			"Writes refused because their namespace is outside the shard."),
		lockRenames: r.NewCounter("ctrlmesh_proxy_lock_renames_total",
			"Leader-election lock requests renamed to the shard's lock."),
		relistsForced: r.NewCounterVec("ctrlmesh_proxy_relists_forced_total",
			"Watches ended with 410 Expired so the operator relists, by reason (rules-changed, stale-resource-version).", "reason"),
		unsharded: r.NewCounterVec("ctrlmesh_proxy_unsharded_responses_total",
			"Range-mode list and watch responses refused because the API server did not prove it applied the shardSelector (a kube-apiserver without the ShardedListAndWatch gate), by verb.", "verb"),
		rulesLoaded: r.NewCounterVec("ctrlmesh_proxy_rules_loads_total",
			"Rules offered to the proxy, by result (applied, refused).", "result"),
		rulesInfo: r.NewGaugeVec("ctrlmesh_proxy_rules_info",
			"The rules in force: 1 for the enforced hash, routing generation, shard and mode.", "hash", "generation", "shard", "mode"),
		validityLapses: r.NewCounter("ctrlmesh_proxy_validity_lapses_total",
			"Times the rules' validity (Fleet scope) ran out without a renewal, so the proxy stopped serving its shard."),
		policyDecisions: r.NewCounterVec("ctrlmesh_proxy_policy_decisions_total",
			"Requests a traffic-policy rule decided, by rule kind (rateLimit, breaker, deny, fault), policy, rule and verdict (pass, rate-limited, breaker-open, denied, aborted).", "kind", "policy", "rule", "verdict"),
		faultsInjected: r.NewCounterVec("ctrlmesh_proxy_faults_injected_total",
			"Faults injected, by FaultInjection, fault and effect (delay, abort).", "policy", "fault", "effect"),
		forwardRequests: r.NewCounterVec("ctrlmesh_proxy_forward_requests_total",
			"External requests the forward proxy handled, by method (CONNECT for HTTPS tunnels; other for unusual methods) and outcome (forwarded, tunneled, failed, policy, refused, unavailable). Their policy decisions and faults count in ctrlmesh_proxy_policy_decisions_total and ctrlmesh_proxy_faults_injected_total, as API requests' do.", "method", "outcome"),
		isolated: r.NewCounter("ctrlmesh_proxy_isolation_refusals_total",
			"Requests refused because their namespace is outside the operator's namespace isolation (or its labels are not confirmed)."),
		insideNamespaces: r.NewGauge("ctrlmesh_proxy_isolation_namespaces",
			"Namespaces confirmed inside the operator's namespace isolation (0 while their labels cannot be confirmed)."),
	}
}
