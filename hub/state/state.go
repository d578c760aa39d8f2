// Package state is the hub's working model: what the hub knows of the member
// clusters, of the rules it published to them and of what their agents
// report, kept in an in-memory go-memdb database. The ShardingConfig
// controller reads every input of placement, handover and status from one
// Snapshot of it.
//
// Tables, with the writer of each and the indexes its readers query:
//
//   - clusters, by name: each member's acceptance, availability, labels and
//     heartbeat expiry. The clusters controller writes it from the
//     ManagedClusters, heartbeat Leases and Karmada Clusters. The
//     ShardingConfig controller selects from the accepted clusters (index
//     accepted) and looks clusters up by name to tell whether the model
//     knows every ManagedCluster yet.
//   - published, by (ShardingConfig, cluster): the ShardRoute published, its
//     generation and rules hash, and the last revisions, which map the
//     hashes proxies report to generations, each with when the hub first
//     knew the Work to carry it. The ShardingConfig controller
//     writes it when it publishes (RecordPublish) and when it reads the
//     Works back (ReadBack), and reads it per config (index config).
//   - reports, by (ShardingConfig, cluster): what the member's agent
//     reflected into the Work's status: the candidate pods with their
//     readiness, canary mark, address and the hash of the rules their proxy
//     applied, the shards' leaders, and whether the member applied the
//     rules. The ShardingConfig controller writes it when it reads the
//     Works back, and reads it per config (index config).
//
// The model is a cache. Nothing in it is persisted: on start the clusters
// controller rebuilds the clusters from the API objects, and the
// ShardingConfig controller reads a config's Works back at the start of
// every reconcile of it, before it publishes anything. The rows of a
// ShardingConfig follow its Works: they go when the controller deletes the
// Works of clusters the config no longer selects (a cluster that left is no
// longer selected) and when the config is deleted.
//
// Readers take a Snapshot, a consistent view of every table at one instant
// that later writes do not change. Records returned are copies: callers
// may modify them freely. Records passed in are copied, but for a
// report's parts, which the Store keeps as given (newReport): a report
// must not be modified once given.
package state

import (
	"cmp"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"time"

	"github.com/hashicorp/go-memdb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/intern"
)

// Cluster is what the hub knows of one member cluster.
type Cluster struct {
	// Name of the ManagedCluster, and of the member's execution namespace
	// karmada-es-<Name>.
	Name string
	// Accepted is the ManagedCluster's spec.hubAcceptsClient.
	Accepted bool
	// Available: the member's heartbeat is fresh and, when Karmada has a
	// Cluster object for it, that object is Ready.
	Available bool
	// Labels of the ManagedCluster, which ShardingConfig cluster selectors
	// match.
	Labels map[string]string
	// HeartbeatExpiry is when the last heartbeat runs out, on the hub's
	// clock; zero when the member has none.
	HeartbeatExpiry time.Time
	// Reason tells why the cluster is not available; empty when it is.
	Reason string
	// HeartbeatLapsed: the hub saw no heartbeat of the member recently
	// enough for rules that expire to be valid there still, so its pods
	// serve none of the buckets such rules gave them (see
	// route.LapseBound). A cluster unavailable for another reason
	// (Karmada's Cluster not Ready) may still have pods serving.
	HeartbeatLapsed bool
}

// Usable reports whether placement may give the cluster new rules: it is
// accepted and its heartbeat is fresh. Pods of an unusable cluster count as
// gone.
func (c Cluster) Usable() bool { return c.Accepted && c.Available }

func (c Cluster) clone() Cluster {
	c.Labels = maps.Clone(c.Labels)
	return c
}

func (c Cluster) equal(o Cluster) bool {
	return c.Name == o.Name && c.Accepted == o.Accepted && c.Available == o.Available &&
		maps.Equal(c.Labels, o.Labels) && c.HeartbeatExpiry.Equal(o.HeartbeatExpiry) && c.Reason == o.Reason &&
		c.HeartbeatLapsed == o.HeartbeatLapsed
}

