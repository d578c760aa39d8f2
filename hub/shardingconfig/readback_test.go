package shardingconfig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/propagation"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

var readBackConfig = types.NamespacedName{Namespace: "ops", Name: "op"}

// publishedRoute is the ShardRoute of generation gen for cluster, with its
// rules hash.
func publishedRoute(cluster string, gen int64) *ctrlmeshv1alpha1.ShardRoute {
	r := &ctrlmeshv1alpha1.ShardRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: ctrlmeshv1alpha1.GroupVersion.String(), Kind: "ShardRoute"},
		ObjectMeta: metav1.ObjectMeta{Namespace: readBackConfig.Namespace, Name: readBackConfig.Name},
		Spec:       ctrlmeshv1alpha1.ShardRouteSpec{Cluster: cluster, RoutingGeneration: gen, Buckets: 32},
	}
	r.Spec.RulesHash = route.RulesHash(&r.Spec)
	return r
}

// carrying is the Work of cluster carrying the route of generation gen, as
// a Writer writes it (in the parts routework.ReadStatus and Decode read).
func carrying(t testing.TB, cluster string, gen int64) workv1alpha1.Work {
	t.Helper()
	raw, err := json.Marshal(publishedRoute(cluster, gen))
	if err != nil {
		t.Fatal(err)
	}
	w := workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: names.GenerateExecutionSpaceName(cluster), Name: "op", Generation: gen}}
	w.Spec.Workload.Manifests = []workv1alpha1.Manifest{{RawExtension: runtime.RawExtension{Raw: raw}}}
	return w
}

// reporting sets the Work's status as a member's agent reflects it.
func reporting(t testing.TB, w workv1alpha1.Work, status ctrlmeshv1alpha1.ShardRouteStatus) workv1alpha1.Work {
	t.Helper()
	raw, err := json.Marshal(status)
	if err != nil {
		t.Fatal(err)
	}
	w.Status.Conditions = []metav1.Condition{{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: "AppliedSuccessful", ObservedGeneration: w.Generation}}
	w.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{{
		Identifier: workv1alpha1.ResourceIdentifier{Group: ctrlmeshv1alpha1.GroupVersion.Group, Version: ctrlmeshv1alpha1.GroupVersion.Version,
			Kind: "ShardRoute", Namespace: readBackConfig.Namespace, Name: readBackConfig.Name},
		Health: workv1alpha1.ResourceHealthy,
		Status: &runtime.RawExtension{Raw: raw},
	}}
	return w
}

