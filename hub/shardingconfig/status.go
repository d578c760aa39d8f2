package shardingconfig

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
)

// DefaultStatusBytesPerSecond is how many bytes of ShardingConfig status
// the hub writes per second at most, all its configs together, unless a
// write says something new (see writeStatus).
//
// Why: status.placement lists every shard in every member, as one atomic
// list, so every write of a status carries all of it to etcd and to every
// watcher: about 380 KB a config at 1000 members of 4 pods each. Written
// at each member's report, a rollout over N members would cost O(N²)
// bytes: at 200 members x 20 configs, 745 writes were 61 MB of request
// bodies and 119 MB of watch events (make bench-scale). Spaced in
// proportion to their size, a small fleet's status (a few KB) still
// follows within milliseconds, and one of 380 KB every 1.5 s at most
// (249 writes of 20 such configs over a 14-minute rollout). The rate is
// the hub's, not each config's: spaced by each config's bytes alone, 30
// configs of one namespace at 300 members wrote 1,500 statuses (199.5 MB)
// where their reconciles were quicker, and were Ready 1.23x later than
// with 413 slower writes (make bench-scale -namespace).
const DefaultStatusBytesPerSecond = 256 << 10

// writeStatus writes sc's status from the outcome and the canary's
// progress, when it changed, and returns the status: sc's cached status
// holds no placement (CacheTransform), so whether the placement changed is
// judged against written, what the hub knows the API server holds. A
// change that is only the placement's detail (a shard's pods or health,
// the counts, a condition's message) waits until the config's last
// write's bytes have passed at the status rate, and for its turn in the
// hub's (statusWrites.wait); it returns how long then, for the caller to
// come back. A new observed generation, canary step or condition status
// or reason is written at once: those are what users and the canary's
// own progress wait on.
func (r *Reconciler) writeStatus(ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig, out *outcome, canary *ctrlmeshv1alpha1.CanaryStatus, written writtenPlacement) (*ctrlmeshv1alpha1.ShardingConfigStatus, time.Duration, error) {
	status := sc.Status.DeepCopy()
	status.ObservedGeneration = sc.Generation
	status.Canary = canary.DeepCopy()
	// An invalid spec is placed nowhere new: the API server keeps the last
	// placement.
	next := written
	if out.invalid != nil {
		setConditions(status, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonInvalidSpec, out.invalid.Error(), sc.Generation)
	} else {
		status.Placement = placementStatus(sc, out)
		next.digest, next.canaryHealthy = digestPlacement(status.Placement), canaryHealthy(status.Placement)
		status.Clusters, status.Shards, status.ReadyShards = 0, int32(len(status.Placement)), 0
		for _, m := range out.members {
			if m.usable() {
				status.Clusters++
			}
		}
		for _, p := range status.Placement {
			if p.State == ctrlmeshv1alpha1.ShardServing && p.Health == ctrlmeshv1alpha1.ShardHealthy {
				status.ReadyShards++
			}
		}
		reason, message := degraded(sc, out)
		switch {
		case reason != "":
			setConditions(status, metav1.ConditionFalse, reason, message, sc.Generation)
		case status.ReadyShards < status.Shards || status.Shards == 0:
			setConditions(status, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonShardsNotReady,
				fmt.Sprintf("%d of %d shards serve and are healthy", status.ReadyShards, status.Shards), sc.Generation)
		default:
			setConditions(status, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonAllShardsServing,
				fmt.Sprintf("%d shards in %d clusters serve every bucket", status.Shards, status.Clusters), sc.Generation)
		}
	}
	placed := next.digest != written.digest
	rest := *status
	rest.Placement = nil
	if !placed && equality.Semantic.DeepEqual(&sc.Status, &rest) {
		return status, 0, nil
	}
	key := client.ObjectKeyFromObject(sc)
	now := r.Clock.Now()
	if !newsIn(&sc.Status, status) || !r.statusWrites.newsSinceLast(key, status) {
		if wait := r.statusWrites.wait(key, now, r.StatusBytesPerSecond); wait > 0 {
			return status, wait, nil
		}
	}
	original := sc.DeepCopy()
	sc.Status = rest
	data, err := client.MergeFrom(original).Data(sc)
	if err == nil && placed {
		data, err = withPlacement(data, status.Placement)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("computing the status patch: %w", err)
	}
	if err := r.Client.Status().Patch(ctx, sc, client.RawPatch(types.MergePatchType, data)); err != nil {
		return nil, 0, fmt.Errorf("writing the status: %w", err)
	}
	next.resourceVersion, next.before = sc.ResourceVersion, original.ResourceVersion
	r.statusWrites.wrote(key, now, len(data), r.StatusBytesPerSecond, status, next)
	return status, 0, nil
}

