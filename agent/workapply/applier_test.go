package workapply_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	workv1alpha2 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestApplyLifecycle follows one Work: applied, edited, its route's status
// reflected, the route deleted behind the applier's back, the Work deleted.
func TestApplyLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := newAgent(t, ctx, "lifecycle")
	a.start(t)

	work := newWork(a.execNS, "rules", mustJSON(t, route(a.memberNS, "op", "hash-1")))
	work.Labels = map[string]string{workv1alpha2.WorkPermanentIDLabel: "id-1"}
	if err := hub.Client.Create(ctx, work); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the ShardRoute is applied with Karmada's label and annotations", func() error {
		r, err := getRoute(ctx, a.memberNS, "op")
		if err != nil {
			return err
		}
		wantLabels := map[string]string{"karmada.io/managed": "true", workv1alpha2.WorkPermanentIDLabel: "id-1"}
		wantAnnotations := map[string]string{workv1alpha2.WorkNamespaceAnnotation: a.execNS, workv1alpha2.WorkNameAnnotation: "rules"}
		if r.Spec.RulesHash != "hash-1" || !reflect.DeepEqual(r.Labels, wantLabels) || !reflect.DeepEqual(r.Annotations, wantAnnotations) {
			return fmt.Errorf("rulesHash %q, labels %v, annotations %v", r.Spec.RulesHash, r.Labels, r.Annotations)
		}
		return nil
	})
	env.Eventually(t, 30*time.Second, "the Work reports the route applied, with no status yet", func() error {
		w, err := getWork(ctx, a.execNS, "rules")
		if err != nil {
			return err
		}
		if err := appliedIs(w, metav1.ConditionTrue, "AppliedSuccessful"); err != nil {
			return err
		}
		want := []workv1alpha1.ManifestStatus{{
			Identifier: workv1alpha1.ResourceIdentifier{Ordinal: 0, Group: "ctrlmesh.io", Version: "v1alpha1", Kind: "ShardRoute",
				Resource: "shardroutes", Namespace: a.memberNS, Name: "op"},
			Health: workv1alpha1.ResourceUnknown,
		}}
		if !reflect.DeepEqual(w.Status.ManifestStatuses, want) {
			return fmt.Errorf("manifestStatuses %+v, want %+v", w.Status.ManifestStatuses, want)
		}
		return nil
	})

	// The hub edits the manifest.
	updateWork(t, ctx, a.execNS, "rules", func(w *workv1alpha1.Work) {
		w.Spec.Workload.Manifests[0].Raw = mustJSON(t, route(a.memberNS, "op", "hash-2"))
	})
	var applied *ctrlmeshv1alpha1.ShardRoute
	env.Eventually(t, 30*time.Second, "the edit reaches the member", func() error {
		var err error
		applied, err = getRoute(ctx, a.memberNS, "op")
		if err != nil {
			return err
		}
		if applied.Spec.RulesHash != "hash-2" || applied.Generation != 2 {
			return fmt.Errorf("rulesHash %q, generation %d", applied.Spec.RulesHash, applied.Generation)
		}
		return nil
	})

	// The member's status controller reports, and the Work follows: the
	// whole status, and the health it implies.
	for _, tc := range []struct {
		proxiesReady metav1.ConditionStatus
		want         workv1alpha1.ResourceHealth
	}{
		{metav1.ConditionTrue, workv1alpha1.ResourceHealthy},
		{metav1.ConditionFalse, workv1alpha1.ResourceUnhealthy},
	} {
		applied.Status = ctrlmeshv1alpha1.ShardRouteStatus{
			ObservedGeneration: applied.Generation, ObservedRoutingGeneration: 1,
			Pods: []ctrlmeshv1alpha1.PodRouteStatus{{Name: "op-0", Ready: true, Shard: "0", AppliedRulesHash: "hash-2"}},
			Conditions: []metav1.Condition{
				{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue, Reason: "Applied", LastTransitionTime: metav1.Now()},
				{Type: ctrlmeshv1alpha1.ConditionProxiesReady, Status: tc.proxiesReady, Reason: "Reported", LastTransitionTime: metav1.Now()},
			},
		}
		if err := member.Client.Status().Update(ctx, applied); err != nil {
			t.Fatal(err)
		}
		env.Eventually(t, 30*time.Second, fmt.Sprintf("ProxiesReady %s is reflected as %s", tc.proxiesReady, tc.want), func() error {
			w, err := getWork(ctx, a.execNS, "rules")
			if err != nil {
				return err
			}
			if len(w.Status.ManifestStatuses) != 1 || w.Status.ManifestStatuses[0].Status == nil {
				return fmt.Errorf("manifestStatuses %+v", w.Status.ManifestStatuses)
			}
			ms := w.Status.ManifestStatuses[0]
			var reflected ctrlmeshv1alpha1.ShardRouteStatus
			if err := json.Unmarshal(ms.Status.Raw, &reflected); err != nil {
				return err
			}
			if ms.Health != tc.want || reflected.ObservedGeneration != applied.Generation || len(reflected.Pods) != 1 ||
				meta.FindStatusCondition(reflected.Conditions, ctrlmeshv1alpha1.ConditionProxiesReady).Status != tc.proxiesReady {
				return fmt.Errorf("health %s, status %s", ms.Health, ms.Status.Raw)
			}
			return nil
		})
	}

	// Nothing ticks: with nothing happening, neither object is written.
	w, err := getWork(ctx, a.execNS, "rules")
	if err != nil {
		t.Fatal(err)
	}
	r, err := getRoute(ctx, a.memberNS, "op")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	w2, err := getWork(ctx, a.execNS, "rules")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := getRoute(ctx, a.memberNS, "op")
	if err != nil {
		t.Fatal(err)
	}
	if w2.ResourceVersion != w.ResourceVersion || r2.ResourceVersion != r.ResourceVersion {
		t.Errorf("written while nothing happened: Work resourceVersion %s -> %s, ShardRoute %s -> %s",
			w.ResourceVersion, w2.ResourceVersion, r.ResourceVersion, r2.ResourceVersion)
	}

	// A route deleted in the member comes back.
	if err := member.Client.Delete(ctx, r2); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the deleted route is recreated", func() error {
		r3, err := getRoute(ctx, a.memberNS, "op")
		if err != nil {
			return err
		}
		if r3.UID == r2.UID || r3.Spec.RulesHash != "hash-2" {
			return fmt.Errorf("uid %s (was %s), rulesHash %q", r3.UID, r2.UID, r3.Spec.RulesHash)
		}
		return nil
	})

	// The Work goes, and so does the route.
	if err := hub.Client.Delete(ctx, w2); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the route of the deleted Work is deleted", func() error { return notFound(ctx, a.memberNS, "op") })
}

