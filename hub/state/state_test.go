package state_test

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ctrlmesh/ctrlmesh/hub/state"
)

func newStore(t *testing.T) *state.Store {
	t.Helper()
	s, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func names(clusters []state.Cluster) []string {
	out := []string{}
	for _, c := range clusters {
		out = append(out, c.Name)
	}
	return out
}

func TestClusters(t *testing.T) {
	expiry := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		upserts     []state.Cluster
		deletes     []string
		wantChanged []bool
		wantAll     []string
		wantUsable  []string
	}{
		{
			name: "usable means accepted and available",
			upserts: []state.Cluster{
				{Name: "c", Accepted: true, Available: true},
				{Name: "a", Accepted: true, Available: true},
				{Name: "b", Accepted: true, Reason: "HeartbeatExpired"},
				{Name: "d", Available: true},
			},
			wantChanged: []bool{true, true, true, true},
			wantAll:     []string{"a", "b", "c", "d"},
			wantUsable:  []string{"a", "c"},
		},
		{
			name: "an equal record is no change",
			upserts: []state.Cluster{
				{Name: "a", Accepted: true, Labels: map[string]string{"env": "prod"}, HeartbeatExpiry: expiry},
				{Name: "a", Accepted: true, Labels: map[string]string{"env": "prod"}, HeartbeatExpiry: expiry.In(time.FixedZone("x", 3600))},
				{Name: "a", Accepted: true, Labels: map[string]string{"env": "dev"}, HeartbeatExpiry: expiry},
				{Name: "a", Accepted: true, Labels: map[string]string{"env": "dev"}, HeartbeatExpiry: expiry.Add(time.Second)},
				{Name: "a", Accepted: true, Available: true, Labels: map[string]string{"env": "dev"}, HeartbeatExpiry: expiry.Add(time.Second)},
			},
			wantChanged: []bool{true, false, true, true, true},
			wantAll:     []string{"a"},
			wantUsable:  []string{"a"},
		},
		{
			name: "a deleted cluster is gone from every index",
			upserts: []state.Cluster{
				{Name: "a", Accepted: true, Available: true},
				{Name: "b", Accepted: true, Available: true},
			},
			deletes:     []string{"a", "missing"},
			wantChanged: []bool{true, true},
			wantAll:     []string{"b"},
			wantUsable:  []string{"b"},
		},
		{
			name: "a record turning unavailable leaves the usable index",
			upserts: []state.Cluster{
				{Name: "a", Accepted: true, Available: true},
				{Name: "a", Accepted: true, Reason: "HeartbeatExpired"},
			},
			wantChanged: []bool{true, true},
			wantAll:     []string{"a"},
			wantUsable:  []string{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			for i, c := range tc.upserts {
				changed, err := s.UpsertCluster(c)
				if err != nil {
					t.Fatal(err)
				}
				if changed != tc.wantChanged[i] {
					t.Errorf("upsert %d (%+v): changed = %v, want %v", i, c, changed, tc.wantChanged[i])
				}
			}
			for _, name := range tc.deletes {
				existed, err := s.DeleteCluster(name)
				if err != nil {
					t.Fatal(err)
				}
				if existed != (name != "missing") {
					t.Errorf("DeleteCluster(%q) = %v", name, existed)
				}
			}
			v := s.Snapshot()
			if got := names(v.Clusters()); !reflect.DeepEqual(got, tc.wantAll) {
				t.Errorf("Clusters = %v, want %v", got, tc.wantAll)
			}
			if got := names(v.UsableClusters()); !reflect.DeepEqual(got, tc.wantUsable) {
				t.Errorf("UsableClusters = %v, want %v", got, tc.wantUsable)
			}
			last := tc.upserts[len(tc.upserts)-1]
			got, ok := v.Cluster(last.Name)
			if deleted := slices.Contains(tc.deletes, last.Name); ok == deleted {
				t.Fatalf("Cluster(%q) found = %v, deleted = %v", last.Name, ok, deleted)
			}
			if ok && !reflect.DeepEqual(got, last) {
				t.Errorf("Cluster(%q) = %+v, want %+v", last.Name, got, last)
			}
		})
	}
}