// withPlacement adds placement to a merge patch of a ShardingConfig's
// status, whole: the placement is an atomic list, and the patch's
// original had none (the cache holds none), so that the patch computed
// would not remove a placement that is now empty. The patch's body is
// what the write costs: the placement is in it whole whenever any of it
// changed.
func withPlacement(patch []byte, placement []ctrlmeshv1alpha1.ShardPlacement) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(patch, &doc); err != nil {
		return nil, err
	}
	var status map[string]json.RawMessage
	if raw, ok := doc["status"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &status); err != nil {
			return nil, err
		}
	}
	if status == nil {
		status = map[string]json.RawMessage{}
	}
	// None is null, which removes the field.
	raw, err := json.Marshal(placement)
	if err != nil {
		return nil, err
	}
	status["placement"] = raw
	if doc == nil {
		doc = map[string]json.RawMessage{}
	}
	if doc["status"], err = json.Marshal(status); err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

// CacheTransform is the hub's cache transform of ShardingConfigs: without
// their managedFields and without their status's placement. A config's
// placement lists every shard of every member: about 4,000 rows, 744 KB
// decoded, a config at 1000 members, 75 MB of the hub's heap at 100 such
// configs, and each reconcile copied it three times (the config read from
// the cache, the canary's and the status's starting points). The hub
// writes the placement and needs of it only what it remembers as it
// writes (writtenPlacement); who shows it reads it from the API server
// (placementmap).
func CacheTransform(obj any) (any, error) {
	obj, err := cache.TransformStripManagedFields()(obj)
	if err != nil {
		return obj, err
	}
	if sc, ok := obj.(*ctrlmeshv1alpha1.ShardingConfig); ok {
		sc.Status.Placement = nil
	}
	return obj, nil
}

// writtenPlacement is what the hub knows of the placement a config's
// status holds on the API server, which its cache does not hold
// (CacheTransform): enough to tell whether a placement computed differs,
// and whether the canary shard was serving and healthy.
type writtenPlacement struct {
	digest        uint64
	canaryHealthy bool
	// resourceVersion is the config's version whose placement this is;
	// before is the version the cache held when the hub wrote it, which
	// the cache may still hold for a while. Any other version may have a
	// placement someone else wrote: the hub reads it again.
	resourceVersion, before string
}

// placementSeed seeds digestPlacement: digests are compared within one
// process only.
var placementSeed = maphash.MakeSeed()

// digestPlacement is a digest of every field of placement, nil and empty
// lists alike, as the API server returns them.
func digestPlacement(placement []ctrlmeshv1alpha1.ShardPlacement) uint64 {
	var h maphash.Hash
	h.SetSeed(placementSeed)
	var n [8]byte
	length := func(l int) {
		binary.LittleEndian.PutUint64(n[:], uint64(l))
		_, _ = h.Write(n[:])
	}
	str := func(s string) {
		length(len(s))
		_, _ = h.WriteString(s)
	}
	list := func(ss []string) {
		length(len(ss))
		for _, s := range ss {
			str(s)
		}
	}
	length(len(placement))
	for _, p := range placement {
		str(p.Shard)
		str(p.Cluster)
		list(p.Pods)
		str(p.Leader)
		str(p.Buckets)
		list(p.Namespaces)
		var canary byte
		if p.Canary {
			canary = 1
		}
		_ = h.WriteByte(canary)
		str(p.Subset)
		str(string(p.State))
		str(string(p.Health))
	}
	return h.Sum64()
}