// TestDeleteWhileStopped: a Work deleted while no applier runs loses its
// route when one starts again, as does a managed route whose Work never
// existed; the routes of existing Works and unmanaged routes stay.
func TestDeleteWhileStopped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := newAgent(t, ctx, "restart")
	stop := a.start(t)
	for _, name := range []string{"gone", "kept"} {
		if err := hub.Client.Create(ctx, newWork(a.execNS, name, mustJSON(t, route(a.memberNS, name, "h")))); err != nil {
			t.Fatal(err)
		}
	}
	var kept *ctrlmeshv1alpha1.ShardRoute
	env.Eventually(t, 30*time.Second, "both routes are applied", func() error {
		if _, err := getRoute(ctx, a.memberNS, "gone"); err != nil {
			return err
		}
		var err error
		kept, err = getRoute(ctx, a.memberNS, "kept")
		return err
	})
	stop()

	if err := hub.Client.Delete(ctx, newWork(a.execNS, "gone")); err != nil {
		t.Fatal(err)
	}
	orphan := route(a.memberNS, "orphan", "h")
	orphan.Labels = map[string]string{"karmada.io/managed": "true"}
	orphan.Annotations = map[string]string{workv1alpha2.WorkNamespaceAnnotation: a.execNS, workv1alpha2.WorkNameAnnotation: "never-existed"}
	unmanaged := route(a.memberNS, "unmanaged", "h")
	unmanaged.Annotations = orphan.Annotations
	for _, r := range []*ctrlmeshv1alpha1.ShardRoute{orphan, unmanaged} {
		if err := member.Client.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}

	a.start(t)
	env.Eventually(t, 30*time.Second, "the routes of missing Works are deleted", func() error {
		return errors.Join(notFound(ctx, a.memberNS, "gone"), notFound(ctx, a.memberNS, "orphan"))
	})
	for _, name := range []string{"kept", "unmanaged"} {
		r, err := getRoute(ctx, a.memberNS, name)
		if err != nil {
			t.Fatalf("route %s: %v", name, err)
		}
		if name == "kept" && r.UID != kept.UID {
			t.Errorf("route kept was replaced: uid %s -> %s", kept.UID, r.UID)
		}
	}
}