func TestClusterRecordsAreCopies(t *testing.T) {
	s := newStore(t)
	labels := map[string]string{"env": "prod"}
	if _, err := s.UpsertCluster(state.Cluster{Name: "a", Labels: labels}); err != nil {
		t.Fatal(err)
	}
	labels["env"] = "changed by the caller"
	got, _ := s.Snapshot().Cluster("a")
	got.Labels["env"] = "changed by a reader"
	if again, _ := s.Snapshot().Cluster("a"); again.Labels["env"] != "prod" {
		t.Errorf("stored labels %v, want env=prod", again.Labels)
	}
	if _, err := s.UpsertCluster(state.Cluster{}); err == nil {
		t.Error("UpsertCluster accepted a cluster without a name")
	}
}

// A snapshot does not see later writes.
func TestSnapshotIsolation(t *testing.T) {
	s := newStore(t)
	if _, err := s.UpsertCluster(state.Cluster{Name: "a", Accepted: true, Available: true}); err != nil {
		t.Fatal(err)
	}
	before := s.Snapshot()
	if _, err := s.UpsertCluster(state.Cluster{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteCluster("a"); err != nil {
		t.Fatal(err)
	}
	if got := names(before.Clusters()); !reflect.DeepEqual(got, []string{"a"}) {
		t.Errorf("old snapshot: Clusters = %v, want [a]", got)
	}
	if got := names(s.Snapshot().Clusters()); !reflect.DeepEqual(got, []string{"b"}) {
		t.Errorf("new snapshot: Clusters = %v, want [b]", got)
	}
}

var (
	cfgA = types.NamespacedName{Namespace: "ops", Name: "a"}
	cfgB = types.NamespacedName{Namespace: "ops", Name: "b"}
)

func TestPods(t *testing.T) {
	type replace struct {
		config      types.NamespacedName
		cluster     string
		pods        []state.Pod
		wantChanged bool
		wantErr     string
	}
	p := func(name string) state.Pod { return state.Pod{Name: name, Address: "10.0.0.1:9443", Ready: true} }
	for _, tc := range []struct {
		name            string
		replaces        []replace
		wantPodsOfA     []state.ClusterPod
		wantPodsOfA1    []state.Pod
		wantPodsOfBInC2 []state.Pod
	}{
		{
			name: "per config and cluster, sorted",
			replaces: []replace{
				{config: cfgA, cluster: "c2", pods: []state.Pod{p("y"), p("x")}, wantChanged: true},
				{config: cfgA, cluster: "c1", pods: []state.Pod{p("z")}, wantChanged: true},
				{config: cfgB, cluster: "c2", pods: []state.Pod{p("w")}, wantChanged: true},
			},
			wantPodsOfA:     []state.ClusterPod{{Cluster: "c1", Pod: p("z")}, {Cluster: "c2", Pod: p("x")}, {Cluster: "c2", Pod: p("y")}},
			wantPodsOfA1:    []state.Pod{p("z")},
			wantPodsOfBInC2: []state.Pod{p("w")},
		},
		{
			name: "replacing drops pods not reported again, and the same set is no change",
			replaces: []replace{
				{config: cfgA, cluster: "c1", pods: []state.Pod{p("x"), p("y")}, wantChanged: true},
				{config: cfgA, cluster: "c1", pods: []state.Pod{p("y"), p("x")}, wantChanged: false},
				{config: cfgA, cluster: "c1", pods: []state.Pod{{Name: "y", AppliedRulesHash: "h1", Canary: true}}, wantChanged: true},
			},
			wantPodsOfA:  []state.ClusterPod{{Cluster: "c1", Pod: state.Pod{Name: "y", AppliedRulesHash: "h1", Canary: true}}},
			wantPodsOfA1: []state.Pod{{Name: "y", AppliedRulesHash: "h1", Canary: true}},
		},
		{
			name: "no pods removes them all",
			replaces: []replace{
				{config: cfgA, cluster: "c1", pods: []state.Pod{p("x")}, wantChanged: true},
				{config: cfgA, cluster: "c1", pods: nil, wantChanged: true},
				{config: cfgA, cluster: "c1", pods: nil, wantChanged: false},
			},
		},
		{
			name: "a config that prefixes another stays apart",
			replaces: []replace{
				{config: types.NamespacedName{Namespace: "ops", Name: "ab"}, cluster: "c1", pods: []state.Pod{p("x")}, wantChanged: true},
				{config: cfgA, cluster: "c10", pods: []state.Pod{p("x")}, wantChanged: true},
			},
			wantPodsOfA: []state.ClusterPod{{Cluster: "c10", Pod: p("x")}},
		},
		{
			name: "invalid reports change nothing",
			replaces: []replace{
				{config: cfgA, cluster: "c1", pods: []state.Pod{p("x")}, wantChanged: true},
				{config: cfgA, cluster: "c1", pods: []state.Pod{p("y"), p("y")}, wantErr: "reported twice"},
				{config: cfgA, cluster: "c1", pods: []state.Pod{{}}, wantErr: "without a name"},
				{config: cfgA, cluster: "", pods: []state.Pod{p("x")}, wantErr: "must be named"},
			},
			wantPodsOfA:  []state.ClusterPod{{Cluster: "c1", Pod: p("x")}},
			wantPodsOfA1: []state.Pod{p("x")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			for i, r := range tc.replaces {
				changed, err := s.ReplacePods(r.config, r.cluster, r.pods)
				if r.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), r.wantErr) {
						t.Errorf("replace %d: err = %v, want %q", i, err, r.wantErr)
					}
					continue
				}
				if err != nil {
					t.Fatalf("replace %d: %v", i, err)
				}
				if changed != r.wantChanged {
					t.Errorf("replace %d: changed = %v, want %v", i, changed, r.wantChanged)
				}
			}
			v := s.Snapshot()
			if got := v.PodsOf(cfgA); !reflect.DeepEqual(got, tc.wantPodsOfA) {
				t.Errorf("PodsOf(a) = %+v, want %+v", got, tc.wantPodsOfA)
			}
			if got := v.PodsOfCluster(cfgA, "c1"); !reflect.DeepEqual(got, tc.wantPodsOfA1) {
				t.Errorf("PodsOfCluster(a, c1) = %+v, want %+v", got, tc.wantPodsOfA1)
			}
			if got := v.PodsOfCluster(cfgB, "c2"); !reflect.DeepEqual(got, tc.wantPodsOfBInC2) {
				t.Errorf("PodsOfCluster(b, c2) = %+v, want %+v", got, tc.wantPodsOfBInC2)
			}
		})
	}
}