// canaryHealthy reports whether placement has its canary shard serving
// and healthy.
func canaryHealthy(placement []ctrlmeshv1alpha1.ShardPlacement) bool {
	return slices.ContainsFunc(placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
		return p.Canary && p.State == ctrlmeshv1alpha1.ShardServing && p.Health == ctrlmeshv1alpha1.ShardHealthy
	})
}

// writtenPlacement returns what the API server's status of sc holds as
// placement: as the hub last wrote it, when sc is the version it wrote or
// the one before; else read from the API server, and remembered.
func (r *Reconciler) writtenPlacement(ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig) (writtenPlacement, error) {
	key := client.ObjectKeyFromObject(sc)
	if p, ok := r.statusWrites.placement(key); ok && (sc.ResourceVersion == p.resourceVersion || sc.ResourceVersion == p.before) {
		return p, nil
	}
	var live ctrlmeshv1alpha1.ShardingConfig
	if err := r.Reader.Get(ctx, key, &live); err != nil {
		return writtenPlacement{}, fmt.Errorf("reading the placement of the status from the API server (the cache holds none): %w", err)
	}
	p := writtenPlacement{
		digest: digestPlacement(live.Status.Placement), canaryHealthy: canaryHealthy(live.Status.Placement),
		resourceVersion: live.ResourceVersion, before: sc.ResourceVersion,
	}
	r.statusWrites.learn(key, p)
	return p, nil
}

// newsIn reports whether next says something the status before did not
// beyond the placement's detail: an observed generation, the canary's
// progress, a condition's status or reason.
func newsIn(before, next *ctrlmeshv1alpha1.ShardingConfigStatus) bool {
	if before.ObservedGeneration != next.ObservedGeneration || !equality.Semantic.DeepEqual(before.Canary, next.Canary) ||
		len(before.Conditions) != len(next.Conditions) {
		return true
	}
	for _, c := range next.Conditions {
		old := meta.FindStatusCondition(before.Conditions, c.Type)
		if old == nil || old.Status != c.Status || old.Reason != c.Reason {
			return true
		}
	}
	return false
}

// statusWrites remembers, per ShardingConfig, when the hub last wrote its
// status, the bytes it wrote and what newsIn reads of it; and when the
// hub's status rate is free again, all configs' writes together.
type statusWrites struct {
	mu   sync.Mutex
	last map[types.NamespacedName]statusWrite
	// placements is what the API server holds of each config's
	// placement, as far as the hub knows (writtenPlacement).
	placements map[types.NamespacedName]writtenPlacement
	// free is when the writes so far, and the turns taken, have passed at
	// the rate.
	free time.Time
}

type statusWrite struct {
	at    time.Time
	bytes int
	// status is the status written, without its placement (newsIn does
	// not read it; it is the bulk of a status).
	status ctrlmeshv1alpha1.ShardingConfigStatus
	// turn is the config's turn at the hub's rate for its next write,
	// from turn.from until turn.to; zero until it waits for one.
	turn struct{ from, to time.Time }
}

// spacing is how long bytes take at bytesPerSecond.
func spacing(bytes, bytesPerSecond int) time.Duration {
	return time.Duration(float64(bytes) / float64(bytesPerSecond) * float64(time.Second))
}

// newsSinceLast reports whether next says something the status last
// written did not (newsIn), or none was written. The cache may not hold
// the last write yet: against an older status a detail reads as news, and
// the hub wrote two statuses 6 ms apart where 336 ms were due
// (TestStatusWritesSpacedBySize under -race).
func (s *statusWrites) newsSinceLast(config types.NamespacedName, next *ctrlmeshv1alpha1.ShardingConfigStatus) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	last, ok := s.last[config]
	return !ok || newsIn(&last.status, next)
}