// Revision is one publication of rules.
type Revision struct {
	Generation int64
	RulesHash  string
	// Since is when the hub first knew the Work to carry the revision, on
	// the hub's clock: when it published it, or, for a revision it did not
	// publish itself (its predecessor's, before a restart), when it first
	// read it back. The Work carried it at Since at the latest.
	Since time.Time
}

// same reports whether two revisions are one publication: the same
// generation and rules hash, whenever they were seen.
func (r Revision) same(o Revision) bool {
	return r.Generation == o.Generation && r.RulesHash == o.RulesHash
}

// Published is the rules the hub published for one ShardingConfig to one
// cluster.
type Published struct {
	Config  types.NamespacedName
	Cluster string
	// Revision is the latest publication: Route's routing generation and
	// rules hash.
	Revision
	// History holds the latest publications, newest first, Revision among
	// them, one per generation: a proxy reports the hash of the rules it
	// applied, which may be older than the latest.
	History []Revision
	// Route is the routing of the ShardRoute of the latest publication
	// (routing): its shards, which placement merges back into the
	// published rules, and the policies it carries.
	Route *ctrlmeshv1alpha1.ShardRoute
}

// HistoryLength is how many publications Published.History keeps.
const HistoryLength = 8

// CarriedAt is the newest generation of History that the Work carried at
// t by the hub's knowledge (published at or before t), and when the next
// newer one was published; 0 and zero when it knows of none, or of no
// newer one.
func (p Published) CarriedAt(t time.Time) (generation int64, next time.Time) {
	for _, r := range p.History {
		if !r.Since.After(t) {
			return r.Generation, next
		}
		next = r.Since
	}
	return 0, next
}

// GenerationOf maps the rules hash a proxy reports to the generation it was
// published as; false when the hash is none of History.
func (p Published) GenerationOf(rulesHash string) (int64, bool) {
	for _, r := range p.History {
		if r.RulesHash == rulesHash {
			return r.Generation, true
		}
	}
	return 0, false
}

// Report is what a member's agent last reported for one ShardingConfig,
// through the status of the config's Work for that cluster.
type Report struct {
	Config  types.NamespacedName
	Cluster string
	// RulesApplied is the member ShardRoute's RulesApplied condition; nil
	// until the agent sets it. False: the member's proxies refuse the rules.
	RulesApplied *metav1.Condition
	// Pods are the candidate pods the agent sees, sorted by name.
	Pods []Pod
	// Leaders hold the shards' leader-election locks, sorted by shard.
	Leaders []Leader
	// SubsetNamespaces are, per subset with namespace rules, the member's
	// namespaces they match.
	SubsetNamespaces map[string][]string
}

// Pod is a candidate operator pod, as the member's agent reports it in the
// ShardRoute's status: its name, its address for webhook peer routing,
// readiness, canary mark, subset, and the hash of the rules its proxy has
// applied, its acknowledgement (Published.GenerationOf), empty when it has
// applied none. The agent's own type, so that the model keeps the pods of
// a report as the hub's cache holds them, not a copy (ReadBackReport).
type Pod = ctrlmeshv1alpha1.PodRouteStatus

// Leader is the pod that holds a shard's leader-election lock, as the
// agent reports it.
type Leader = ctrlmeshv1alpha1.ShardLeader

func (r Report) clone() Report {
	if r.RulesApplied != nil {
		r.RulesApplied = r.RulesApplied.DeepCopy()
	}
	if r.Pods != nil {
		pods := make([]Pod, len(r.Pods))
		for i := range r.Pods {
			r.Pods[i].DeepCopyInto(&pods[i])
		}
		r.Pods = pods
	}
	r.Leaders = slices.Clone(r.Leaders)
	if r.SubsetNamespaces != nil {
		namespaces := make(map[string][]string, len(r.SubsetNamespaces))
		for subset, ns := range r.SubsetNamespaces {
			namespaces[subset] = slices.Clone(ns)
		}
		r.SubsetNamespaces = namespaces
	}
	return r
}

// Table and index names.
const (
	clustersTable = "clusters"
	membersTable  = "members"

	idIndex       = "id" // memdb's required primary index
	acceptedIndex = "accepted"
	// configPrefix reads the members table's rows of one config: the
	// prefix of its primary index (config, cluster) with args (config, "").
	// A second index on the config alone cost radix leaves and nodes per
	// row: 0.87 of 4.9 KB a Work (BenchmarkModelBytes), 87 MB at 100,000
	// Works.
	configPrefix = idIndex + "_prefix"
)

