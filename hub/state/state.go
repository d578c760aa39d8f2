// Package state is the hub's working model: what it knows about member
// clusters, the candidate pods the agents report and the rules published to
// each member, kept in an in-memory go-memdb database.
//
// The model is a cache. Nothing in it is persisted: on start the hub's
// controllers rebuild it from the API objects (ManagedClusters, Leases, Work
// status) before placement reads it. Writers are the controllers, each
// owning one kind of record; readers take a Snapshot, a consistent view of
// every table at one instant that later writes do not change.
//
// Records returned are copies: callers may modify them freely.
package state

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-memdb"
	"k8s.io/apimachinery/pkg/types"
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
}

func (c Cluster) clone() Cluster {
	c.Labels = maps.Clone(c.Labels)
	return c
}

func (c Cluster) equal(o Cluster) bool {
	return c.Name == o.Name && c.Accepted == o.Accepted && c.Available == o.Available &&
		maps.Equal(c.Labels, o.Labels) && c.HeartbeatExpiry.Equal(o.HeartbeatExpiry) && c.Reason == o.Reason
}

// Pod is a candidate operator pod of a ShardingConfig in one cluster, as the
// member's agent reports it.
type Pod struct {
	Name string
	// Address is the pod's address for webhook peer routing.
	Address string
	Ready   bool
	Canary  bool
	// AppliedRulesHash is the hash of the rules the pod's proxy has applied;
	// empty when it has applied none.
	AppliedRulesHash string
}

// ClusterPod is a Pod with the cluster it runs in.
type ClusterPod struct {
	Cluster string
	Pod
}

// Revision is one publication of rules.
type Revision struct {
	Generation int64
	RulesHash  string
}

// Published is the rules the hub published for one ShardingConfig to one
// cluster.
type Published struct {
	Config  types.NamespacedName
	Cluster string
	// Revision is the latest publication.
	Revision
	// History holds the latest publications, newest first, Revision among
	// them: a proxy reports the hash of the rules it applied, which may be
	// older than the latest.
	History []Revision
}

// HistoryLength is how many publications Published.History keeps.
const HistoryLength = 8

// Table and index names.
const (
	clustersTable  = "clusters"
	podsTable      = "pods"
	publishedTable = "published"

	idIndex            = "id" // memdb's required primary index
	usableIndex        = "usable"
	configIndex        = "config"
	configClusterIndex = "config_cluster"
)

// podRow and publishedRow are the rows of their tables: the record plus the
// fields indexed. Config is types.NamespacedName.String().
type podRow struct {
	Config  string
	Cluster string
	Name    string
	Pod     Pod
}

type publishedRow struct {
	Config    string
	Cluster   string
	Published Published
}

var schema = &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{
	clustersTable: {
		Name: clustersTable,
		Indexes: map[string]*memdb.IndexSchema{
			idIndex: {Name: idIndex, Unique: true, Indexer: &memdb.StringFieldIndex{Field: "Name"}},
			// Placement asks for the clusters it may place pods in.
			usableIndex: {Name: usableIndex, Indexer: &memdb.ConditionalIndex{Conditional: func(obj any) (bool, error) {
				c := obj.(*Cluster)
				return c.Accepted && c.Available, nil
			}}},
		},
	},
	podsTable: {
		Name: podsTable,
		Indexes: map[string]*memdb.IndexSchema{
			idIndex:            {Name: idIndex, Unique: true, Indexer: compound("Config", "Cluster", "Name")},
			configIndex:        {Name: configIndex, Indexer: &memdb.StringFieldIndex{Field: "Config"}},
			configClusterIndex: {Name: configClusterIndex, Indexer: compound("Config", "Cluster")},
		},
	},
	publishedTable: {
		Name: publishedTable,
		Indexes: map[string]*memdb.IndexSchema{
			idIndex: {Name: idIndex, Unique: true, Indexer: compound("Config", "Cluster")},
		},
	},
}}

func compound(fields ...string) memdb.Indexer {
	indexes := make([]memdb.Indexer, len(fields))
	for i, f := range fields {
		indexes[i] = &memdb.StringFieldIndex{Field: f}
	}
	return &memdb.CompoundIndex{Indexes: indexes}
}

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
// one. The cluster's pods and published rules are left to their writers.
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

// ReplacePods sets the candidate pods of config in cluster to pods (none
// removes them all) and reports whether they changed. Pod names must be
// unique and not empty.
func (s *Store) ReplacePods(config types.NamespacedName, cluster string, pods []Pod) (changed bool, err error) {
	if config.Name == "" || cluster == "" {
		return false, fmt.Errorf("state: pods of config %q in cluster %q: both must be named", config, cluster)
	}
	key := config.String()
	err = s.write(func(txn *memdb.Txn) error {
		old, err := podsOfCluster(txn, key, cluster)
		if err != nil {
			return err
		}
		want := slices.SortedFunc(slices.Values(pods), comparePods)
		if slices.Equal(old, want) {
			return nil
		}
		if _, err := txn.DeleteAll(podsTable, configClusterIndex, key, cluster); err != nil {
			return fmt.Errorf("state: deleting the pods of %s in cluster %q: %w", config, cluster, err)
		}
		for i, p := range want {
			if p.Name == "" {
				return fmt.Errorf("state: a pod of %s in cluster %q without a name", config, cluster)
			}
			// Insert would replace the row of the same name: a duplicate
			// would silently drop a pod.
			if i > 0 && want[i-1].Name == p.Name {
				return fmt.Errorf("state: pod %q of %s in cluster %q reported twice", p.Name, config, cluster)
			}
			if err := txn.Insert(podsTable, &podRow{Config: key, Cluster: cluster, Name: p.Name, Pod: p}); err != nil {
				return fmt.Errorf("state: storing pod %q of %s in cluster %q: %w", p.Name, config, cluster, err)
			}
		}
		changed = true
		return nil
	})
	return changed, err
}