// TestConflicts: a route in the member that was not applied from the Work
// is left alone, with the refusal on the Work and an Event on the route,
// until the conflict is resolved.
func TestConflicts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := newAgent(t, ctx, "conflicts")
	a.start(t)

	for _, tc := range []struct {
		name string
		// existing creates the conflicting route of that name.
		existing func(t *testing.T, name string)
		// want is in the Applied condition's message.
		want string
		// resolve resolves the conflict so that the Work of that name applies.
		resolve func(t *testing.T, name string)
	}{
		{
			name: "unmanaged",
			existing: func(t *testing.T, name string) {
				if err := member.Client.Create(ctx, route(a.memberNS, name, "theirs")); err != nil {
					t.Fatal(err)
				}
			},
			want: "was not applied from a Work",
			resolve: func(t *testing.T, name string) {
				updateWork(t, ctx, a.execNS, name, func(w *workv1alpha1.Work) {
					w.Annotations = map[string]string{workv1alpha2.ResourceConflictResolutionAnnotation: workv1alpha2.ResourceConflictResolutionOverwrite}
				})
			},
		},
		{
			name: "of-another-work",
			existing: func(t *testing.T, name string) {
				if err := hub.Client.Create(ctx, newWork(a.execNS, name+"-first", mustJSON(t, route(a.memberNS, name, "theirs")))); err != nil {
					t.Fatal(err)
				}
				env.Eventually(t, 30*time.Second, "the first Work is applied", func() error {
					_, err := getRoute(ctx, a.memberNS, name)
					return err
				})
			},
			want: "was applied from Work " + a.execNS + "/of-another-work-first",
			resolve: func(t *testing.T, _ string) {
				if err := hub.Client.Delete(ctx, newWork(a.execNS, "of-another-work-first")); err != nil {
					t.Fatal(err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.existing(t, tc.name)
			before, err := getRoute(ctx, a.memberNS, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if err := hub.Client.Create(ctx, newWork(a.execNS, tc.name, mustJSON(t, route(a.memberNS, tc.name, "ours")))); err != nil {
				t.Fatal(err)
			}
			env.Eventually(t, 30*time.Second, "the Work reports the conflict", func() error {
				work, err := getWork(ctx, a.execNS, tc.name)
				if err != nil {
					return err
				}
				if err := appliedIs(work, metav1.ConditionFalse, "AppliedFailed"); err != nil {
					return err
				}
				if msg := meta.FindStatusCondition(work.Status.Conditions, workv1alpha1.WorkApplied).Message; !strings.Contains(msg, tc.want) ||
					!strings.Contains(msg, "work.karmada.io/conflict-resolution=overwrite") {
					return fmt.Errorf("message %q, want it to contain %q and how to take the route over", msg, tc.want)
				}
				return nil
			})
			env.Eventually(t, 30*time.Second, "a Warning Event names the conflict on the member route", func() error {
				var events corev1.EventList
				if err := member.Client.List(ctx, &events, client.InNamespace(a.memberNS)); err != nil {
					return err
				}
				for _, e := range events.Items {
					if e.InvolvedObject.Name == tc.name && e.InvolvedObject.Kind == "ShardRoute" && e.Type == corev1.EventTypeWarning &&
						e.Reason == "SyncFailed" && strings.Contains(e.Message, a.execNS+"/"+tc.name) {
						return nil
					}
				}
				return fmt.Errorf("no such Event among %d", len(events.Items))
			})
			after, err := getRoute(ctx, a.memberNS, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if after.ResourceVersion != before.ResourceVersion || after.Spec.RulesHash != "theirs" {
				t.Fatalf("the conflicting route was written: resourceVersion %s -> %s, rulesHash %q", before.ResourceVersion, after.ResourceVersion, after.Spec.RulesHash)
			}

			tc.resolve(t, tc.name)
			env.Eventually(t, 30*time.Second, "once resolved, the Work is applied", func() error {
				r, err := getRoute(ctx, a.memberNS, tc.name)
				if err != nil {
					return err
				}
				if r.Spec.RulesHash != "ours" || r.Annotations[workv1alpha2.WorkNameAnnotation] != tc.name {
					return fmt.Errorf("rulesHash %q, annotations %v", r.Spec.RulesHash, r.Annotations)
				}
				w, err := getWork(ctx, a.execNS, tc.name)
				if err != nil {
					return err
				}
				return appliedIs(w, metav1.ConditionTrue, "AppliedSuccessful")
			})
		})
	}
}

// TestBadManifests: Works the agent cannot apply say why, and nothing is
// applied or deleted.
func TestBadManifests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := newAgent(t, ctx, "bad")
	a.start(t)

	withSpec := func(name string, edit func(spec map[string]any)) []byte {
		var obj map[string]any
		if err := json.Unmarshal(mustJSON(t, route(a.memberNS, name, "h")), &obj); err != nil {
			t.Fatal(err)
		}
		edit(obj["spec"].(map[string]any))
		return mustJSON(t, obj)
	}
	invalid := route(a.memberNS, "refused", "h")
	invalid.Spec.Buckets = 30
	noNamespace := route("", "no-namespace", "h")
	configMap := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Namespace: a.memberNS, Name: "cm"}}

	for _, tc := range []struct {
		name      string
		manifests [][]byte
		// want is in the Applied condition's message.
		want string
		// routes must not appear in the member.
		routes []string
	}{
		{name: "no-manifest", want: "the Work has 0 manifests"},
		{name: "two-manifests", manifests: [][]byte{mustJSON(t, route(a.memberNS, "two-a", "h")), mustJSON(t, route(a.memberNS, "two-b", "h"))},
			want: "the Work has 2 manifests", routes: []string{"two-a", "two-b"}},
		{name: "another-kind", manifests: [][]byte{mustJSON(t, configMap)}, want: `manifest 0 is a "ConfigMap" of "v1"`},
		{name: "undecodable", manifests: [][]byte{withSpec("undecodable", func(s map[string]any) { s["buckets"] = "thirty-two" })},
			want: "manifest 0 is not a valid ShardRoute: json: cannot unmarshal string", routes: []string{"undecodable"}},
		{name: "unknown-field", manifests: [][]byte{withSpec("unknown-field", func(s map[string]any) { s["shardz"] = []any{} })},
			want: `unknown field "spec.shardz"`, routes: []string{"unknown-field"}},
		{name: "no-namespace", manifests: [][]byte{mustJSON(t, noNamespace)}, want: "needs both metadata.namespace and metadata.name"},
		{name: "refused-by-the-member", manifests: [][]byte{mustJSON(t, invalid)}, want: "buckets must be a power of two", routes: []string{"refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := hub.Client.Create(ctx, newWork(a.execNS, tc.name, tc.manifests...)); err != nil {
				t.Fatal(err)
			}
			env.Eventually(t, 30*time.Second, "the Work says why it is not applied", func() error {
				w, err := getWork(ctx, a.execNS, tc.name)
				if err != nil {
					return err
				}
				if err := appliedIs(w, metav1.ConditionFalse, "AppliedFailed"); err != nil {
					return err
				}
				if msg := meta.FindStatusCondition(w.Status.Conditions, workv1alpha1.WorkApplied).Message; !strings.Contains(msg, tc.want) {
					return fmt.Errorf("message %q, want it to contain %q", msg, tc.want)
				}
				return nil
			})
			for _, name := range tc.routes {
				if err := notFound(ctx, a.memberNS, name); err != nil {
					t.Error(err)
				}
			}
		})
	}

	// A bad edit of an applied Work deletes nothing and keeps its route.
	if err := hub.Client.Create(ctx, newWork(a.execNS, "good", mustJSON(t, route(a.memberNS, "good", "h")))); err != nil {
		t.Fatal(err)
	}
	var good *ctrlmeshv1alpha1.ShardRoute
	env.Eventually(t, 30*time.Second, "the good Work is applied", func() error {
		var err error
		good, err = getRoute(ctx, a.memberNS, "good")
		return err
	})
	updateWork(t, ctx, a.execNS, "good", func(w *workv1alpha1.Work) {
		w.Spec.Workload.Manifests = append(w.Spec.Workload.Manifests, w.Spec.Workload.Manifests[0])
	})
	env.Eventually(t, 30*time.Second, "the bad edit is refused", func() error {
		w, err := getWork(ctx, a.execNS, "good")
		if err != nil {
			return err
		}
		return appliedIs(w, metav1.ConditionFalse, "AppliedFailed")
	})
	r, err := getRoute(ctx, a.memberNS, "good")
	if err != nil {
		t.Fatalf("the route of a Work edited badly: %v", err)
	}
	if r.ResourceVersion != good.ResourceVersion {
		t.Errorf("the route of a Work edited badly was written: resourceVersion %s -> %s", good.ResourceVersion, r.ResourceVersion)
	}
}