// memberRow is the row of the members table, one per ShardingConfig and
// member cluster: what the hub published to the member and what the
// member's agent reported back, plus the fields indexed. Config is
// types.NamespacedName.String(). One row rather than one in each of two
// tables: memdb keeps a radix leaf, node and two channels per row and
// index: 2.7 KB a Work in two tables, 2.2 in one (BenchmarkModelBytes).
type memberRow struct {
	Config  string
	Cluster string
	// Published without its Route, which routing holds.
	Published Published
	routing   routing
	// report is the agent's latest report, nil when none is known. A
	// member has a row once rules were published to it or read back from
	// its Work: a report comes only with them.
	report *Report
	// reportVersion is the resourceVersion of the Work report was read
	// from, "" when not known (ReportSource).
	reportVersion string
}

// published is the row's record, sharing nothing with it.
func (r *memberRow) published() Published {
	p := r.Published
	p.History = slices.Clone(p.History)
	p.Route = r.routing.route(p.Revision)
	return p
}

var schema = &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{
	clustersTable: {
		Name: clustersTable,
		Indexes: map[string]*memdb.IndexSchema{
			idIndex:       {Name: idIndex, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "Name"}},
			acceptedIndex: {Name: acceptedIndex, Indexer: &memdb.BoolFieldIndex{Field: "Accepted"}},
		},
	},
	// Rows keyed by ShardingConfig and cluster, read per ShardingConfig.
	membersTable: {
		Name: membersTable,
		Indexes: map[string]*memdb.IndexSchema{
			idIndex: {Name: idIndex, Unique: true, Indexer: &memdb.CompoundIndex{Indexes: []memdb.Indexer{
				&memdb.StringFieldIndex{Field: "Config"}, &memdb.StringFieldIndex{Field: "Cluster"},
			}}},
		},
	},
}}

// Store is the hub's working model. It is safe for concurrent use: writes
// are serialized, reads never block.
type Store struct {
	db *memdb.MemDB
}

// New returns an empty Store.
func New() (*Store, error) {
	db, err := memdb.NewMemDB(schema)
	if err != nil {
		return nil, fmt.Errorf("state: creating the database: %w", err)
	}
	return &Store{db: db}, nil
}