// TestReadBack: what the Works carry and their members report enters the
// working model in one place, before placement reads it.
func TestReadBack(t *testing.T) {
	applied := &metav1.Condition{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonInvalidRules, Message: "label mode"}
	status := ctrlmeshv1alpha1.ShardRouteStatus{
		Pods: []ctrlmeshv1alpha1.PodRouteStatus{
			{Name: "op-1", Address: "10.0.0.2", Canary: true, Shard: "0"},
			{Name: "op-0", Address: "10.0.0.1", Ready: true, Shard: "0", AppliedRulesHash: publishedRoute("c1", 1).Spec.RulesHash},
		},
		Leaders:    []ctrlmeshv1alpha1.ShardLeader{{Shard: "0", Pod: "op-0"}},
		Conditions: []metav1.Condition{*applied},
	}
	report := &state.Report{
		Config: readBackConfig, Cluster: "c1", RulesApplied: applied,
		Pods: []state.Pod{
			{Name: "op-0", Address: "10.0.0.1", Ready: true, Shard: "0", AppliedRulesHash: publishedRoute("c1", 1).Spec.RulesHash},
			{Name: "op-1", Address: "10.0.0.2", Canary: true, Shard: "0"},
		},
		Leaders: []state.Leader{{Shard: "0", Pod: "op-0"}},
	}
	for _, tc := range []struct {
		name string
		// before fills the model, as earlier reconciles did.
		before func(t *testing.T, s *state.Store)
		// works are the Works on the API server; the cache shows them
		// without manifests, and at the generations of cached, if set.
		works  func(t *testing.T) []workv1alpha1.Work
		cached map[string]int64
		// known are the generations of the rules the source knows the
		// Works to carry, by cluster.
		known     map[string]int64
		serverErr error
		// wantServerReads is how often the Works are read from the API
		// server.
		wantServerReads int
		wantUnreadable  []string
		wantPublished   map[string]int64 // by cluster
		wantReports     map[string]*state.Report
	}{{
		name:            "a Work nothing reflected into yet is published, not reported",
		wantServerReads: 1,
		works:           func(t *testing.T) []workv1alpha1.Work { return []workv1alpha1.Work{carrying(t, "c1", 1)} },
		wantPublished:   map[string]int64{"c1": 1},
	}, {
		name:            "a reported Work: pods with readiness, canary mark, address and ack; leaders; the rules applied or refused",
		wantServerReads: 1,
		works: func(t *testing.T) []workv1alpha1.Work {
			return []workv1alpha1.Work{reporting(t, carrying(t, "c1", 1), status), carrying(t, "c2", 3)}
		},
		wantPublished: map[string]int64{"c1": 1, "c2": 3},
		wantReports:   map[string]*state.Report{"c1": report},
	}, {
		name:            "a status that cannot be read is no report",
		wantServerReads: 1,
		before: func(t *testing.T, s *state.Store) {
			if _, err := s.ReadBack(readBackConfig, "c1", publishedRoute("c1", 1), &state.Report{Pods: []state.Pod{{Name: "op-0"}}}, time.Time{}); err != nil {
				t.Fatal(err)
			}
		},
		works: func(t *testing.T) []workv1alpha1.Work {
			w := reporting(t, carrying(t, "c1", 2), status)
			w.Status.ManifestStatuses = append(w.Status.ManifestStatuses, w.Status.ManifestStatuses[0])
			return []workv1alpha1.Work{w}
		},
		wantPublished: map[string]int64{"c1": 2},
	}, {
		name:            "rules that cannot be read leave the model as it was",
		wantServerReads: 1,
		before: func(t *testing.T, s *state.Store) {
			if _, err := s.ReadBack(readBackConfig, "c1", publishedRoute("c1", 1), report, time.Time{}); err != nil {
				t.Fatal(err)
			}
		},
		works: func(t *testing.T) []workv1alpha1.Work {
			w := reporting(t, carrying(t, "c1", 2), ctrlmeshv1alpha1.ShardRouteStatus{})
			w.Spec.Workload.Manifests[0].Raw = []byte(`{"apiVersion":"v1","kind":"ConfigMap"}`)
			return []workv1alpha1.Work{w, carrying(t, "c2", 1)}
		},
		wantUnreadable: []string{"c1"},
		wantPublished:  map[string]int64{"c1": 1, "c2": 1},
		wantReports:    map[string]*state.Report{"c1": report},
	}, {
		name:            "a report the model refuses makes the Work unreadable",
		wantServerReads: 1,
		works: func(t *testing.T) []workv1alpha1.Work {
			twice := status.DeepCopy()
			twice.Pods = append(twice.Pods, twice.Pods[0])
			return []workv1alpha1.Work{reporting(t, carrying(t, "c1", 1), *twice)}
		},
		wantUnreadable: []string{"c1"},
	}, {
		name:            "a Work read with rules older than those published last keeps those, and brings its report",
		wantServerReads: 1,
		before: func(t *testing.T, s *state.Store) {
			if err := s.RecordPublish(readBackConfig, "c1", publishedRoute("c1", 2), time.Time{}); err != nil {
				t.Fatal(err)
			}
		},
		works: func(t *testing.T) []workv1alpha1.Work {
			return []workv1alpha1.Work{reporting(t, carrying(t, "c1", 1), status)}
		},
		wantPublished: map[string]int64{"c1": 2},
		wantReports:   map[string]*state.Report{"c1": report},
	}, {
		name: "a cached Work whose rules the source knows, the latest in the model, is not read again: its report is",
		before: func(t *testing.T, s *state.Store) {
			if err := s.RecordPublish(readBackConfig, "c1", publishedRoute("c1", 2), time.Time{}); err != nil {
				t.Fatal(err)
			}
		},
		works: func(t *testing.T) []workv1alpha1.Work {
			return []workv1alpha1.Work{reporting(t, carrying(t, "c1", 2), status)}
		},
		// The cache does not show the publish of generation 2 yet.
		cached:        map[string]int64{"c1": 1},
		known:         map[string]int64{"c1": 2},
		wantPublished: map[string]int64{"c1": 2},
		wantReports:   map[string]*state.Report{"c1": report},
	}, {
		name: "a Work the source knows to carry rules other than the model's latest is read again",
		before: func(t *testing.T, s *state.Store) {
			if err := s.RecordPublish(readBackConfig, "c1", publishedRoute("c1", 2), time.Time{}); err != nil {
				t.Fatal(err)
			}
		},
		works: func(t *testing.T) []workv1alpha1.Work {
			return []workv1alpha1.Work{reporting(t, carrying(t, "c1", 3), status), carrying(t, "c2", 1)}
		},
		known:           map[string]int64{"c1": 3},
		wantServerReads: 1,
		wantPublished:   map[string]int64{"c1": 3, "c2": 1},
		wantReports:     map[string]*state.Report{"c1": report},
	}, {
		name: "Works that cannot be read from the API server are unreadable; the known ones still bring their reports",
		before: func(t *testing.T, s *state.Store) {
			if err := s.RecordPublish(readBackConfig, "c1", publishedRoute("c1", 1), time.Time{}); err != nil {
				t.Fatal(err)
			}
		},
		works: func(t *testing.T) []workv1alpha1.Work {
			return []workv1alpha1.Work{reporting(t, carrying(t, "c1", 1), status), carrying(t, "c2", 1)}
		},
		known:           map[string]int64{"c1": 1},
		serverErr:       errors.New("connection refused"),
		wantServerReads: 1,
		wantUnreadable:  []string{"c2"},
		wantPublished:   map[string]int64{"c1": 1},
		wantReports:     map[string]*state.Report{"c1": report},
	}, {
		name: "a Work outside every execution namespace is ignored",
		works: func(t *testing.T) []workv1alpha1.Work {
			w := carrying(t, "c1", 1)
			w.Namespace = "default"
			return []workv1alpha1.Work{w}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := state.New()
			if err != nil {
				t.Fatal(err)
			}
			if tc.before != nil {
				tc.before(t, s)
			}
			server := tc.works(t)
			var cached []workv1alpha1.Work
			for _, w := range server {
				w := *w.DeepCopy()
				if gen, ok := tc.cached[clusterOfWork(&w)]; ok {
					w = reporting(t, carrying(t, clusterOfWork(&w), gen), statusOf(t, &w))
				}
				lean, err := propagation.CacheTransform(&w)
				if err != nil {
					t.Fatal(err)
				}
				cached = append(cached, *lean.(*workv1alpha1.Work))
			}
			source := &fakeSource{known: tc.known, works: server, err: tc.serverErr}
			sc := &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: readBackConfig.Namespace, Name: readBackConfig.Name}}
			unreadable := readBack(context.Background(), s, source, sc, cached, time.Now())
			if source.reads != tc.wantServerReads {
				t.Errorf("the Works were read from the API server %d times, want %d", source.reads, tc.wantServerReads)
			}
			if got := slices.Sorted(maps.Keys(unreadable)); !slices.Equal(got, tc.wantUnreadable) {
				t.Errorf("unreadable %v, want %v", unreadable, tc.wantUnreadable)
			}
			v := s.Snapshot()
			published := map[string]int64{}
			for _, p := range v.PublishedOf(readBackConfig) {
				published[p.Cluster] = p.Generation
				if want := publishedRoute(p.Cluster, p.Generation); !reflect.DeepEqual(p.Route, want) {
					t.Errorf("rules of %s: %+v, want %+v", p.Cluster, p.Route, want)
				}
			}
			if !maps.Equal(published, tc.wantPublished) && len(published)+len(tc.wantPublished) > 0 {
				t.Errorf("published generations %v, want %v", published, tc.wantPublished)
			}
			reports := map[string]*state.Report{}
			for _, r := range v.ReportsOf(readBackConfig) {
				reports[r.Cluster] = &r
			}
			if !reflect.DeepEqual(reports, tc.wantReports) && len(reports)+len(tc.wantReports) > 0 {
				t.Errorf("reports %+v, want %+v", reports, tc.wantReports)
			}
		})
	}
}