// wait is how long config's status waits, at now, before its next write:
// until its last write's bytes have passed at bytesPerSecond, and until
// its turn at the hub's rate. Where it must wait, it takes the next turn
// free, as long as its last write, so that the configs waiting write one
// after the other as the rate allows; waking together, each would
// reconcile to find the rate taken by another.
func (s *statusWrites) wait(config types.NamespacedName, now time.Time, bytesPerSecond int) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	last, ok := s.last[config]
	if !ok {
		return 0
	}
	if turn := last.turn; !turn.from.IsZero() && now.Before(turn.to) {
		return max(turn.from.Sub(now), 0)
	}
	// No turn, or one that passed unused: nothing was left to write then.
	last.turn.from, last.turn.to = time.Time{}, time.Time{}
	from := last.at.Add(spacing(last.bytes, bytesPerSecond))
	if s.free.After(from) {
		from = s.free
	}
	if from.After(now) {
		last.turn.from, last.turn.to = from, from.Add(spacing(last.bytes, bytesPerSecond))
		s.free = last.turn.to
	}
	s.last[config] = last
	return max(from.Sub(now), 0)
}

// wrote remembers a write of config's status, and the placement the API
// server holds after it; and takes its bytes from the hub's rate unless
// the write is in the config's turn, which took them.
func (s *statusWrites) wrote(config types.NamespacedName, at time.Time, bytes, bytesPerSecond int, status *ctrlmeshv1alpha1.ShardingConfigStatus, placement writtenPlacement) {
	written := *status
	written.Placement = nil
	written = *written.DeepCopy()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		s.last = map[types.NamespacedName]statusWrite{}
	}
	if turn := s.last[config].turn; turn.from.IsZero() || at.Before(turn.from) || !at.Before(turn.to) {
		s.free = maxTime(s.free, at).Add(spacing(bytes, bytesPerSecond))
	}
	s.last[config] = statusWrite{at: at, bytes: bytes, status: written}
	s.learnLocked(config, placement)
}

// placement is what the hub knows of the placement the API server holds
// for config; false when it knows nothing.
func (s *statusWrites) placement(config types.NamespacedName) (writtenPlacement, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.placements[config]
	return p, ok
}

// learn remembers the placement the API server holds for config.
func (s *statusWrites) learn(config types.NamespacedName, placement writtenPlacement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.learnLocked(config, placement)
}

func (s *statusWrites) learnLocked(config types.NamespacedName, placement writtenPlacement) {
	if s.placements == nil {
		s.placements = map[types.NamespacedName]writtenPlacement{}
	}
	s.placements[config] = placement
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// forget drops what was remembered of a deleted config.
func (s *statusWrites) forget(config types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.last, config)
	delete(s.placements, config)
}

// maxNamesInMessage is how many names a condition's message lists: the
// message says what to look at, and the API server refuses a condition
// message past 32768 bytes (metav1.Condition), which naming every waiting
// pod of 1000 members passed: 148 status writes refused at 1000 members x
// 20 configs (make bench-scale), the configs' status stuck meanwhile.
const maxNamesInMessage = 10

// maxMessageBytes is metav1.Condition's bound on a message.
const maxMessageBytes = 32768

// listNames joins at most maxNamesInMessage names, and says how many more
// there are.
func listNames(names []string) string {
	if len(names) <= maxNamesInMessage {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:maxNamesInMessage], ", "), len(names)-maxNamesInMessage)
}

// boundMessage cuts message to maxMessageBytes, at a rune's start: what
// it quotes (a member's own condition message, many overlapping configs)
// can pass the bound the names alone keep.
func boundMessage(message string) string {
	if len(message) <= maxMessageBytes {
		return message
	}
	const more = " …"
	cut := maxMessageBytes - len(more)
	for cut > 0 && !utf8.RuneStart(message[cut]) {
		cut--
	}
	return message[:cut] + more
}