func comparePods(a, b Pod) int { return strings.Compare(a.Name, b.Name) }

// RecordPublish records that rules of generation and rulesHash were
// published for config to cluster. Generations only grow: an older
// generation, or the current one with another hash, is refused; the current
// one with its own hash again is no change.
func (s *Store) RecordPublish(config types.NamespacedName, cluster string, generation int64, rulesHash string) error {
	if config.Name == "" || cluster == "" || generation < 1 || rulesHash == "" {
		return fmt.Errorf("state: publish of config %q to cluster %q, generation %d, hash %q: all must be set, the generation at least 1",
			config, cluster, generation, rulesHash)
	}
	key := config.String()
	return s.write(func(txn *memdb.Txn) error {
		raw, err := txn.First(publishedTable, idIndex, key, cluster)
		if err != nil {
			return fmt.Errorf("state: reading the rules of %s published to cluster %q: %w", config, cluster, err)
		}
		next := Revision{Generation: generation, RulesHash: rulesHash}
		var history []Revision
		if raw != nil {
			cur := raw.(*publishedRow).Published
			switch {
			case cur.Revision == next:
				return nil
			case generation <= cur.Generation:
				return fmt.Errorf("state: publish of %s to cluster %q: generation %d hash %q after generation %d hash %q",
					config, cluster, generation, rulesHash, cur.Generation, cur.RulesHash)
			}
			// A new slice: readers may still hold the old one.
			history = slices.Clone(cur.History[:min(len(cur.History), HistoryLength-1)])
		}
		row := &publishedRow{Config: key, Cluster: cluster, Published: Published{
			Config: config, Cluster: cluster, Revision: next, History: append([]Revision{next}, history...),
		}}
		if err := txn.Insert(publishedTable, row); err != nil {
			return fmt.Errorf("state: storing the rules of %s published to cluster %q: %w", config, cluster, err)
		}
		return nil
	})
}

// Snapshot is a consistent, read-only view of the Store at one instant.
//
// Lists come sorted by the rows' primary keys (cluster name; config, cluster
// and pod name) because memdb appends the primary key to the key of every
// non-unique index.
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

// Clusters returns every cluster, sorted by name.
func (v Snapshot) Clusters() []Cluster {
	return v.clusters(idIndex)
}

// UsableClusters returns the clusters that are accepted and available,
// sorted by name: those placement may use.
func (v Snapshot) UsableClusters() []Cluster {
	return v.clusters(usableIndex, true)
}

func (v Snapshot) clusters(index string, args ...any) []Cluster {
	it, err := v.txn.Get(clustersTable, index, args...)
	mustNot(err)
	var out []Cluster
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*Cluster).clone())
	}
	return out
}

// PodsOf returns the candidate pods of config in every cluster, sorted by
// cluster and name.
func (v Snapshot) PodsOf(config types.NamespacedName) []ClusterPod {
	it, err := v.txn.Get(podsTable, configIndex, config.String())
	mustNot(err)
	var out []ClusterPod
	for raw := it.Next(); raw != nil; raw = it.Next() {
		row := raw.(*podRow)
		out = append(out, ClusterPod{Cluster: row.Cluster, Pod: row.Pod})
	}
	return out
}

// PodsOfCluster returns the candidate pods of config in cluster, sorted by
// name.
func (v Snapshot) PodsOfCluster(config types.NamespacedName, cluster string) []Pod {
	pods, err := podsOfCluster(v.txn, config.String(), cluster)
	mustNot(err)
	return pods
}

func podsOfCluster(txn *memdb.Txn, config, cluster string) ([]Pod, error) {
	it, err := txn.Get(podsTable, configClusterIndex, config, cluster)
	if err != nil {
		return nil, fmt.Errorf("state: reading the pods of %s in cluster %q: %w", config, cluster, err)
	}
	var out []Pod
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*podRow).Pod)
	}
	return out, nil
}

// Published returns the rules published for config to cluster.
func (v Snapshot) Published(config types.NamespacedName, cluster string) (Published, bool) {
	raw, err := v.txn.First(publishedTable, idIndex, config.String(), cluster)
	mustNot(err)
	if raw == nil {
		return Published{}, false
	}
	p := raw.(*publishedRow).Published
	p.History = slices.Clone(p.History)
	return p, true
}

// GenerationOf maps the rules hash a proxy of cluster reports for config to
// the generation it was published as; false when the hash is none of the
// last HistoryLength publications.
func (v Snapshot) GenerationOf(config types.NamespacedName, cluster, rulesHash string) (int64, bool) {
	p, ok := v.Published(config, cluster)
	if !ok {
		return 0, false
	}
	for _, r := range p.History {
		if r.RulesHash == rulesHash {
			return r.Generation, true
		}
	}
	return 0, false
}

// mustNot panics on a read error: reads fail only for a table or index
// missing from the schema, which is a bug in this package.
func mustNot(err error) {
	if err != nil {
		panic(fmt.Sprintf("state: %v", err))
	}
}