// fakeSource is the Writer as readBack sees it: what it knows the Works
// carry (known, by cluster: a generation of publishedRoute), and the Works
// on the API server.
type fakeSource struct {
	known map[string]int64
	works []workv1alpha1.Work
	err   error
	reads int
}

func (f *fakeSource) Known(work *workv1alpha1.Work) (string, bool) {
	cluster, err := routework.ClusterOf(work)
	if err != nil {
		return "", false
	}
	gen, ok := f.known[cluster]
	if !ok {
		return "", false
	}
	return publishedRoute(cluster, gen).Spec.RulesHash, true
}

func (f *fakeSource) ReadFromServer(context.Context, *ctrlmeshv1alpha1.ShardingConfig) ([]workv1alpha1.Work, error) {
	f.reads++
	if f.err != nil {
		return nil, f.err
	}
	out := make([]workv1alpha1.Work, len(f.works))
	for i := range f.works {
		f.works[i].DeepCopyInto(&out[i])
	}
	return out, nil
}

// clusterOfWork is the cluster of a Work in an execution namespace, "" for
// another.
func clusterOfWork(w *workv1alpha1.Work) string {
	cluster, err := routework.ClusterOf(w)
	if err != nil {
		return ""
	}
	return cluster
}

// statusOf is the route status reflected into the Work.
func statusOf(t *testing.T, w *workv1alpha1.Work) ctrlmeshv1alpha1.ShardRouteStatus {
	t.Helper()
	var status ctrlmeshv1alpha1.ShardRouteStatus
	for _, ms := range w.Status.ManifestStatuses {
		if ms.Status != nil {
			if err := json.Unmarshal(ms.Status.Raw, &status); err != nil {
				t.Fatal(err)
			}
		}
	}
	return status
}