// write runs fn in a write transaction and commits it unless fn fails.
func (s *Store) write(fn func(txn *memdb.Txn) error) error {
	txn := s.db.Txn(true)
	defer txn.Abort() // a no-op after Commit
	if err := fn(txn); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// UpsertCluster stores c, replacing the record of the same name. It reports
// whether the record changed.
func (s *Store) UpsertCluster(c Cluster) (changed bool, err error) {
	if c.Name == "" {
		return false, errors.New("state: a cluster without a name")
	}
	err = s.write(func(txn *memdb.Txn) error {
		old, err := txn.First(clustersTable, idIndex, c.Name)
		if err != nil {
			return fmt.Errorf("state: reading cluster %q: %w", c.Name, err)
		}
		if old != nil && old.(*Cluster).equal(c) {
			return nil
		}
		row := c.clone()
		if err := txn.Insert(clustersTable, &row); err != nil {
			return fmt.Errorf("state: storing cluster %q: %w", c.Name, err)
		}
		changed = true
		return nil
	})
	return changed, err
}

// DeleteCluster removes the cluster's record and reports whether there was
// one. Its rows in the members table stay until the ShardingConfig
// controller, which owns them, deletes the cluster's Works: the cluster is
// then no longer selected (RetainClusters).
func (s *Store) DeleteCluster(name string) (existed bool, err error) {
	err = s.write(func(txn *memdb.Txn) error {
		n, err := txn.DeleteAll(clustersTable, idIndex, name)
		if err != nil {
			return fmt.Errorf("state: deleting cluster %q: %w", name, err)
		}
		existed = n > 0
		return nil
	})
	return existed, err
}

// RecordPublish records that route was published for config to cluster,
// the hub knowing it written at at. Generations only grow: an older
// generation, or the current one with another hash, is refused; the
// current one with its own hash again is no change (its Since stays).
func (s *Store) RecordPublish(config types.NamespacedName, cluster string, route *ctrlmeshv1alpha1.ShardRoute, at time.Time) error {
	return s.write(func(txn *memdb.Txn) error {
		_, err := recordRoute(txn, config, cluster, route, false, at)
		return err
	})
}

// ReadBack records, in one transaction, what the Work of config for cluster
// carries and reports: route, the ShardRoute it carries, and report, what
// the member's agent reflected into its status (nil when it reflected
// nothing yet, which removes an earlier report), read at at. The report's
// Config and Cluster are set from config and cluster.
//
// The Work is the truth about what was published, with one exception: read
// from a cache, it may not show the hub's own last write yet. A route of a
// generation older than the one recorded is therefore ignored, and ReadBack
// reports the Work as behind; a route of the recorded generation with
// another hash (someone else wrote the Work) replaces the record.
func (s *Store) ReadBack(config types.NamespacedName, cluster string, route *ctrlmeshv1alpha1.ShardRoute, report *Report, at time.Time) (behind bool, err error) {
	kept, err := newReport(config, cluster, report)
	if err != nil {
		return false, err
	}
	err = s.write(func(txn *memdb.Txn) error {
		if behind, err = recordRoute(txn, config, cluster, route, true, at); err != nil {
			return err
		}
		return recordReport(txn, config, cluster, kept, "")
	})
	return behind, err
}

// ReadBackReport records what the member's agent reflected into the Work
// of config for cluster, as ReadBack does, where the rules the Work
// carries are known already: those the Store holds as published to the
// cluster, whose hash is rulesHash. Unless the Store holds rules of that
// hash as the latest published to the cluster, it stores nothing and
// returns ErrNotLatest: the caller then reads the Work's rules back with
// ReadBack. version is the resourceVersion of the Work the report was read
// from (ReportSource).
func (s *Store) ReadBackReport(config types.NamespacedName, cluster, rulesHash, version string, report *Report) error {
	kept, err := newReport(config, cluster, report)
	if err != nil {
		return err
	}
	return s.write(func(txn *memdb.Txn) error {
		raw, err := txn.First(membersTable, idIndex, config.String(), cluster)
		if err != nil {
			return fmt.Errorf("state: reading the rules of %s published to cluster %q: %w", config, cluster, err)
		}
		if raw == nil || raw.(*memberRow).Published.RulesHash != rulesHash {
			return fmt.Errorf("state: the report of cluster %q for %s: rules of hash %q: %w", cluster, config, rulesHash, ErrNotLatest)
		}
		return recordReport(txn, config, cluster, kept, version)
	})
}

// ErrNotLatest: ReadBackReport was given the hash of rules that are not
// the latest the Store holds as published.
var ErrNotLatest = errors.New("not the latest rules published to the cluster")

// recordReport stores report as the latest of cluster for config, read
// from the Work at version ("" when not known), in the row its rules made;
// nil removes the report.
func recordReport(txn *memdb.Txn, config types.NamespacedName, cluster string, report *Report, version string) error {
	raw, err := txn.First(membersTable, idIndex, config.String(), cluster)
	if err != nil {
		return fmt.Errorf("state: reading the row of cluster %q for %s: %w", cluster, config, err)
	}
	if raw == nil {
		return fmt.Errorf("state: a report of cluster %q for %s, which holds no rules of it: this is a bug in the hub (please report it)", cluster, config)
	}
	cur := raw.(*memberRow)
	if report == nil && cur.report == nil && cur.reportVersion == version {
		return nil
	}
	row := *cur
	row.report, row.reportVersion = report, version
	if err := txn.Insert(membersTable, &row); err != nil {
		return fmt.Errorf("state: storing the report of cluster %q for %s: %w", cluster, config, err)
	}
	return nil
}

// recordRoute stores route as the latest published for config to cluster,
// known carried since at. A route older than the one stored, or of its
// generation with another hash, is refused, unless readBack: the older one
// is then ignored (behind), the other hash stored.
func recordRoute(txn *memdb.Txn, config types.NamespacedName, cluster string, route *ctrlmeshv1alpha1.ShardRoute, readBack bool, at time.Time) (behind bool, err error) {
	if route == nil {
		return false, fmt.Errorf("state: rules of %s for cluster %q: no ShardRoute", config, cluster)
	}
	next := Revision{Generation: route.Spec.RoutingGeneration, RulesHash: route.Spec.RulesHash, Since: at}
	if config.Name == "" || cluster == "" || next.Generation < 1 || next.RulesHash == "" {
		return false, fmt.Errorf("state: rules of config %q for cluster %q, generation %d, hash %q: all must be set, the generation at least 1",
			config, cluster, next.Generation, next.RulesHash)
	}
	key := config.String()
	raw, err := txn.First(membersTable, idIndex, key, cluster)
	if err != nil {
		return false, fmt.Errorf("state: reading the rules of %s published to cluster %q: %w", config, cluster, err)
	}
	var history []Revision
	var report *Report
	var reportVersion string
	if raw != nil {
		row := raw.(*memberRow)
		report, reportVersion = row.report, row.reportVersion
		cur := row.Published
		switch {
		case cur.same(next):
			return false, nil
		case readBack && next.Generation < cur.Generation:
			return true, nil
		case !readBack && next.Generation <= cur.Generation:
			return false, fmt.Errorf("state: rules of %s for cluster %q: generation %d hash %q after generation %d hash %q: the generations the hub publishes only grow, so this is a bug in the hub (please report it); the next reconcile publishes again from the Work read back and the model",
				config, cluster, next.Generation, next.RulesHash, cur.Generation, cur.RulesHash)
		}
		// A new slice, one hash per generation: readers may still hold the
		// old one, and a hash replaced at its generation acknowledges
		// nothing any more.
		for _, r := range cur.History {
			if r.Generation < next.Generation && len(history) < HistoryLength-1 {
				history = append(history, r)
			}
		}
	}
	config = internName(config)
	key, cluster = intern.String(key), intern.String(cluster)
	next.RulesHash = intern.String(next.RulesHash)
	row := &memberRow{Config: key, Cluster: cluster, Published: Published{
		Config: config, Cluster: cluster, Revision: next, History: append([]Revision{next}, history...),
	}, routing: newRouting(route), report: report, reportVersion: reportVersion}
	if err := txn.Insert(membersTable, row); err != nil {
		return false, fmt.Errorf("state: storing the rules of %s published to cluster %q: %w", config, cluster, err)
	}
	return false, nil
}

// routing is what the Store keeps of a published ShardRoute: its identity
// (cluster, scope; the generation and rules hash are the row's Revision),
// what placement merges back into the route table (route.Merge: bucket
// count, generation, shards) and the policies it carries
// (hub/policystatus). The rest — selectors, limits, the controller's and
// webhook's settings, and the labels and annotations Karmada's conventions
// put on a manifest read back — is the ShardingConfig's, built into every
// route anew. Keeping the whole route read back from a Work took a
// config's rows for one cluster, rules and report, from 4.0 to 5.6 KB; a
// struct of its own rather than a ShardRoute (600 bytes before its fields)
// takes them from 4.0 to 3.5 KB (BenchmarkModelBytes).
type routing struct {
	typeMeta                 metav1.TypeMeta
	namespace, name, cluster string
	scope                    ctrlmeshv1alpha1.ShardingScope
	buckets                  int32
	shards                   []shard
	policies                 *ctrlmeshv1alpha1.RoutePolicies
}

// shard is what routing keeps of a RouteShard: its ID, buckets and pods,
// and the fields most shards leave empty (rare) behind a pointer, nil when
// all are. A RouteShard is 144 bytes before its strings' and slices'
// contents, four of them 576 bytes a Work; a shard is 64 (BenchmarkModelBytes).
type shard struct {
	id, buckets string
	// pods share one array per routing, each shard's slice capped at its
	// own; nil when the RouteShard's were.
	pods []ctrlmeshv1alpha1.RoutePod
	rare *rareShardFields
}

// rareShardFields are the fields of a RouteShard set only while buckets or
// namespaces move, or for canaries and subsets.
type rareShardFields struct {
	pendingBuckets, subset        string
	namespaces, pendingNamespaces []string
	canary                        bool
}

// noPods stands for a RouteShard's empty, not nil, pods: a routing keeps
// what it was given, which route gives back equal.
var noPods = []ctrlmeshv1alpha1.RoutePod{}

// newRouting is the routing of r, sharing nothing with it, its strings
// canonical (intern).
func newRouting(r *ctrlmeshv1alpha1.ShardRoute) routing {
	out := routing{typeMeta: r.TypeMeta, namespace: intern.String(r.Namespace), name: intern.String(r.Name), cluster: intern.String(r.Spec.Cluster),
		scope: r.Spec.Scope, buckets: r.Spec.Buckets, policies: r.Spec.Policies.DeepCopy()}
	intern.Strings(&out.typeMeta.APIVersion, &out.typeMeta.Kind)
	if r.Spec.Shards == nil {
		return out
	}
	count := 0
	for i := range r.Spec.Shards {
		count += len(r.Spec.Shards[i].Pods)
	}
	pods := make([]ctrlmeshv1alpha1.RoutePod, 0, count)
	out.shards = make([]shard, len(r.Spec.Shards))
	for i := range r.Spec.Shards {
		in := &r.Spec.Shards[i]
		s := &out.shards[i]
		s.id, s.buckets = intern.String(in.ID), intern.String(in.Buckets)
		switch {
		case in.Pods == nil:
		case len(in.Pods) == 0:
			s.pods = noPods
		default:
			from := len(pods)
			for _, p := range in.Pods {
				pods = append(pods, ctrlmeshv1alpha1.RoutePod{Name: intern.String(p.Name), Address: intern.String(p.Address)})
			}
			s.pods = pods[from:len(pods):len(pods)]
		}
		if in.PendingBuckets != "" || in.Subset != "" || in.Namespaces != nil || in.PendingNamespaces != nil || in.Canary {
			s.rare = &rareShardFields{pendingBuckets: intern.String(in.PendingBuckets), subset: intern.String(in.Subset),
				namespaces: slices.Clone(in.Namespaces), pendingNamespaces: slices.Clone(in.PendingNamespaces), canary: in.Canary}
			intern.Slice(s.rare.namespaces)
			intern.Slice(s.rare.pendingNamespaces)
		}
	}
	return out
}

// internName is name with canonical strings (intern): every row of a
// config names it.
func internName(name types.NamespacedName) types.NamespacedName {
	return types.NamespacedName{Namespace: intern.String(name.Namespace), Name: intern.String(name.Name)}
}

// route is the routing as a ShardRoute of revision rev, sharing nothing
// with the record.
func (r routing) route(rev Revision) *ctrlmeshv1alpha1.ShardRoute {
	out := &ctrlmeshv1alpha1.ShardRoute{TypeMeta: r.typeMeta, ObjectMeta: metav1.ObjectMeta{Namespace: r.namespace, Name: r.name},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{Cluster: r.cluster, RoutingGeneration: rev.Generation, RulesHash: rev.RulesHash,
			Scope: r.scope, Buckets: r.buckets, Policies: r.policies.DeepCopy()}}
	if r.shards == nil {
		return out
	}
	out.Spec.Shards = make([]ctrlmeshv1alpha1.RouteShard, len(r.shards))
	for i, s := range r.shards {
		rs := &out.Spec.Shards[i]
		rs.ID, rs.Buckets = s.id, s.buckets
		rs.Pods = slices.Clone(s.pods) // nil for nil, empty for empty
		if s.rare != nil {
			rs.PendingBuckets, rs.Subset, rs.Canary = s.rare.pendingBuckets, s.rare.subset, s.rare.canary
			rs.Namespaces, rs.PendingNamespaces = slices.Clone(s.rare.namespaces), slices.Clone(s.rare.pendingNamespaces)
		}
	}
	return out
}

// newReport checks a report and makes the record the Store keeps: nil for
// no report; else the report's pods, leaders and condition themselves
// where the pods are sorted by name and the leaders by shard, as agents
// write them, and sorted copies where they are not. The Store does not
// copy what it keeps: the hub gives it the parts of its cache's objects,
// which nobody modifies (routework.ViewStatus), and a copy of each
// member's report doubled what the report cost
// (BenchmarkCachedAndModelBytes in hub/shardingconfig).
// Their strings are the cache's canonical copies (propagation's cache
// transform), so the model interns only its own.
func newReport(config types.NamespacedName, cluster string, reported *Report) (*Report, error) {
	if reported == nil {
		return nil, nil
	}
	if config.Name == "" || cluster == "" {
		return nil, fmt.Errorf("state: report of config %q from cluster %q: both must be named", config, cluster)
	}
	report := *reported
	byName := func(a, b Pod) int { return cmp.Compare(a.Name, b.Name) }
	if !slices.IsSortedFunc(report.Pods, byName) {
		report.Pods = slices.Clone(report.Pods)
		slices.SortFunc(report.Pods, byName)
	}
	for i, p := range report.Pods {
		if p.Name == "" {
			return nil, fmt.Errorf("state: a pod of %s in cluster %q without a name", config, cluster)
		}
		// Pods are looked up by name: a second report of one would hide
		// either.
		if i > 0 && report.Pods[i-1].Name == p.Name {
			return nil, fmt.Errorf("state: pod %q of %s in cluster %q reported twice", p.Name, config, cluster)
		}
	}
	byShard := func(a, b Leader) int { return cmp.Compare(a.Shard, b.Shard) }
	if !slices.IsSortedFunc(report.Leaders, byShard) {
		report.Leaders = slices.Clone(report.Leaders)
		slices.SortStableFunc(report.Leaders, byShard)
	}
	report.Config, report.Cluster = internName(config), intern.String(cluster)
	return &report, nil
}

// RetainClusters removes config's rows of every cluster not in keep: the
// controller deleted the Works of clusters the config no longer selects. It
// reports the clusters whose rows it removed, sorted.
func (s *Store) RetainClusters(config types.NamespacedName, keep []string) (removed []string, err error) {
	err = s.write(func(txn *memdb.Txn) error {
		it, err := txn.Get(membersTable, configPrefix, config.String(), "")
		if err != nil {
			return fmt.Errorf("state: reading the rows of %s: %w", config, err)
		}
		// Collected first: deleting while iterating would skip rows.
		for raw := it.Next(); raw != nil; raw = it.Next() {
			if cluster := raw.(*memberRow).Cluster; !slices.Contains(keep, cluster) {
				removed = append(removed, cluster)
			}
		}
		for _, cluster := range removed {
			if _, err := txn.DeleteAll(membersTable, idIndex, config.String(), cluster); err != nil {
				return fmt.Errorf("state: deleting the row of %s for cluster %q: %w", config, cluster, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return removed, nil
}

// DeleteConfig removes every row of config: the ShardingConfig is being
// deleted, or is gone.
func (s *Store) DeleteConfig(config types.NamespacedName) error {
	return s.write(func(txn *memdb.Txn) error {
		if _, err := txn.DeleteAll(membersTable, configPrefix, config.String(), ""); err != nil {
			return fmt.Errorf("state: deleting the rows of %s: %w", config, err)
		}
		return nil
	})
}

// Snapshot is a consistent, read-only view of the Store at one instant.
//
// Lists come sorted by the rows' primary keys (cluster name; config and
// cluster): a config's rows are read by the prefix of their primary key,
// and memdb appends the primary key to the key of every non-unique index.
type Snapshot struct {
	txn *memdb.Txn
}

// Snapshot returns a view of the Store as it is now. It holds no lock and
// needs no release.
func (s *Store) Snapshot() Snapshot {
	return Snapshot{txn: s.db.Txn(false)}
}

// Cluster returns the cluster of that name.
func (v Snapshot) Cluster(name string) (Cluster, bool) {
	raw, err := v.txn.First(clustersTable, idIndex, name)
	mustNot(err)
	if raw == nil {
		return Cluster{}, false
	}
	return raw.(*Cluster).clone(), true
}

// AcceptedClusters returns the clusters the hub accepted, sorted by name:
// those a ShardingConfig may select.
func (v Snapshot) AcceptedClusters() []Cluster {
	it, err := v.txn.Get(clustersTable, acceptedIndex, true)
	mustNot(err)
	var out []Cluster
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*Cluster).clone())
	}
	return out
}

// PublishedOf returns the rules published for config, one record per
// cluster, sorted by cluster.
func (v Snapshot) PublishedOf(config types.NamespacedName) []Published {
	it, err := v.txn.Get(membersTable, configPrefix, config.String(), "")
	mustNot(err)
	var out []Published
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*memberRow).published())
	}
	return out
}

