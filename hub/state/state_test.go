package state_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
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

// known are those of names the snapshot has a cluster of, and usable those
// of them that are usable.
func known(v state.Snapshot, names []string) (all, usable []string) {
	all, usable = []string{}, []string{}
	for _, name := range slices.Sorted(slices.Values(names)) {
		if c, ok := v.Cluster(name); ok && !slices.Contains(all, name) {
			all = append(all, name)
			if c.Usable() {
				usable = append(usable, name)
			}
		}
	}
	return all, usable
}

func TestClusters(t *testing.T) {
	expiry := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name         string
		upserts      []state.Cluster
		deletes      []string
		wantChanged  []bool
		wantAll      []string
		wantUsable   []string
		wantAccepted []string
	}{
		{
			name: "usable means accepted and available",
			upserts: []state.Cluster{
				{Name: "c", Accepted: true, Available: true},
				{Name: "a", Accepted: true, Available: true},
				{Name: "b", Accepted: true, Reason: "HeartbeatExpired"},
				{Name: "d", Available: true},
			},
			wantChanged:  []bool{true, true, true, true},
			wantAll:      []string{"a", "b", "c", "d"},
			wantUsable:   []string{"a", "c"},
			wantAccepted: []string{"a", "b", "c"},
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
			wantChanged:  []bool{true, false, true, true, true},
			wantAll:      []string{"a"},
			wantUsable:   []string{"a"},
			wantAccepted: []string{"a"},
		},
		{
			name: "a deleted cluster is gone from every index",
			upserts: []state.Cluster{
				{Name: "a", Accepted: true, Available: true},
				{Name: "b", Accepted: true, Available: true},
			},
			deletes:      []string{"a", "missing"},
			wantChanged:  []bool{true, true},
			wantAll:      []string{"b"},
			wantUsable:   []string{"b"},
			wantAccepted: []string{"b"},
		},
		{
			name: "a record turning unavailable is no longer usable",
			upserts: []state.Cluster{
				{Name: "a", Accepted: true, Available: true},
				{Name: "a", Accepted: true, Reason: "HeartbeatExpired"},
			},
			wantChanged:  []bool{true, true},
			wantAll:      []string{"a"},
			wantUsable:   []string{},
			wantAccepted: []string{"a"},
		},
		{
			name: "a record turning unaccepted leaves the accepted index",
			upserts: []state.Cluster{
				{Name: "a", Accepted: true, Available: true},
				{Name: "b", Accepted: true, Available: true},
				{Name: "a", Available: true},
			},
			wantChanged:  []bool{true, true, true},
			wantAll:      []string{"a", "b"},
			wantUsable:   []string{"b"},
			wantAccepted: []string{"b"},
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
			all, usable := known(v, append(names(tc.upserts), tc.deletes...))
			if !reflect.DeepEqual(all, tc.wantAll) {
				t.Errorf("clusters = %v, want %v", all, tc.wantAll)
			}
			if !reflect.DeepEqual(usable, tc.wantUsable) {
				t.Errorf("usable clusters = %v, want %v", usable, tc.wantUsable)
			}
			if got := names(v.AcceptedClusters()); !reflect.DeepEqual(got, tc.wantAccepted) {
				t.Errorf("AcceptedClusters = %v, want %v", got, tc.wantAccepted)
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
	if got, _ := known(before, []string{"a", "b"}); !reflect.DeepEqual(got, []string{"a"}) {
		t.Errorf("old snapshot: clusters = %v, want [a]", got)
	}
	if got, _ := known(s.Snapshot(), []string{"a", "b"}); !reflect.DeepEqual(got, []string{"b"}) {
		t.Errorf("new snapshot: clusters = %v, want [b]", got)
	}
	if got := names(before.AcceptedClusters()); !reflect.DeepEqual(got, []string{"a"}) {
		t.Errorf("old snapshot: AcceptedClusters = %v, want [a]", got)
	}
}

var (
	cfgA = types.NamespacedName{Namespace: "ops", Name: "a"}
	cfgB = types.NamespacedName{Namespace: "ops", Name: "b"}
)

// route is a ShardRoute of generation gen whose rules hash is hash.
func route(gen int64, hash string) *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{RoutingGeneration: gen, RulesHash: hash}}
}

// podsByCluster is what ReportsOf returns, as the pods of each cluster.
func podsByCluster(reports []state.Report) map[string][]state.Pod {
	out := map[string][]state.Pod{}
	for _, r := range reports {
		out[r.Cluster] = r.Pods
	}
	return out
}