func TestPublished(t *testing.T) {
	type publish struct {
		generation int64
		hash       string
		wantErr    string
	}
	for _, tc := range []struct {
		name        string
		publishes   []publish
		wantCurrent state.Revision
		wantHistory int
		lookups     map[string]int64 // hash to generation; 0: unknown
	}{
		{
			name:        "hashes map to their generations",
			publishes:   []publish{{generation: 1, hash: "h1"}, {generation: 2, hash: "h2"}, {generation: 5, hash: "h5"}},
			wantCurrent: state.Revision{Generation: 5, RulesHash: "h5"},
			wantHistory: 3,
			lookups:     map[string]int64{"h1": 1, "h2": 2, "h5": 5, "h3": 0},
		},
		{
			name: "the same publication again is no change; going back is refused",
			publishes: []publish{
				{generation: 1, hash: "h1"}, {generation: 2, hash: "h2"}, {generation: 2, hash: "h2"},
				{generation: 2, hash: "other", wantErr: "after generation 2"},
				{generation: 1, hash: "h1", wantErr: "after generation 2"},
				{generation: 0, hash: "h0", wantErr: "at least 1"},
				{generation: 3, hash: "", wantErr: "all must be set"},
			},
			wantCurrent: state.Revision{Generation: 2, RulesHash: "h2"},
			wantHistory: 2,
			lookups:     map[string]int64{"h1": 1, "h2": 2, "other": 0},
		},
		{
			name: "history keeps the newest",
			publishes: func() []publish {
				var out []publish
				for g := int64(1); g <= state.HistoryLength+3; g++ {
					out = append(out, publish{generation: g, hash: fmt.Sprintf("h%d", g)})
				}
				return out
			}(),
			wantCurrent: state.Revision{Generation: state.HistoryLength + 3, RulesHash: fmt.Sprintf("h%d", state.HistoryLength+3)},
			wantHistory: state.HistoryLength,
			lookups:     map[string]int64{"h3": 0, "h4": 4, fmt.Sprintf("h%d", state.HistoryLength+3): state.HistoryLength + 3},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			for i, p := range tc.publishes {
				err := s.RecordPublish(cfgA, "c1", p.generation, p.hash)
				if p.wantErr == "" && err != nil || p.wantErr != "" && (err == nil || !strings.Contains(err.Error(), p.wantErr)) {
					t.Errorf("publish %d (%d, %q): err = %v, want %q", i, p.generation, p.hash, err, p.wantErr)
				}
			}
			v := s.Snapshot()
			got, ok := v.Published(cfgA, "c1")
			if !ok {
				t.Fatal("nothing published")
			}
			if got.Revision != tc.wantCurrent || len(got.History) != tc.wantHistory || got.History[0] != tc.wantCurrent ||
				got.Config != cfgA || got.Cluster != "c1" {
				t.Errorf("Published = %+v, want current %+v and %d revisions, newest first", got, tc.wantCurrent, tc.wantHistory)
			}
			for hash, want := range tc.lookups {
				gen, ok := v.GenerationOf(cfgA, "c1", hash)
				if ok != (want != 0) || gen != want {
					t.Errorf("GenerationOf(%q) = %d, %v; want %d", hash, gen, ok, want)
				}
			}
			if _, ok := v.Published(cfgA, "c2"); ok {
				t.Error("rules published to c2")
			}
			if _, ok := v.GenerationOf(cfgB, "c1", "h1"); ok {
				t.Error("a hash of config a found for config b")
			}
		})
	}
}