// ReportsOf returns what the members' agents reported for config, one
// record per cluster, sorted by cluster.
func (v Snapshot) ReportsOf(config types.NamespacedName) []Report {
	it, err := v.txn.Get(membersTable, configPrefix, config.String(), "")
	mustNot(err)
	var out []Report
	for raw := it.Next(); raw != nil; raw = it.Next() {
		if row := raw.(*memberRow); row.report != nil {
			out = append(out, row.report.clone())
		}
	}
	return out
}

// ReportSource is what a member's report was read with: the rules hash
// latest published to the member, and the resourceVersion of the Work the
// report was read from, "" when not known.
type ReportSource struct {
	RulesHash, Version string
}

// Read reports whether ReadBackReport of the Work at version, carrying the
// rules of hash rulesHash, would store nothing new: the Store holds those
// rules as the latest published, and the report it holds was read from
// that very version of the Work. A reconcile reads every Work of its
// config: at 1000 members, building and storing each member's report anew
// took 12.6% of the hub's allocations during an apply (make bench-scale),
// and 54–75 ms a reconcile where 1000 Works had not changed, against
// 0.8–1.0 ms skipped (BenchmarkReadBackUnchanged).
func (s ReportSource) Read(rulesHash, version string) bool {
	return version != "" && s.Version == version && s.RulesHash == rulesHash
}

