// Command fleetbench measures ctrlmesh end to end on a local fleet (package
// localfleet: real kube-apiservers and etcds, the hub and one agent per
// member in this process, each operator pod a ctrlmesh-proxy and a
// demo-operator process). It prints, from one run, three figures next to
// their goals:
//
//  1. Memory. One member in range mode holds -objects ConfigMaps (default
//     20,000) labeled for the demo operator, each with a -payload-byte data
//     value, over -namespaces namespaces whose names are picked with
//     sharding.Scheme.Bucket so that every one of the 32 buckets holds as
//     many of them as possible (names differing only in a suffix otherwise
//     crowd into few buckets). The operator's resident memory (VmRSS, the
//     peak VmHWM, and VmRSS's private and file parts RssAnon and RssFile,
//     from /proc/<pid>/status; its proxy's VmRSS too) is read in three states,
//     each time once the operator has reconciled every object it serves and
//     its reconcile records have been quiet for -settle:
//     an idle pod serving all 32 buckets before any ConfigMap exists (the
//     fixed cost of the process), one pod serving all 32 buckets, and -pods
//     fresh pods (default 4) sharing them. The goal is each sharded pod at
//     most 0.35 x the single pod. "Reconciled" is read from the operator's
//     own --record-file: every object of the pod's buckets has a record
//     with outcome written or unchanged. The ConfigMaps are created without
//     the operator's annotations: the single pod writes its reconciled-by
//     and data-hash annotations on every one of them, and each sharded pod
//     then rewrites the reconciled-by annotation (naming the single pod) of
//     the objects of its buckets; that is the operator's real work. The
//     operators run with --kube-api-qps=-operator-qps (default 200) and
//     --kube-api-burst twice that, instead of the demo operator's 20/30, so
//     that the single pod's 20,000 first writes take a couple of minutes.
//
//  2. Edit to enforcement. Two members, PerCluster scope, -pods-per-member
//     pods (default 2) in each. Each of -edits edits (default 20) of the
//     ShardingConfig adds or removes a second resource (secrets) in
//     spec.limits[0].relateResources: every pod's rules change, no bucket
//     moves. The time is from just before the Update call to the moment the
//     last proxy of both members reports, in its ShardRoute's
//     status.pods[].appliedRulesHash, the spec.rulesHash of the route
//     version carrying the new limits (the hub hashes each route spec,
//     pkg/route.RulesHash, and a proxy reports a hash only once it
//     enforces those rules and the operator has relisted every resource
//     whose selection they changed; see
//     proxy.Proxy.Applied). It is observed with informers on the
//     ShardRoutes of both members, so the timestamp is that of the watch
//     event, not of a poll; the time the new route reached both members
//     is printed too. Between edits the benchmark waits, untimed, for the
//     ShardingConfig to be Ready again and every member at rest; the edits
//     otherwise follow each other at once. The operator watches only
//     ConfigMaps, whose selection these edits leave alone, so the proxy
//     keeps its watch open (a change of the selection would end it, and
//     client-go's reflectors back off longer after each relist, up to
//     30 s); the samples are printed in edit order.
//
//     With -karmada (the default) the edits are timed on a second fleet
//     too, running beside the first: its hub cluster is a Karmada control
//     plane (localfleet.Options.Karmada: karmada-aggregated-apiserver and
//     karmada-controller-manager), member1 joined to Karmada in push mode
//     (karmada-controller-manager's execution controller applies its
//     Work), member2 in pull mode (karmada-agent in the member does), the
//     hub with Karmada's execution finalizer and the ctrlmesh agents in
//     Karmada mode (applying nothing; Karmada's work-status controller
//     reflects the ShardRoute's status into the Work). The fleets are
//     edited in turn, one edit each, so that both see the same load; the
//     report gives both percentiles and their ratio. For each member and
//     edit it also times the stages: the hub's Work carrying the new route,
//     the member's ShardRoute carrying it (the Work applied), every proxy
//     of the member enforcing it, and the Work's status reporting that
//     (watching the Works on the hub), and counts the route versions each
//     member received from the edit until the fleet settled: one, as the
//     edits move no bucket, unless the hub changed the placement after it.
//     The goal is p99 <= 1 s standalone, 1.5 s with Karmada.
//
//  3. Failover, run before the edits so that its rule changes (buckets
//     moving, watches relisting) do not overlap them. In the same fleet a
//     pod is killed (localfleet.KillPod:
//     SIGKILL to its proxy, then its operator, then the Pod object is
//     deleted) -kills times (default 3), alternating members, with a
//     replacement pod started and the fleet settled after each kill. The time
//     is from just before the kill to the watch event after which every
//     bucket the killed pod served is, in its member's ShardRoute, in the
//     buckets (not pending) of a shard with a surviving pod that reports
//     that route version's rules hash and holds the shard's leader-election
//     Lease (<leaderElectionName>---<shard>, holder identity = pod name).
//     The goal is the demo operator's lease duration as localfleet starts
//     it (localfleet.OperatorLeaseDuration, 8 s) plus 3 s.
//
// The memory fleet and the edit/failover fleet are separate, so that the
// 20,000 ConfigMaps do not load the API servers while latencies are taken.
// Progress goes to stderr with the seconds since the start; the figures to
// stdout. A missed goal is reported as MISS and does not change the exit
// status: only an error exits non-zero.
//
// Run it from the repository root with `make bench-fleet` (after make build
// and make tools), passing flags as BENCH_ARGS:
//
//	make bench-fleet BENCH_ARGS='-objects=5000 -edits=5'
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ctrlmesh/ctrlmesh/test/bench/internal/benchstat"
)

