package shardingconfig

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
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
func carrying(t *testing.T, cluster string, gen int64) workv1alpha1.Work {
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
func reporting(t *testing.T, w workv1alpha1.Work, status ctrlmeshv1alpha1.ShardRouteStatus) workv1alpha1.Work {
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
			{Name: "op-0", Address: "10.0.0.1", Ready: true, AppliedRulesHash: publishedRoute("c1", 1).Spec.RulesHash},
			{Name: "op-1", Address: "10.0.0.2", Canary: true},
		},
		Leaders: []state.Leader{{Shard: "0", Pod: "op-0"}},
	}
	for _, tc := range []struct {
		name string
		// before fills the model, as earlier reconciles did.
		before         func(t *testing.T, s *state.Store)
		works          func(t *testing.T) []workv1alpha1.Work
		wantUnreadable []string
		wantPublished  map[string]int64 // by cluster
		wantReports    map[string]*state.Report
	}{{
		name:          "a Work nothing reflected into yet is published, not reported",
		works:         func(t *testing.T) []workv1alpha1.Work { return []workv1alpha1.Work{carrying(t, "c1", 1)} },
		wantPublished: map[string]int64{"c1": 1},
	}, {
		name: "a reported Work: pods with readiness, canary mark, address and ack; leaders; the rules applied or refused",
		works: func(t *testing.T) []workv1alpha1.Work {
			return []workv1alpha1.Work{reporting(t, carrying(t, "c1", 1), status), carrying(t, "c2", 3)}
		},
		wantPublished: map[string]int64{"c1": 1, "c2": 3},
		wantReports:   map[string]*state.Report{"c1": report},
	}, {
		name: "a status that cannot be read is no report",
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
		name: "rules that cannot be read leave the model as it was",
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
		name: "a report the model refuses makes the Work unreadable",
		works: func(t *testing.T) []workv1alpha1.Work {
			twice := status.DeepCopy()
			twice.Pods = append(twice.Pods, twice.Pods[0])
			return []workv1alpha1.Work{reporting(t, carrying(t, "c1", 1), *twice)}
		},
		wantUnreadable: []string{"c1"},
	}, {
		name: "a cached Work that does not show the last publish yet keeps it, and brings its report",
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
			unreadable := readBack(logr.Discard(), s, readBackConfig, tc.works(t), time.Now())
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
