package shardingconfig_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// overlapConfig is a ShardingConfig of the cluster selecting pods by labels.
func overlapConfig(namespace, name, cluster string, selector map[string]string) *ctrlmeshv1alpha1.ShardingConfig {
	return &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector: metav1.LabelSelector{MatchLabels: selector},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
			}}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{cluster}},
			Scope:    ctrlmeshv1alpha1.ScopePerCluster,
		},
	}
}

// degradedOf is the config's Degraded condition, or an error while it has
// none.
func degradedOf(ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig) (*metav1.Condition, error) {
	var got ctrlmeshv1alpha1.ShardingConfig
	if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
		return nil, err
	}
	c := meta.FindStatusCondition(got.Status.Conditions, ctrlmeshv1alpha1.ConditionDegraded)
	if c == nil {
		return nil, fmt.Errorf("%s has no Degraded condition", sc.Name)
	}
	return c, nil
}

// placedPods are the pods the config's published rules for the cluster give
// a shard.
func placedPods(t *testing.T, ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig, cluster string) []string {
	t.Helper()
	work, err := workOf(t, ctx, sc, cluster)
	if err != nil {
		t.Fatal(err)
	}
	route, err := routework.Decode(work)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, shard := range route.Spec.Shards {
		for _, p := range shard.Pods {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out
}

// TestOverlappingSelectorsReported: two ShardingConfigs of one namespace
// whose selectors do not imply each other, yet whose routes' statuses report
// one pod under both. Both are Degraded with SelectorOverlap naming the
// other and the pod; the one created later does not place the pod, the
// first does; the later gets a Warning Event.
func TestOverlappingSelectorsReported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	startHub(t)
	cluster := unique("overlap")
	joinCluster(t, ctx, cluster)
	namespace := unique("overlap-ops")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	first := overlapConfig(namespace, "a-first", cluster, map[string]string{"app": "op"})
	env.Create(t, ctx, hub.Client, first)
	second := overlapConfig(namespace, "b-second", cluster, map[string]string{"tier": "control"})
	env.Create(t, ctx, hub.Client, second)

	for _, r := range []struct {
		sc   *ctrlmeshv1alpha1.ShardingConfig
		pods []string
	}{{first, []string{"op-0", "op-a"}}, {second, []string{"op-0", "op-b"}}} {
		env.Eventually(t, 30*time.Second, "the Work of "+r.sc.Name, func() error {
			_, err := workOf(t, ctx, r.sc, cluster)
			return err
		})
		work, err := workOf(t, ctx, r.sc, cluster)
		if err != nil {
			t.Fatal(err)
		}
		reportPods(t, ctx, work, r.pods...)
	}

	shared := cluster + "/op-0"
	env.Eventually(t, 30*time.Second, "both configs degraded by the overlap, the shared pod placed by the first only", func() error {
		for _, c := range []struct {
			sc          *ctrlmeshv1alpha1.ShardingConfig
			other, says string
			placed      []string
		}{
			{first, second.Name, "this one was created first and keeps them", []string{"op-0", "op-a"}},
			{second, first.Name, "this one does not place them", []string{"op-b"}},
		} {
			cond, err := degradedOf(ctx, c.sc)
			if err != nil {
				return err
			}
			if cond.Status != metav1.ConditionTrue || cond.Reason != ctrlmeshv1alpha1.ReasonSelectorOverlap ||
				!strings.Contains(cond.Message, "ShardingConfig "+c.other) || !strings.Contains(cond.Message, shared) || !strings.Contains(cond.Message, c.says) {
				return fmt.Errorf("%s: Degraded %s %s %q; want %s naming %s, %s and %q", c.sc.Name, cond.Status, cond.Reason, cond.Message,
					ctrlmeshv1alpha1.ReasonSelectorOverlap, c.other, shared, c.says)
			}
			if got := placedPods(t, ctx, c.sc, cluster); !slices.Equal(got, c.placed) {
				return fmt.Errorf("%s places %v, want %v", c.sc.Name, got, c.placed)
			}
		}
		return nil
	})
	env.Eventually(t, 30*time.Second, "a Warning Event on "+second.Name, func() error {
		var events corev1.EventList
		sel := fields.AndSelectors(
			fields.OneTermEqualSelector("involvedObject.name", second.Name),
			fields.OneTermEqualSelector("reason", ctrlmeshv1alpha1.ReasonSelectorOverlap),
		)
		if err := hub.Client.List(ctx, &events, client.InNamespace(namespace), client.MatchingFieldsSelector{Selector: sel}); err != nil {
			return err
		}
		if len(events.Items) != 1 || events.Items[0].Type != corev1.EventTypeWarning || !strings.Contains(events.Items[0].Message, shared) {
			return fmt.Errorf("events %+v, want one Warning naming %s", events.Items, shared)
		}
		return nil
	})
}

// TestImpliedSelectorsReportedBeforePods: of two ShardingConfigs, one
// selects with the other's labels and one more, so every pod it selects the
// other does too: reported before any pod is.
func TestImpliedSelectorsReportedBeforePods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	startHub(t)
	cluster := unique("implied")
	joinCluster(t, ctx, cluster)
	namespace := unique("implied-ops")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	wide := overlapConfig(namespace, "a-wide", cluster, map[string]string{"app": "op"})
	narrow := overlapConfig(namespace, "b-narrow", cluster, map[string]string{"app": "op", "tier": "control"})
	env.Create(t, ctx, hub.Client, wide)
	env.Create(t, ctx, hub.Client, narrow)
	// A config of another cluster shares no pod with them.
	elsewhere := unique("implied-elsewhere")
	joinCluster(t, ctx, elsewhere)
	apart := overlapConfig(namespace, "c-apart", elsewhere, map[string]string{"app": "op"})
	env.Create(t, ctx, hub.Client, apart)

	env.Eventually(t, 30*time.Second, "both configs degraded by the overlap", func() error {
		for _, c := range []struct {
			sc, other *ctrlmeshv1alpha1.ShardingConfig
		}{{wide, narrow}, {narrow, wide}} {
			cond, err := degradedOf(ctx, c.sc)
			if err != nil {
				return err
			}
			if cond.Reason != ctrlmeshv1alpha1.ReasonSelectorOverlap || !strings.Contains(cond.Message, "ShardingConfig "+c.other.Name) ||
				strings.Contains(cond.Message, apart.Name) {
				return fmt.Errorf("%s: Degraded %s %q; want %s naming %s alone", c.sc.Name, cond.Reason, cond.Message, ctrlmeshv1alpha1.ReasonSelectorOverlap, c.other.Name)
			}
		}
		cond, err := degradedOf(ctx, apart)
		if err != nil {
			return err
		}
		if cond.Reason == ctrlmeshv1alpha1.ReasonSelectorOverlap {
			return fmt.Errorf("%s, of another cluster: Degraded %s %q", apart.Name, cond.Reason, cond.Message)
		}
		return nil
	})
}