// TestReadBackReportOncePerVersion: a Work's report is read into the model
// once per version of the Work: read again at the version it was read
// from, nothing changes (a version's content cannot change: the status
// given here at the same version stands for any read of it); at a new
// version, the new report is read.
func TestReadBackReportOncePerVersion(t *testing.T) {
	s, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RecordPublish(readBackConfig, "c1", publishedRoute("c1", 1), time.Time{}); err != nil {
		t.Fatal(err)
	}
	source := &fakeSource{known: map[string]int64{"c1": 1}}
	sc := &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: readBackConfig.Namespace, Name: readBackConfig.Name}}
	reportingPod := func(version, pod string) workv1alpha1.Work {
		w := reporting(t, carrying(t, "c1", 1), ctrlmeshv1alpha1.ShardRouteStatus{Pods: []ctrlmeshv1alpha1.PodRouteStatus{{Name: pod, Ready: true}}})
		w.ResourceVersion = version
		lean, err := propagation.CacheTransform(&w)
		if err != nil {
			t.Fatal(err)
		}
		return *lean.(*workv1alpha1.Work)
	}
	for _, step := range []struct {
		version, pod, want string
	}{
		{"5", "op-0", "op-0"},
		{"5", "op-1", "op-0"},
		{"6", "op-1", "op-1"},
		{"", "op-2", "op-2"},
		{"", "op-3", "op-3"},
	} {
		if unreadable := readBack(context.Background(), s, source, sc, []workv1alpha1.Work{reportingPod(step.version, step.pod)}, time.Now()); len(unreadable) > 0 {
			t.Fatalf("unreadable: %v", unreadable)
		}
		var got []string
		for _, r := range s.Snapshot().ReportsOf(readBackConfig) {
			for _, p := range r.Pods {
				got = append(got, p.Name)
			}
		}
		if !slices.Equal(got, []string{step.want}) {
			t.Errorf("the Work at version %q reporting %s: the model holds pods %v, want %s", step.version, step.pod, got, step.want)
		}
	}
	if source.reads != 0 {
		t.Errorf("the Works were read from the API server %d times; their rules are known", source.reads)
	}
}