// ReportSources returns, by cluster, what each member's report for config
// was read with. One lookup for all the config's members: one each cost
// more than what it saved (BenchmarkReadBackUnchanged).
func (v Snapshot) ReportSources(config types.NamespacedName) map[string]ReportSource {
	it, err := v.txn.Get(membersTable, configPrefix, config.String(), "")
	mustNot(err)
	out := map[string]ReportSource{}
	for raw := it.Next(); raw != nil; raw = it.Next() {
		row := raw.(*memberRow)
		out[row.Cluster] = ReportSource{RulesHash: row.Published.RulesHash, Version: row.reportVersion}
	}
	return out
}

// HoldsConfig reports whether the model holds rules published for config:
// whether the config's Works were read back, or its rules published, since
// the hub started. Until then its reports are unknown, not absent.
func (v Snapshot) HoldsConfig(config types.NamespacedName) bool {
	raw, err := v.txn.First(membersTable, configPrefix, config.String(), "")
	mustNot(err)
	return raw != nil
}

// ReportedPods yields the pods the members' agents reported for config,
// one cluster at a time, sorted by cluster and each cluster's pods by name,
// without copying the reports: the pods yielded are the model's and must
// not be modified. The other configs of a namespace read every config's
// pods at each reconcile (overlaps), where cloning each report would cost
// allocations in proportion to the fleet, and a step per pod rather than
// per cluster cost a quarter of the hub's CPU with 50 configs in one
// namespace.
func (v Snapshot) ReportedPods(config types.NamespacedName) iter.Seq2[string, []Pod] {
	return func(yield func(cluster string, pods []Pod) bool) {
		it, err := v.txn.Get(membersTable, configPrefix, config.String(), "")
		mustNot(err)
		for raw := it.Next(); raw != nil; raw = it.Next() {
			row := raw.(*memberRow)
			if row.report != nil && !yield(row.Cluster, row.report.Pods) {
				return
			}
		}
	}
}

// mustNot panics on a read error: reads fail only for a table or index
// missing from the schema, which is a bug in this package.
func mustNot(err error) {
	if err != nil {
		panic(fmt.Sprintf("state: %v", err))
	}
}