// TestRowsShareStrings: the model keeps one copy of the strings its rows
// repeat, whatever copies the routes came in: the rules hash published
// and in the history; and keeps a report's strings as given, the copies
// the hub's cache holds once for every Work (propagation's transform).
func TestRowsShareStrings(t *testing.T) {
	s := newStore(t)
	fresh := strings.Clone
	given := map[string]*state.Report{}
	for _, cluster := range []string{"c1", "c2"} {
		report := &state.Report{Pods: []state.Pod{
			{Name: fresh("op-0"), Address: fresh("10.0.0.1:9443"), AppliedRulesHash: fresh("h1")},
			{Name: fresh("op-1"), Address: fresh("10.0.0.1:9443"), AppliedRulesHash: fresh("h1")},
		}}
		given[cluster] = report
		if _, err := s.ReadBack(cfgA, cluster, route(1, fresh("h1")), report, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	reports, published := s.Snapshot().ReportsOf(cfgA), s.Snapshot().PublishedOf(cfgA)
	if len(reports) != 2 || len(published) != 2 {
		t.Fatalf("%d reports, %d published; want 2 of each", len(reports), len(published))
	}
	same := func(x, y string) bool { return x == y && unsafe.StringData(x) == unsafe.StringData(y) }
	for _, tc := range []struct {
		what string
		x, y string
	}{
		{"the hash published to two members", published[0].RulesHash, published[1].RulesHash},
		{"the hash published and in the history", published[0].RulesHash, published[0].History[0].RulesHash},
		{"a pod's name as given", reports[0].Pods[0].Name, given["c1"].Pods[0].Name},
		{"a pod's address as given", reports[1].Pods[1].Address, given["c2"].Pods[1].Address},
	} {
		if !same(tc.x, tc.y) {
			t.Errorf("%s: %q and %q are two copies", tc.what, tc.x, tc.y)
		}
	}
}

func TestReports(t *testing.T) {
	type readBack struct {
		config  types.NamespacedName
		cluster string
		report  *state.Report // nil: the member has reported nothing
		wantErr string
	}
	p := func(name string) state.Pod { return state.Pod{Name: name, Address: "10.0.0.1:9443", Ready: true} }
	pods := func(pods ...state.Pod) *state.Report { return &state.Report{Pods: pods} }
	for _, tc := range []struct {
		name      string
		readBacks []readBack
		wantPodsA map[string][]state.Pod
		wantPodsB map[string][]state.Pod
	}{
		{
			name: "per config and cluster, sorted",
			readBacks: []readBack{
				{config: cfgA, cluster: "c2", report: pods(p("y"), p("x"))},
				{config: cfgA, cluster: "c1", report: pods(p("z"))},
				{config: cfgB, cluster: "c2", report: pods(p("w"))},
			},
			wantPodsA: map[string][]state.Pod{"c1": {p("z")}, "c2": {p("x"), p("y")}},
			wantPodsB: map[string][]state.Pod{"c2": {p("w")}},
		},
		{
			name: "a report replaces the last, dropping pods not reported again",
			readBacks: []readBack{
				{config: cfgA, cluster: "c1", report: pods(p("x"), p("y"))},
				{config: cfgA, cluster: "c1", report: pods(state.Pod{Name: "y", AppliedRulesHash: "h1", Canary: true})},
			},
			wantPodsA: map[string][]state.Pod{"c1": {{Name: "y", AppliedRulesHash: "h1", Canary: true}}},
		},
		{
			name: "a report without pods is a report; none removes it",
			readBacks: []readBack{
				{config: cfgA, cluster: "c1", report: pods(p("x"))},
				{config: cfgA, cluster: "c2", report: pods(p("x"))},
				{config: cfgA, cluster: "c1", report: pods()},
				{config: cfgA, cluster: "c2"},
			},
			wantPodsA: map[string][]state.Pod{"c1": nil},
		},
		{
			name: "a config that prefixes another stays apart",
			readBacks: []readBack{
				{config: types.NamespacedName{Namespace: "ops", Name: "ab"}, cluster: "c1", report: pods(p("x"))},
				{config: cfgA, cluster: "c10", report: pods(p("x"))},
			},
			wantPodsA: map[string][]state.Pod{"c10": {p("x")}},
		},
		{
			name: "invalid reports change nothing",
			readBacks: []readBack{
				{config: cfgA, cluster: "c1", report: pods(p("x"))},
				{config: cfgA, cluster: "c1", report: pods(p("y"), p("y")), wantErr: "reported twice"},
				{config: cfgA, cluster: "c1", report: pods(state.Pod{}), wantErr: "without a name"},
				{config: cfgA, cluster: "", report: pods(p("x")), wantErr: "must be named"},
			},
			wantPodsA: map[string][]state.Pod{"c1": {p("x")}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			for i, r := range tc.readBacks {
				_, err := s.ReadBack(r.config, r.cluster, route(1, "h1"), r.report, time.Time{})
				if r.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), r.wantErr) {
						t.Errorf("read-back %d: err = %v, want %q", i, err, r.wantErr)
					}
					continue
				}
				if err != nil {
					t.Fatalf("read-back %d: %v", i, err)
				}
			}
			v := s.Snapshot()
			if got := podsByCluster(v.ReportsOf(cfgA)); !reflect.DeepEqual(got, tc.wantPodsA) && len(got)+len(tc.wantPodsA) > 0 {
				t.Errorf("ReportsOf(a) = %+v, want %+v", got, tc.wantPodsA)
			}
			if got := podsByCluster(v.ReportsOf(cfgB)); !reflect.DeepEqual(got, tc.wantPodsB) && len(got)+len(tc.wantPodsB) > 0 {
				t.Errorf("ReportsOf(b) = %+v, want %+v", got, tc.wantPodsB)
			}
			// ReportedPods yields the pods ReportsOf returns, in order.
			for _, config := range []types.NamespacedName{cfgA, cfgB} {
				var want, got []string
				for _, r := range v.ReportsOf(config) {
					for _, p := range r.Pods {
						want = append(want, r.Cluster+"/"+p.Name)
					}
				}
				for cluster, pods := range v.ReportedPods(config) {
					for _, p := range pods {
						got = append(got, cluster+"/"+p.Name)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("ReportedPods(%s) = %v, want %v", config, got, want)
				}
			}
		})
	}
}