// setConditions sets Ready and Degraded: Ready with the given status,
// reason and message; Degraded True with the same reason when Ready is
// False for a reason other than shards still starting, False otherwise.
func setConditions(status *ctrlmeshv1alpha1.ShardingConfigStatus, ready metav1.ConditionStatus, reason, message string, generation int64) {
	message = boundMessage(message)
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: ctrlmeshv1alpha1.ConditionReady, Status: ready, Reason: reason, Message: message, ObservedGeneration: generation,
	})
	degraded := metav1.Condition{
		Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonAsExpected,
		Message: "nothing keeps the ShardingConfig from being served", ObservedGeneration: generation,
	}
	if ready == metav1.ConditionFalse && reason != ctrlmeshv1alpha1.ReasonShardsNotReady {
		degraded.Status, degraded.Reason, degraded.Message = metav1.ConditionTrue, reason, message
	}
	meta.SetStatusCondition(&status.Conditions, degraded)
}

// degraded is the first thing that keeps sc from being fully served, if any.
func degraded(sc *ctrlmeshv1alpha1.ShardingConfig, out *outcome) (reason, message string) {
	if len(out.members) == 0 {
		return ctrlmeshv1alpha1.ReasonNoClusters, "no accepted member cluster matches spec.clusters"
	}
	for _, name := range slices.Sorted(maps.Keys(out.members)) {
		// The member's proxies refuse the rules (a label-mode cluster
		// cannot express buckets plus single namespaces, say).
		if rep := out.members[name].report; rep != nil {
			if c := rep.RulesApplied; c != nil && c.Status == metav1.ConditionFalse {
				return ctrlmeshv1alpha1.ReasonInvalidSpec, fmt.Sprintf("cluster %s refuses the rules: %s", name, c.Message)
			}
		}
	}
	var unavailable []string
	for _, name := range slices.Sorted(maps.Keys(out.members)) {
		if c := out.members[name].cluster; !out.members[name].usable() {
			// Why, as the ManagedCluster's conditions say it: no fresh
			// heartbeat, or Karmada does not apply Works there.
			switch {
			case !c.Accepted:
				name += " (not accepted)"
			case c.Reason != "":
				name += " (" + c.Reason + ")"
			}
			unavailable = append(unavailable, name)
		}
	}
	if len(unavailable) > 0 {
		return ctrlmeshv1alpha1.ReasonClusterUnavailable, fmt.Sprintf("clusters not usable keep their last rules and get no new ones (see each ManagedCluster's conditions): %s", listNames(unavailable))
	}
	if message := overlapMessage(out.overlaps); message != "" {
		return ctrlmeshv1alpha1.ReasonSelectorOverlap, message
	}
	if len(out.unproxied) > 0 {
		names := make([]string, 0, len(out.unproxied))
		for _, p := range out.unproxied {
			names = append(names, p.String())
		}
		return ctrlmeshv1alpha1.ReasonPodsWithoutProxy, fmt.Sprintf("ready pods whose ctrlmesh proxy has not reported get no buckets, and see every shard's objects if they run without one: %s; "+
			"delete a pod admitted without the sidecar so that it is created again with the proxy", listNames(names))
	}
	for _, d := range out.domains {
		if !slices.ContainsFunc(d.pods, func(p placement.Pod) bool { return p.Ready && !p.Canary && p.Subset == "" }) {
			return ctrlmeshv1alpha1.ReasonNoCandidatePods, fmt.Sprintf("no ready pod matches the selector in %s", listNames(d.clusters))
		}
	}
	for _, d := range out.domains {
		if d.step.Table.HasPending() {
			waiting := make([]string, 0, len(d.step.WaitingFor))
			for _, p := range d.step.WaitingFor {
				waiting = append(waiting, p.String())
			}
			return ctrlmeshv1alpha1.ReasonHandoverPending, fmt.Sprintf("buckets move in %s once these proxies enforce generation %d: %s",
				listNames(d.clusters), d.step.Table.Generation, listNames(waiting))
		}
	}
	return "", ""
}

