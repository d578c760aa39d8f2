package shardingconfig

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
)

// TestSelectorsImply: the static overlap check finds selectors of which one
// has every requirement of the other, and no others.
func TestSelectorsImply(t *testing.T) {
	labels := func(kv ...string) *metav1.LabelSelector {
		s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
		for i := 0; i < len(kv); i += 2 {
			s.MatchLabels[kv[i]] = kv[i+1]
		}
		return s
	}
	in := func(key string, values ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: metav1.LabelSelectorOpIn, Values: values}}}
	}
	for _, tc := range []struct {
		name string
		a, b *metav1.LabelSelector
		want bool
	}{
		{"equal", labels("app", "op"), labels("app", "op"), true},
		{"one narrower", labels("app", "op"), labels("app", "op", "tier", "control"), true},
		{"narrower first", labels("app", "op", "tier", "control"), labels("app", "op"), true},
		{"same expression", in("app", "op", "other"), in("app", "other", "op"), true},
		{"other value", labels("app", "op"), labels("app", "other"), false},
		{"other keys", labels("app", "op"), labels("tier", "control"), false},
		{"both add a key", labels("app", "op", "a", "1"), labels("app", "op", "b", "2"), false},
		{"unparsable", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "not a value"}}, labels("app", "op"), false},
	} {
		if got := selectorsImply(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: selectorsImply = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPeerView: what the other configs of a namespace read of a config
// changes with its generation, its deletion, whether the model holds it
// and its members' pods, and with nothing else the model holds of it.
func TestPeerView(t *testing.T) {
	config := types.NamespacedName{Namespace: "ops", Name: "a"}
	route := &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{RoutingGeneration: 1, RulesHash: "h1"}}
	type step struct {
		name string
		// change changes the config or the model; news is whether the
		// view changed with it.
		change func(t *testing.T, sc *ctrlmeshv1alpha1.ShardingConfig, store *state.Store)
		news   bool
	}
	readBack := func(cluster string, report *state.Report) func(*testing.T, *ctrlmeshv1alpha1.ShardingConfig, *state.Store) {
		return func(t *testing.T, _ *ctrlmeshv1alpha1.ShardingConfig, store *state.Store) {
			if _, err := store.ReadBack(config, cluster, route, report, time.Time{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	pod := func(name, hash string) state.Pod { return state.Pod{Name: name, Ready: true, AppliedRulesHash: hash} }
	store, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	sc := &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: config.Name, Generation: 1}}
	var told lastTold[uint64]
	for _, st := range []step{
		{"first sight", func(*testing.T, *ctrlmeshv1alpha1.ShardingConfig, *state.Store) {}, true},
		{"nothing changed", func(*testing.T, *ctrlmeshv1alpha1.ShardingConfig, *state.Store) {}, false},
		{"held, without a report", readBack("c1", nil), true},
		{"a pod reported", readBack("c1", &state.Report{Pods: []state.Pod{pod("op-0", "")}}), true},
		{"the pod's ack and readiness", readBack("c1", &state.Report{Pods: []state.Pod{{Name: "op-0", AppliedRulesHash: "h1"}}}), false},
		{"the same pod in another cluster", readBack("c2", &state.Report{Pods: []state.Pod{pod("op-0", "h1")}}), true},
		{"a status write", func(_ *testing.T, sc *ctrlmeshv1alpha1.ShardingConfig, _ *state.Store) { sc.Status.Shards = 4 }, false},
		{"a new generation", func(_ *testing.T, sc *ctrlmeshv1alpha1.ShardingConfig, _ *state.Store) { sc.Generation = 2 }, true},
		{"being deleted", func(_ *testing.T, sc *ctrlmeshv1alpha1.ShardingConfig, _ *state.Store) {
			sc.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		}, true},
		{"its rows gone", func(t *testing.T, _ *ctrlmeshv1alpha1.ShardingConfig, store *state.Store) {
			if err := store.DeleteConfig(config); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		st.change(t, sc, store)
		if got := told.news(config, peerView(config, sc, store.Snapshot())); got != st.news {
			t.Errorf("%s: news %t, want %t", st.name, got, st.news)
		}
	}
	// Forgotten, a config's view is news again.
	told.forget(config)
	if !told.news(config, peerView(config, sc, store.Snapshot())) {
		t.Error("after forget: the same view is no news")
	}
}