// TestHoldsConfig: the model holds a config once its rules are published
// or its Works read back, until its rows go; a config whose name another's
// prefixes is not held with it.
func TestHoldsConfig(t *testing.T) {
	s := newStore(t)
	ab := types.NamespacedName{Namespace: "ops", Name: "ab"}
	if _, err := s.ReadBack(ab, "c1", route(1, "h1"), &state.Report{Pods: []state.Pod{{Name: "x"}, {Name: "y"}}}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if v := s.Snapshot(); v.HoldsConfig(cfgA) || !v.HoldsConfig(ab) {
		t.Errorf("after a read-back of %s: holds a %t, ab %t; want false, true", ab, v.HoldsConfig(cfgA), v.HoldsConfig(ab))
	}
	if err := s.RecordPublish(cfgA, "c1", route(1, "h1"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	published := s.Snapshot()
	if !published.HoldsConfig(cfgA) {
		t.Error("after a publish: a not held")
	}
	if err := s.DeleteConfig(cfgA); err != nil {
		t.Fatal(err)
	}
	if s.Snapshot().HoldsConfig(cfgA) || !published.HoldsConfig(cfgA) {
		t.Error("after the config's deletion: still held, or an earlier snapshot changed")
	}
	// A reader that stops early stops the iteration (Go panics
	// otherwise).
	for range s.Snapshot().ReportedPods(ab) {
		break
	}
}

// TestReportRecords: the Store keeps a report's parts as given where they
// are sorted, as the agents write them, and sorted copies where they are
// not; its readers get copies, to the pods' breakers and the subsets'
// namespaces, which they may change.
func TestReportRecords(t *testing.T) {
	s := newStore(t)
	sorted := &state.Report{
		RulesApplied:     &metav1.Condition{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionFalse, Message: "refused"},
		Pods:             []state.Pod{{Name: "a", Breakers: []ctrlmeshv1alpha1.PodBreakerStatus{{Policy: "p", Name: "b", State: ctrlmeshv1alpha1.BreakerOpen}}}, {Name: "b"}},
		Leaders:          []state.Leader{{Shard: "0", Pod: "a"}, {Shard: "1", Pod: "b"}},
		SubsetNamespaces: map[string][]string{"v2": {"team-a"}},
	}
	unsorted := &state.Report{
		Pods:    []state.Pod{{Name: "b"}, {Name: "a"}},
		Leaders: []state.Leader{{Shard: "1", Pod: "b"}, {Shard: "0", Pod: "a"}},
	}
	for _, tc := range []struct {
		cluster string
		report  *state.Report
	}{{"c1", sorted}, {"c2", unsorted}} {
		if _, err := s.ReadBack(cfgA, tc.cluster, route(1, "h1"), tc.report, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	reported := func() []*state.Report {
		var out []*state.Report
		for _, r := range s.Snapshot().ReportsOf(cfgA) {
			out = append(out, &r)
		}
		return out
	}
	read := reported()
	want := []*state.Report{
		{Config: cfgA, Cluster: "c1", RulesApplied: sorted.RulesApplied.DeepCopy(), Pods: []state.Pod{*sorted.Pods[0].DeepCopy(), {Name: "b"}}, Leaders: slices.Clone(sorted.Leaders),
			SubsetNamespaces: map[string][]string{"v2": {"team-a"}}},
		{Config: cfgA, Cluster: "c2", Pods: []state.Pod{{Name: "a"}, {Name: "b"}}, Leaders: []state.Leader{{Shard: "0", Pod: "a"}, {Shard: "1", Pod: "b"}}},
	}
	if !reflect.DeepEqual(read, want) {
		t.Fatalf("reports %+v, want %+v (sorted)", read, want)
	}
	// The unsorted report was copied to be sorted: the caller's slices are
	// not the Store's.
	unsorted.Pods[0].Name, unsorted.Leaders[0].Pod = "changed by the caller", "changed by the caller"
	// A reader's copy is its own, to the pods' breakers.
	read[0].RulesApplied.Message, read[0].Pods[0].Name, read[0].Pods[0].Breakers[0].State, read[0].Leaders[0].Pod = "changed", "changed", "changed", "changed"
	read[0].SubsetNamespaces["v2"][0] = "changed"
	read[1].Pods[0].Name = "changed"
	if again := reported(); !reflect.DeepEqual(again, want) {
		t.Errorf("reports %+v after the caller of an unsorted one and a reader changed theirs, want %+v", again, want)
	}
	p := s.Snapshot().PublishedOf(cfgA)[0]
	p.Route.Spec.Cluster, p.History[0].RulesHash = "changed by a reader", "changed"
	if again := s.Snapshot().PublishedOf(cfgA)[0]; again.Route.Spec.Cluster != "" || again.History[0].RulesHash != "h1" {
		t.Errorf("stored rules %+v after a reader changed its copy", again)
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
				err := s.RecordPublish(cfgA, "c1", route(p.generation, p.hash), time.Time{})
				if p.wantErr == "" && err != nil || p.wantErr != "" && (err == nil || !strings.Contains(err.Error(), p.wantErr)) {
					t.Errorf("publish %d (%d, %q): err = %v, want %q", i, p.generation, p.hash, err, p.wantErr)
				}
			}
			v := s.Snapshot()
			all := v.PublishedOf(cfgA)
			if len(all) != 1 {
				t.Fatalf("published %+v, want the rules of c1", all)
			}
			got := all[0]
			if got.Revision != tc.wantCurrent || len(got.History) != tc.wantHistory || got.History[0] != tc.wantCurrent ||
				got.Config != cfgA || got.Cluster != "c1" ||
				got.Route.Spec.RoutingGeneration != tc.wantCurrent.Generation || got.Route.Spec.RulesHash != tc.wantCurrent.RulesHash {
				t.Errorf("Published = %+v, want current %+v and %d revisions, newest first", got, tc.wantCurrent, tc.wantHistory)
			}
			for hash, want := range tc.lookups {
				gen, ok := got.GenerationOf(hash)
				if ok != (want != 0) || gen != want {
					t.Errorf("GenerationOf(%q) = %d, %v; want %d", hash, gen, ok, want)
				}
			}
			if other := v.PublishedOf(cfgB); len(other) > 0 {
				t.Errorf("rules of config a found for config b: %+v", other)
			}
		})
	}
}

// ReadBack takes a Work's rules as published, except those of a Work that
// does not show the hub's last write yet. Each revision keeps when the hub
// first knew the Work to carry it: the step (a second apart) that
// published it or first read it back.
func TestReadBackPublished(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(step int) time.Time { return base.Add(time.Duration(step) * time.Second) }
	type step struct {
		readBack   bool // else RecordPublish
		generation int64
		hash       string
		wantBehind bool
	}
	for _, tc := range []struct {
		name        string
		steps       []step
		wantHistory []state.Revision // newest first: the current one
	}{
		{
			name:        "a restarted hub takes what the Work carries",
			steps:       []step{{readBack: true, generation: 7, hash: "h7"}},
			wantHistory: []state.Revision{{Generation: 7, RulesHash: "h7", Since: at(0)}},
		},
		{
			name: "a cached Work older than the last publish is behind",
			steps: []step{
				{readBack: true, generation: 1, hash: "h1"},
				{generation: 2, hash: "h2"},
				{readBack: true, generation: 1, hash: "h1", wantBehind: true},
				// Read back later, it was carried since the publish.
				{readBack: true, generation: 2, hash: "h2"},
			},
			wantHistory: []state.Revision{{Generation: 2, RulesHash: "h2", Since: at(1)}, {Generation: 1, RulesHash: "h1", Since: at(0)}},
		},
		{
			name: "a Work rewritten at the recorded generation replaces its hash",
			steps: []step{
				{generation: 1, hash: "h1"},
				{generation: 2, hash: "h2"},
				{readBack: true, generation: 2, hash: "other"},
			},
			wantHistory: []state.Revision{{Generation: 2, RulesHash: "other", Since: at(2)}, {Generation: 1, RulesHash: "h1", Since: at(0)}},
		},
		{
			name: "a newer Work is taken",
			steps: []step{
				{generation: 1, hash: "h1"},
				{readBack: true, generation: 3, hash: "h3"},
				{generation: 4, hash: "h4"},
			},
			wantHistory: []state.Revision{{Generation: 4, RulesHash: "h4", Since: at(2)}, {Generation: 3, RulesHash: "h3", Since: at(1)}, {Generation: 1, RulesHash: "h1", Since: at(0)}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			for i, st := range tc.steps {
				if !st.readBack {
					if err := s.RecordPublish(cfgA, "c1", route(st.generation, st.hash), at(i)); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					continue
				}
				behind, err := s.ReadBack(cfgA, "c1", route(st.generation, st.hash), &state.Report{Pods: []state.Pod{{Name: st.hash}}}, at(i))
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if behind != st.wantBehind {
					t.Errorf("step %d: behind = %v, want %v", i, behind, st.wantBehind)
				}
				// The report is taken even from a Work that is behind.
				if got := podsByCluster(s.Snapshot().ReportsOf(cfgA))["c1"]; len(got) != 1 || got[0].Name != st.hash {
					t.Errorf("step %d: pods %+v, want the report read back", i, got)
				}
			}
			got := s.Snapshot().PublishedOf(cfgA)[0]
			want := tc.wantHistory[0]
			if got.Revision != want || !reflect.DeepEqual(got.History, tc.wantHistory) ||
				got.Route.Spec.RoutingGeneration != want.Generation || got.Route.Spec.RulesHash != want.RulesHash {
				t.Errorf("Published = %+v, want current %+v and history %+v", got, want, tc.wantHistory)
			}
		})
	}
}

// CarriedAt is the newest generation the hub knew the Work to carry at a
// time, and when the next one came.
func TestCarriedAt(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newStore(t)
	for g := int64(1); g <= 3; g++ {
		if err := s.RecordPublish(cfgA, "c1", route(g, fmt.Sprintf("h%d", g)), base.Add(time.Duration(g)*10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	p := s.Snapshot().PublishedOf(cfgA)[0]
	for _, tc := range []struct {
		at       time.Duration
		wantGen  int64
		wantNext time.Duration // 0: none
	}{
		{at: 5 * time.Second, wantGen: 0, wantNext: 10 * time.Second},
		{at: 10 * time.Second, wantGen: 1, wantNext: 20 * time.Second},
		{at: 25 * time.Second, wantGen: 2, wantNext: 30 * time.Second},
		{at: 30 * time.Second, wantGen: 3},
		{at: time.Hour, wantGen: 3},
	} {
		gen, next := p.CarriedAt(base.Add(tc.at))
		wantNext := time.Time{}
		if tc.wantNext != 0 {
			wantNext = base.Add(tc.wantNext)
		}
		if gen != tc.wantGen || !next.Equal(wantNext) {
			t.Errorf("CarriedAt(+%v) = %d, %v; want %d, %v", tc.at, gen, next, tc.wantGen, wantNext)
		}
	}
}

// The rows of a config follow its Works: they go with the Works of the
// clusters it no longer selects, and all of them with the config.
func TestRowRemoval(t *testing.T) {
	cfgAB := types.NamespacedName{Namespace: "ops", Name: "ab"}
	type rows map[types.NamespacedName][]string // config to the clusters it has rows of
	for _, tc := range []struct {
		name string
		// remove removes rows; it returns what RetainClusters reports.
		remove      func(s *state.Store) ([]string, error)
		wantRemoved []string
		want        rows
	}{
		{
			name:        "retaining some clusters removes the others",
			remove:      func(s *state.Store) ([]string, error) { return s.RetainClusters(cfgA, []string{"c2", "c9"}) },
			wantRemoved: []string{"c1", "c3"},
			want:        rows{cfgA: {"c2"}, cfgAB: {"c1", "c2"}, cfgB: {"c1"}},
		},
		{
			name:   "retaining every cluster removes nothing",
			remove: func(s *state.Store) ([]string, error) { return s.RetainClusters(cfgA, []string{"c1", "c2", "c3"}) },
			want:   rows{cfgA: {"c1", "c2", "c3"}, cfgAB: {"c1", "c2"}, cfgB: {"c1"}},
		},
		{
			name:        "retaining none removes all",
			remove:      func(s *state.Store) ([]string, error) { return s.RetainClusters(cfgA, nil) },
			wantRemoved: []string{"c1", "c2", "c3"},
			want:        rows{cfgAB: {"c1", "c2"}, cfgB: {"c1"}},
		},
		{
			name:   "deleting a config removes its rows, not those of a config its name prefixes",
			remove: func(s *state.Store) ([]string, error) { return nil, s.DeleteConfig(cfgA) },
			want:   rows{cfgAB: {"c1", "c2"}, cfgB: {"c1"}},
		},
		{
			name: "deleting an unknown config removes nothing",
			remove: func(s *state.Store) ([]string, error) {
				return nil, s.DeleteConfig(types.NamespacedName{Namespace: "ops", Name: "x"})
			},
			want: rows{cfgA: {"c1", "c2", "c3"}, cfgAB: {"c1", "c2"}, cfgB: {"c1"}},
		},
		{
			// The ShardingConfig controller removes them with the
			// cluster's Works, once the cluster is no longer selected.
			name: "deleting a cluster leaves the rows to the controller that owns them",
			remove: func(s *state.Store) ([]string, error) {
				_, err := s.DeleteCluster("c1")
				return nil, err
			},
			want: rows{cfgA: {"c1", "c2", "c3"}, cfgAB: {"c1", "c2"}, cfgB: {"c1"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			if _, err := s.UpsertCluster(state.Cluster{Name: "c1", Accepted: true}); err != nil {
				t.Fatal(err)
			}
			for config, clusters := range (rows{cfgA: {"c1", "c2", "c3"}, cfgAB: {"c1", "c2"}, cfgB: {"c1"}}) {
				for _, c := range clusters {
					// c3's rules are published, not yet reported.
					if c == "c3" {
						if err := s.RecordPublish(config, c, route(1, "h1"), time.Time{}); err != nil {
							t.Fatal(err)
						}
						continue
					}
					if _, err := s.ReadBack(config, c, route(1, "h1"), &state.Report{Pods: []state.Pod{{Name: "p"}}}, time.Time{}); err != nil {
						t.Fatal(err)
					}
				}
			}
			removed, err := tc.remove(s)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(removed, tc.wantRemoved) && len(removed)+len(tc.wantRemoved) > 0 {
				t.Errorf("removed %v, want %v", removed, tc.wantRemoved)
			}
			v := s.Snapshot()
			got := rows{}
			for _, config := range []types.NamespacedName{cfgA, cfgAB, cfgB} {
				var published, reported []string
				for _, p := range v.PublishedOf(config) {
					published = append(published, p.Cluster)
				}
				for _, r := range v.ReportsOf(config) {
					reported = append(reported, r.Cluster)
				}
				if want := slices.DeleteFunc(slices.Clone(published), func(c string) bool { return c == "c3" }); !slices.Equal(reported, want) {
					t.Errorf("%s: reports of %v, rules of %v", config, reported, published)
				}
				if len(published) > 0 {
					got[config] = published
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("rows of %v, want %v", got, tc.want)
			}
		})
	}
}

// Readers running during writes always see whole writes: the rules and
// report of one ReadBack together, and a cluster's record as one upsert
// wrote it.
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
			if _, err := s.ReadBack(cfgA, "c1", route(int64(i), hash), &state.Report{Pods: pods}, time.Time{}); err != nil {
				t.Error(err)
				return
			}
			if _, err := s.UpsertCluster(state.Cluster{Name: "c1", Accepted: i%2 == 0, Available: true,
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
				if reports := v.ReportsOf(cfgA); len(reports) > 0 {
					pods := reports[0].Pods
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
					// The rules and the report of one Work are one write.
					if published := v.PublishedOf(cfgA); len(published) != 1 || published[0].Generation != podsGen {
						t.Errorf("published %+v with the pods of %d", published, podsGen)
						return
					}
				}
				if c, ok := v.Cluster("c1"); ok {
					if accepted := len(v.AcceptedClusters()) == 1; accepted != c.Accepted || len(c.Labels) != 1 {
						t.Errorf("cluster %+v, in the accepted index %v", c, accepted)
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

// TestReadBackReport: a report alone is stored only beside the rules it
// names as the latest published; otherwise nothing changes and the caller
// is told to read the rules back.
func TestReadBackReport(t *testing.T) {
	pods := &state.Report{Pods: []state.Pod{{Name: "op-0", Ready: true}}}
	for _, tc := range []struct {
		name      string
		published *ctrlmeshv1alpha1.ShardRoute // before, nil for none
		hash      string
		report    *state.Report
		wantErr   error
		wantPods  []state.Pod // nil: no report stored
	}{
		{name: "the latest rules: the report is stored", published: route(2, "h2"), hash: "h2", report: pods, wantPods: pods.Pods},
		{name: "nothing reported removes the report", published: route(2, "h2"), hash: "h2"},
		{name: "older rules: not the latest", published: route(2, "h2"), hash: "h1", report: pods, wantErr: state.ErrNotLatest},
		{name: "no rules published: not the latest", hash: "h1", report: pods, wantErr: state.ErrNotLatest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			if tc.published != nil {
				if _, err := s.ReadBack(cfgA, "c1", tc.published, &state.Report{Pods: []state.Pod{{Name: "before"}}}, time.Time{}); err != nil {
					t.Fatal(err)
				}
			}
			err := s.ReadBackReport(cfgA, "c1", tc.hash, "7", tc.report)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			got := podsByCluster(s.Snapshot().ReportsOf(cfgA))["c1"]
			want := tc.wantPods
			if tc.wantErr != nil && tc.published != nil {
				want = []state.Pod{{Name: "before"}} // unchanged
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("pods reported %+v, want %+v", got, want)
			}
		})
	}
}

// TestReportSources: the Store tells a Work's report read already only for
// the version of the Work it was read from, while the rules it was read
// with are the latest published; a publish keeps the report and its
// version, ReadBack forgets the version.
func TestReportSources(t *testing.T) {
	pods := &state.Report{Pods: []state.Pod{{Name: "op-0", Ready: true}}}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	rules := func(t *testing.T, s *state.Store, config types.NamespacedName) {
		t.Helper()
		_, err := s.ReadBack(config, "c1", route(2, "h2"), nil, time.Time{})
		must(t, err)
	}
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, s *state.Store)
		hash    string
		version string
		want    bool
	}{
		{name: "no row", hash: "h2", version: "7", prepare: func(*testing.T, *state.Store) {}},
		{name: "read from that version", hash: "h2", version: "7", want: true, prepare: func(t *testing.T, s *state.Store) {
			rules(t, s, cfgA)
			must(t, s.ReadBackReport(cfgA, "c1", "h2", "7", pods))
		}},
		{name: "nothing reported, read from that version", hash: "h2", version: "7", want: true, prepare: func(t *testing.T, s *state.Store) {
			rules(t, s, cfgA)
			must(t, s.ReadBackReport(cfgA, "c1", "h2", "7", nil))
		}},
		{name: "rules read back, no report read yet", hash: "h2", version: "7", prepare: func(t *testing.T, s *state.Store) {
			rules(t, s, cfgA)
		}},
		{name: "read from another version", hash: "h2", version: "8", prepare: func(t *testing.T, s *state.Store) {
			rules(t, s, cfgA)
			must(t, s.ReadBackReport(cfgA, "c1", "h2", "7", pods))
		}},
		{name: "no version", hash: "h2", version: "", prepare: func(t *testing.T, s *state.Store) {
			rules(t, s, cfgA)
			must(t, s.ReadBackReport(cfgA, "c1", "h2", "", pods))
		}},
		{name: "other rules than the latest", hash: "h1", version: "7", prepare: func(t *testing.T, s *state.Store) {
			rules(t, s, cfgA)
			must(t, s.ReadBackReport(cfgA, "c1", "h2", "7", pods))
		}},
		{name: "published since: the report and its version kept", hash: "h3", version: "7", want: true, prepare: func(t *testing.T, s *state.Store) {
			rules(t, s, cfgA)
			must(t, s.ReadBackReport(cfgA, "c1", "h2", "7", pods))
			must(t, s.RecordPublish(cfgA, "c1", route(3, "h3"), time.Time{}))
		}},
		{name: "read back since: the version is not known", hash: "h2", version: "7", prepare: func(t *testing.T, s *state.Store) {
			rules(t, s, cfgA)
			must(t, s.ReadBackReport(cfgA, "c1", "h2", "7", pods))
			_, err := s.ReadBack(cfgA, "c1", route(2, "h2"), pods, time.Time{})
			must(t, err)
		}},
		{name: "another config's", hash: "h2", version: "7", prepare: func(t *testing.T, s *state.Store) {
			rules(t, s, cfgB)
			must(t, s.ReadBackReport(cfgB, "c1", "h2", "7", pods))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			tc.prepare(t, s)
			if got := s.Snapshot().ReportSources(cfgA)["c1"].Read(tc.hash, tc.version); got != tc.want {
				t.Errorf("read with hash %q from version %q: %v, want %v", tc.hash, tc.version, got, tc.want)
			}
		})
	}
}

// TestPublishedKeepsRouting: the Store keeps of a published route what
// placement and the policy status read — identity, bucket count, shards
// with every field, nil and empty slices as given, policies — and none of
// what the ShardingConfig gives every route; and shares nothing with the
// route it was given or the one it gives back.
func TestPublishedKeepsRouting(t *testing.T) {
	pod := func(name, address string) ctrlmeshv1alpha1.RoutePod {
		return ctrlmeshv1alpha1.RoutePod{Name: name, Address: address}
	}
	for _, tc := range []struct {
		name   string
		shards []ctrlmeshv1alpha1.RouteShard
	}{
		{name: "one shard, one pod", shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: "0-31", Pods: []ctrlmeshv1alpha1.RoutePod{pod("op-0", "10.0.0.1")}}}},
		{name: "no shards"},
		{name: "empty shards", shards: []ctrlmeshv1alpha1.RouteShard{}},
		{name: "every field, pods in several shards", shards: []ctrlmeshv1alpha1.RouteShard{
			{ID: "0", Buckets: "0-7", PendingBuckets: "8-9", Namespaces: []string{"a", "b"}, PendingNamespaces: []string{"c"}, Canary: true, Subset: "v2",
				Pods: []ctrlmeshv1alpha1.RoutePod{pod("op-0", "10.0.0.1"), pod("op-1", "")}},
			{ID: "1", Buckets: "10-31", Pods: []ctrlmeshv1alpha1.RoutePod{pod("op-2", "10.0.0.3")}},
			{ID: "2"},
			{ID: "3", Pods: []ctrlmeshv1alpha1.RoutePod{pod("op-3", "10.0.0.4"), pod("op-4", "10.0.0.5"), pod("op-5", "10.0.0.6")}},
		}},
		{name: "empty, not nil, pods and namespaces", shards: []ctrlmeshv1alpha1.RouteShard{
			{ID: "0", Buckets: "0-31", Pods: []ctrlmeshv1alpha1.RoutePod{}, Namespaces: []string{}, PendingNamespaces: []string{}},
			{ID: "1", Pods: nil},
		}},
		{name: "only a rare field", shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Subset: "v1"}, {ID: "1", Canary: true}, {ID: "2", PendingBuckets: "3"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &ctrlmeshv1alpha1.ShardRoute{
				TypeMeta: metav1.TypeMeta{APIVersion: ctrlmeshv1alpha1.GroupVersion.String(), Kind: "ShardRoute"},
				ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "a", Labels: map[string]string{"karmada.io/managed": "true"},
					Annotations: map[string]string{"work.karmada.io/name": "a-1"}},
				Spec: ctrlmeshv1alpha1.ShardRouteSpec{Cluster: "c1", RoutingGeneration: 3, RulesHash: "h3", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
					Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
					Limits:   ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}}}},
					Shards:   tc.shards,
					Policies: &ctrlmeshv1alpha1.RoutePolicies{CircuitBreakers: []ctrlmeshv1alpha1.RouteCircuitBreaker{{Name: "cb", Generation: 2}}},
				},
			}
			want := &ctrlmeshv1alpha1.ShardRoute{TypeMeta: in.TypeMeta, ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "a"},
				Spec: ctrlmeshv1alpha1.ShardRouteSpec{Cluster: "c1", RoutingGeneration: 3, RulesHash: "h3", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
					Shards: in.DeepCopy().Spec.Shards, Policies: in.Spec.Policies.DeepCopy()}}
			s := newStore(t)
			if _, err := s.ReadBack(cfgA, "c1", in, nil, time.Time{}); err != nil {
				t.Fatal(err)
			}
			published := s.Snapshot().PublishedOf(cfgA)
			if len(published) != 1 || !reflect.DeepEqual(published[0].Route, want) {
				t.Fatalf("published %+v, want the route %+v", published[0].Route.Spec, want.Spec)
			}
			// Neither the route given nor the one read back is the record.
			in.Spec.Policies.CircuitBreakers[0].Generation = 9
			got := published[0].Route
			for i := range in.Spec.Shards {
				for _, sh := range []*ctrlmeshv1alpha1.RouteShard{&in.Spec.Shards[i], &got.Spec.Shards[i]} {
					sh.ID = "changed"
					for j := range sh.Pods {
						sh.Pods[j].Name = "changed"
					}
					for j := range sh.Namespaces {
						sh.Namespaces[j] = "changed"
					}
					sh.Pods = append(sh.Pods, pod("appended", ""))
				}
			}
			if again := s.Snapshot().PublishedOf(cfgA)[0].Route; !reflect.DeepEqual(again, want) {
				t.Errorf("the Store's record changed with a route given or read: %+v, want %+v", again.Spec, want.Spec)
			}
		})
	}
}