// Readers running during writes always see whole writes: every pod list of
// one ReplacePods call, and a cluster's record as one upsert wrote it.
func TestConcurrentReadersSeeWholeWrites(t *testing.T) {
	s := newStore(t)
	const writes, readers, podsPerWrite = 300, 4, 5
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 1; i <= writes; i++ {
			hash := fmt.Sprintf("h%d", i)
			pods := make([]state.Pod, podsPerWrite)
			for j := range pods {
				pods[j] = state.Pod{Name: fmt.Sprintf("pod-%d", j), AppliedRulesHash: hash}
			}
			if _, err := s.ReplacePods(cfgA, "c1", pods); err != nil {
				t.Error(err)
				return
			}
			if err := s.RecordPublish(cfgA, "c1", int64(i), hash); err != nil {
				t.Error(err)
				return
			}
			if _, err := s.UpsertCluster(state.Cluster{Name: "c1", Accepted: true, Available: i%2 == 0,
				Labels: map[string]string{"write": hash}}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	reads := make([]int, readers)
	for r := range readers {
		wg.Go(func() {
			for {
				select {
				case <-writerDone:
					return
				default:
				}
				reads[r]++
				v := s.Snapshot()
				if pods := v.PodsOfCluster(cfgA, "c1"); len(pods) > 0 {
					var podsGen int64
					if _, err := fmt.Sscanf(pods[0].AppliedRulesHash, "h%d", &podsGen); err != nil || len(pods) != podsPerWrite {
						t.Errorf("pods %+v", pods)
						return
					}
					for _, p := range pods {
						if p.AppliedRulesHash != pods[0].AppliedRulesHash {
							t.Errorf("pods of two writes in one snapshot: %+v", pods)
							return
						}
					}
					// Each publish follows its pods' write.
					if published, ok := v.Published(cfgA, "c1"); ok && published.Generation != podsGen && published.Generation != podsGen-1 {
						t.Errorf("published generation %d with the pods of %d", published.Generation, podsGen)
						return
					}
				}
				if c, ok := v.Cluster("c1"); ok {
					if usable := len(v.UsableClusters()) == 1; usable != c.Available || len(c.Labels) != 1 {
						t.Errorf("cluster %+v, usable %v", c, usable)
						return
					}
				}
			}
		})
	}
	<-writerDone
	wg.Wait()
	if c, _ := s.Snapshot().Cluster("c1"); c.Labels["write"] != fmt.Sprintf("h%d", writes) {
		t.Errorf("last write %+v", c)
	}
	t.Logf("reads per reader during %d writes: %v", writes, reads)
}
