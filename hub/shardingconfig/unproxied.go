package shardingconfig

import (
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

// proxyReportGrace is how long a ready pod may go without its proxy
// reporting before the hub calls it a pod without a proxy. A proxy reports
// within moments of loading its rules, which its pod's readiness waits for;
// a pod admitted without the sidecar never reports.
const proxyReportGrace = 30 * time.Second

// unproxiedPods tracks, per ShardingConfig, the ready pods whose proxy has
// not reported: since when the hub has seen each so, and whether it has
// told about it (an Event, once per pod). Such a pod is no candidate — it
// would be given buckets it never acknowledges, and stall every handover —
// but it runs the operator without a proxy, reconciling every shard's
// objects, so the hub says so. Memory only: after a hub restart the grace
// starts again.
type unproxiedPods struct {
	mu   sync.Mutex
	seen map[types.NamespacedName]map[route.PodID]*unproxied
}

type unproxied struct {
	since time.Time
	told  bool
}

// observe records the pods of config now ready without a proxy report and
// forgets the others. It returns those past the grace, sorted; those among
// them not told about before, to record an Event for; and when the next
// pod passes the grace (zero for none).
func (u *unproxiedPods) observe(config types.NamespacedName, pods []route.PodID, now time.Time) (overdue, untold []route.PodID, next time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.seen == nil {
		u.seen = map[types.NamespacedName]map[route.PodID]*unproxied{}
	}
	previous := u.seen[config]
	current := make(map[route.PodID]*unproxied, len(pods))
	for _, p := range pods {
		entry, ok := previous[p]
		if !ok {
			entry = &unproxied{since: now}
		}
		current[p] = entry
		due := entry.since.Add(proxyReportGrace)
		switch {
		case !now.Before(due):
			overdue = append(overdue, p)
			if !entry.told {
				entry.told = true
				untold = append(untold, p)
			}
		case next.IsZero() || due.Before(next):
			next = due
		}
	}
	if len(current) == 0 {
		delete(u.seen, config)
	} else {
		u.seen[config] = current
	}
	slices.SortFunc(overdue, route.ComparePodIDs)
	slices.SortFunc(untold, route.ComparePodIDs)
	return overdue, untold, next
}

// forget drops what was seen of a deleted config.
func (u *unproxiedPods) forget(config types.NamespacedName) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.seen, config)
}

// readyWithoutProxy lists the ready pods the members report whose proxy
// has reported no rules hash.
func readyWithoutProxy(members map[string]*member) []route.PodID {
	var out []route.PodID
	for _, name := range slices.Sorted(maps.Keys(members)) {
		m := members[name]
		if m.report == nil {
			continue
		}
		for _, p := range m.report.Pods {
			if p.Ready && p.AppliedRulesHash == "" {
				out = append(out, route.PodID{Cluster: name, Name: p.Name})
			}
		}
	}
	return out
}