// options are the command's flags.
type options struct {
	binDir        string
	phases        []string
	objects       int
	namespaces    int
	payload       int
	pods          int
	workers       int
	operatorQPS   int
	settle        time.Duration
	edits         int
	kills         int
	podsPerMember int
	karmada       bool
	timeout       time.Duration
	keep          bool
}

var allPhases = []string{"memory", "edit", "failover"}

func parseFlags(args []string, output io.Writer) (options, error) {
	var o options
	var phases string
	fs := flag.NewFlagSet("fleetbench", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&o.binDir, "bin-dir", os.Getenv("CTRLMESH_TEST_ASSETS"), "directory with kube-apiserver, etcd (make tools), ctrlmesh-proxy and demo-operator (make build); default $CTRLMESH_TEST_ASSETS, else bin/ of the checkout")
	fs.StringVar(&phases, "phases", strings.Join(allPhases, ","), "comma-separated phases to run: memory, edit, failover")
	fs.IntVar(&o.objects, "objects", 20000, "managed ConfigMaps in the memory phase")
	fs.IntVar(&o.namespaces, "namespaces", 160, "namespaces the ConfigMaps spread over, as evenly over the 32 buckets as their number allows: a multiple of 32 puts as many in each, so that pods holding equal buckets hold equal objects")
	fs.IntVar(&o.payload, "payload", 256, "bytes of data in each ConfigMap")
	fs.IntVar(&o.pods, "pods", 4, "pods sharing the ConfigMaps in the memory phase's sharded measurement")
	fs.IntVar(&o.workers, "workers", 8, "concurrent writers creating the ConfigMaps")
	fs.IntVar(&o.operatorQPS, "operator-qps", 200, "client-side rate limit of every demo operator (--kube-api-qps; --kube-api-burst is twice it)")
	fs.DurationVar(&o.settle, "settle", 5*time.Second, "how long an operator's reconcile records must stay quiet before its memory is read")
	fs.IntVar(&o.edits, "edits", 20, "ShardingConfig edits timed to enforcement")
	fs.IntVar(&o.kills, "kills", 3, "pods killed for the failover time")
	fs.IntVar(&o.podsPerMember, "pods-per-member", 2, "operator pods in each of the two members of the edit and failover phases")
	fs.BoolVar(&o.karmada, "karmada", true, "also time the edits on a second fleet whose hub is a Karmada control plane (member1 joined in push mode, member2 in pull mode), alternating with the standalone fleet's")
	fs.DurationVar(&o.timeout, "timeout", 20*time.Minute, "bound on the whole run")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (kubeconfigs, logs, reconcile records) even on success")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(output, "usage: fleetbench [flags]\n\nMeasures ctrlmesh on a local fleet: operator memory 1 pod vs N pods, ShardingConfig edit to enforcement (standalone and with Karmada applying the Works), failover after a pod kill.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	for _, p := range strings.Split(phases, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !slices.Contains(allPhases, p) {
			return o, fmt.Errorf("-phases: unknown phase %q (want memory, edit, failover)", p)
		}
		if !slices.Contains(o.phases, p) {
			o.phases = append(o.phases, p)
		}
	}
	switch {
	case len(o.phases) == 0:
		return o, errors.New("-phases names no phase")
	case o.objects < 1 || o.namespaces < 1 || o.namespaces > o.objects:
		return o, errors.New("-objects and -namespaces must be at least 1, with no more namespaces than objects")
	case o.payload < 0 || o.payload > 512*1024:
		return o, errors.New("-payload must be between 0 and 524288")
	case o.pods < 2 || o.pods > 32:
		return o, errors.New("-pods must be between 2 and 32")
	case o.workers < 1:
		return o, errors.New("-workers must be at least 1")
	case o.operatorQPS < 1:
		return o, errors.New("-operator-qps must be at least 1")
	case o.settle < 0:
		return o, errors.New("-settle must not be negative")
	case o.edits < 1 || o.kills < 1:
		return o, errors.New("-edits and -kills must be at least 1")
	case o.podsPerMember < 2 || o.podsPerMember > 16:
		return o, errors.New("-pods-per-member must be between 2 and 16 (a kill needs a survivor)")
	case o.timeout <= 0:
		return o, errors.New("-timeout must be positive")
	}
	return o, nil
}

func (o options) runs(phase string) bool { return slices.Contains(o.phases, phase) }

// operatorBurst is the burst the operators' clients get: twice their QPS.
func (o options) operatorBurst() int { return 2 * o.operatorQPS }

func main() { benchstat.Main("fleetbench", parseFlags, run) }