// BenchmarkReadBackUnchanged is the read back at the start of each
// reconcile of a config over 1000 members whose Works did not change since
// the last: as during an apply, where each member's report brings its
// config back to read every other member's Work.
func BenchmarkReadBackUnchanged(b *testing.B) {
	s, known, works := reportingFleet(b, 1000)
	sc := &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: readBackConfig.Namespace, Name: readBackConfig.Name}}
	b.ReportAllocs()
	for b.Loop() {
		if unreadable := readBack(context.Background(), s, known, sc, works, time.Now()); len(unreadable) > 0 {
			b.Fatalf("unreadable: %v", unreadable)
		}
	}
}

// reportingFleet is a model holding the rules published to members
// clusters, and their Works as the hub's cache holds them, each reporting
// 4 pods that acknowledge those rules, with the Writer that knows them.
func reportingFleet(b *testing.B, members int) (*state.Store, knownHashes, []workv1alpha1.Work) {
	b.Helper()
	s, err := state.New()
	if err != nil {
		b.Fatal(err)
	}
	known := knownHashes{}
	works := make([]workv1alpha1.Work, 0, members)
	for m := range members {
		cluster := fmt.Sprintf("m%04d", m)
		published := publishedRoute(cluster, 1)
		known[cluster] = published.Spec.RulesHash
		if err := s.RecordPublish(readBackConfig, cluster, published, time.Time{}); err != nil {
			b.Fatal(err)
		}
		status := ctrlmeshv1alpha1.ShardRouteStatus{Conditions: []metav1.Condition{{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonRulesValid}}}
		for i := range 4 {
			status.Pods = append(status.Pods, ctrlmeshv1alpha1.PodRouteStatus{Name: fmt.Sprintf("op-%d", i), Address: fmt.Sprintf("10.%d.%d.%d", m/250, m%250, i),
				Ready: true, Shard: fmt.Sprint(i), AppliedRulesHash: published.Spec.RulesHash})
			status.Leaders = append(status.Leaders, ctrlmeshv1alpha1.ShardLeader{Shard: fmt.Sprint(i), Pod: fmt.Sprintf("op-%d", i)})
		}
		w := reporting(b, carrying(b, cluster, 1), status)
		w.ResourceVersion = fmt.Sprint(1000 + m)
		lean, err := propagation.CacheTransform(&w)
		if err != nil {
			b.Fatal(err)
		}
		works = append(works, *lean.(*workv1alpha1.Work))
	}
	return s, known, works
}

// knownHashes is a Writer that knows the rules hash each Work carries, by
// cluster, as the hub's Writer knows those it wrote, and reads none from
// the API server.
type knownHashes map[string]string

func (k knownHashes) Known(work *workv1alpha1.Work) (string, bool) {
	hash, ok := k[clusterOfWork(work)]
	return hash, ok
}

func (knownHashes) ReadFromServer(context.Context, *ctrlmeshv1alpha1.ShardingConfig) ([]workv1alpha1.Work, error) {
	return nil, errors.New("every Work is known")
}

// BenchmarkCachedAndModelBytes reports the live heap a member's Work costs
// the hub in its cache and its working model together: 1000 Works
// reporting 4 pods each, through the cache's transform, read back into
// the model. The model keeps a report's parts as the cache holds them.
func BenchmarkCachedAndModelBytes(b *testing.B) {
	const members = 1000
	sc := &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: readBackConfig.Namespace, Name: readBackConfig.Name}}
	for b.Loop() {
		before := env.LiveHeap()
		s, known, works := reportingFleet(b, members)
		if unreadable := readBack(context.Background(), s, known, sc, works, time.Now()); len(unreadable) > 0 {
			b.Fatalf("unreadable: %v", unreadable)
		}
		after := env.LiveHeap()
		b.ReportMetric(float64(after-before)/members, "B/work")
		goruntime.KeepAlive(works)
		goruntime.KeepAlive(s)
	}
}