// placementStatus lists every shard of every domain with its leader, state
// and health as the members report them.
func placementStatus(sc *ctrlmeshv1alpha1.ShardingConfig, out *outcome) []ctrlmeshv1alpha1.ShardPlacement {
	var list []ctrlmeshv1alpha1.ShardPlacement
	for _, d := range out.domains {
		table := d.step.Table
		for _, rs := range table.Shards {
			p := ctrlmeshv1alpha1.ShardPlacement{
				Shard: rs.ID, Cluster: rs.Cluster, Buckets: rs.Buckets.String(), Namespaces: slices.Clone(rs.Namespaces), Canary: rs.Canary, Subset: rs.Subset,
				State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthUnknown,
			}
			if p.Cluster == "" && len(d.clusters) == 1 {
				p.Cluster = d.clusters[0]
			}
			if !rs.PendingBuckets.IsEmpty() || len(rs.PendingNamespaces) > 0 {
				p.State = ctrlmeshv1alpha1.ShardPending
			}
			if rs.Buckets.IsEmpty() && len(rs.Namespaces) == 0 && p.State != ctrlmeshv1alpha1.ShardPending {
				p.State = ctrlmeshv1alpha1.ShardDraining
			}
			allAcked, allReady := true, true
			for _, id := range rs.Pods {
				p.Pods = append(p.Pods, id.Name)
				m := out.members[id.Cluster]
				pod, reported := m.pod(id.Name)
				allReady = allReady && reported && pod.Ready
				allAcked = allAcked && m.enforces(id.Name, table.Generation)
			}
			if m := out.members[p.Cluster]; m != nil && m.report != nil {
				for _, l := range m.report.Leaders {
					if l.Shard == rs.ID {
						p.Leader = l.Pod
					}
				}
				led := sc.Spec.Controller == nil || slices.Contains(p.Pods, p.Leader)
				if len(rs.Pods) > 0 && allAcked && allReady && led {
					p.Health = ctrlmeshv1alpha1.ShardHealthy
				} else {
					p.Health = ctrlmeshv1alpha1.ShardUnhealthy
				}
			}
			if !allAcked && p.State == ctrlmeshv1alpha1.ShardServing {
				p.State = ctrlmeshv1alpha1.ShardPending
			}
			list = append(list, p)
		}
	}
	return list
}

// advanceCanary keeps the canary's healthy-since time, judged by what the
// last placement achieved (healthy: the placement written has the canary
// shard serving and healthy), and moves to the next step once the canary
// shard has been healthy for minHealthySeconds. It returns when to look
// again.
func (r *Reconciler) advanceCanary(sc *ctrlmeshv1alpha1.ShardingConfig, status *ctrlmeshv1alpha1.ShardingConfigStatus, healthy bool, now time.Time) time.Duration {
	spec := sc.Spec.Canary
	if spec == nil {
		status.Canary = nil
		return 0
	}
	if status.Canary == nil {
		status.Canary = &ctrlmeshv1alpha1.CanaryStatus{}
	}
	if !healthy {
		status.Canary.HealthySince = nil
		return 0
	}
	if status.Canary.HealthySince == nil {
		status.Canary.HealthySince = &metav1.Time{Time: now}
	}
	last := int32(len(spec.Steps) - 1)
	if status.Canary.Step >= last {
		return 0
	}
	due := status.Canary.HealthySince.Add(time.Duration(spec.MinHealthySeconds) * time.Second)
	if now.Before(due) {
		return max(due.Sub(now), time.Second)
	}
	status.Canary.Step++
	status.Canary.HealthySince = nil
	r.Recorder.Eventf(sc, corev1.EventTypeNormal, ctrlmeshv1alpha1.ReasonCanaryAdvanced, "The canary shard was healthy for %ds: step %d of %d", spec.MinHealthySeconds, status.Canary.Step+1, len(spec.Steps))
	return 0
}