// TestOverlapToldToTheOtherConfig: a config at rest, Ready, whose own
// Works do not change, learns of an overlap from the other config's
// report: the other tells the configs of its namespace when the pods its
// members report change, since a Work's change reconciles its own config
// alone (TestWorkMapsToItsConfig).
func TestOverlapToldToTheOtherConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	startHub(t)
	cluster := unique("told")
	joinCluster(t, ctx, cluster)
	namespace := unique("told-ops")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	first := overlapConfig(namespace, "a-first", cluster, map[string]string{"app": "op"})
	env.Create(t, ctx, hub.Client, first)
	second := overlapConfig(namespace, "b-second", cluster, map[string]string{"tier": "control"})
	env.Create(t, ctx, hub.Client, second)

	// The first config's pods enforce its rules until it is Ready.
	env.Eventually(t, time.Minute, first.Name+" Ready, its proxies enforcing its rules", func() error {
		work, err := workOf(t, ctx, first, cluster)
		if err != nil {
			return err
		}
		route, err := routework.Decode(work)
		if err != nil {
			return err
		}
		status, err := routework.ReadStatus(work)
		if err != nil {
			return err
		}
		if len(status.Route.Pods) != 2 || status.Route.Pods[0].AppliedRulesHash != route.Spec.RulesHash {
			if err := writeReport(ctx, work, "op-0", "op-a"); err != nil {
				return err
			}
		}
		var got ctrlmeshv1alpha1.ShardingConfig
		if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(first), &got); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, ctrlmeshv1alpha1.ConditionReady) || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("%s not Ready: %+v", first.Name, got.Status.Conditions)
		}
		return nil
	})
	if cond, err := degradedOf(ctx, first); err != nil || cond.Reason == ctrlmeshv1alpha1.ReasonSelectorOverlap {
		t.Fatalf("%s before the other's report: Degraded %+v (%v)", first.Name, cond, err)
	}

	// Only the second config's Work changes now.
	env.Eventually(t, 30*time.Second, "the Work of "+second.Name, func() error {
		_, err := workOf(t, ctx, second, cluster)
		return err
	})
	work, err := workOf(t, ctx, second, cluster)
	if err != nil {
		t.Fatal(err)
	}
	reportPods(t, ctx, work, "op-0", "op-b")
	shared := cluster + "/op-0"
	env.Eventually(t, 20*time.Second, first.Name+" degraded by the overlap it was told of", func() error {
		cond, err := degradedOf(ctx, first)
		if err != nil {
			return err
		}
		if cond.Reason != ctrlmeshv1alpha1.ReasonSelectorOverlap || !strings.Contains(cond.Message, "ShardingConfig "+second.Name) || !strings.Contains(cond.Message, shared) {
			return fmt.Errorf("Degraded %s %s %q; want %s naming %s and %s", cond.Status, cond.Reason, cond.Message, ctrlmeshv1alpha1.ReasonSelectorOverlap, second.Name, shared)
		}
		return nil
	})
}
