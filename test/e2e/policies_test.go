package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/fleettest"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// policyWithin bounds each wait for the policies' effect: a change on the
// hub reaches the Works, the members' ShardRoutes and the proxies, whose
// reports come back the same way into the hub's status.
const policyWithin = 45 * time.Second

// TestTrafficPolicies applies the README's worked examples, one
// CircuitBreaker and one FaultInjection (scenarios/policies), on the hub to
// the demo operator running with two pods in each of two members, the
// FaultInjection with one more fault: every ConfigMap patch of the operator
// aborted with 500. Every proxy in both members enforces both policies'
// generation (the hub's status per cluster: 2 of 2 proxies); the operator
// gets the injected error; the example's breaker on ConfigMap requests
// opens in both members, and the hub's status and ctrlmeshctl status show
// it Open there, with its pods and since when. With the FaultInjection
// deleted, the breaker's half-open probes pass and it closes in every
// proxy (the hub's status shows no breaker that is not closed) and every
// object is reconciled by its owner again; a new generation of the
// CircuitBreaker then reaches every proxy. No object is ever reconciled by
// two pods at once.
func TestTrafficPolicies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts API servers and operator processes")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctrlmeshctl := buildCtrlmeshctl(t)
	f := fleettest.StartFleet(t, ctx, localfleet.Options{Members: []string{member1, member2}, MemberFeatureGates: []string{controlplane.FeatureShardedListAndWatch}})
	objects := f.MemberObjects(t, ctx)
	run, placed := f.Apply(fleettest.ShardingConfig(ctrlmeshv1alpha1.ScopePerCluster), objects, fleettest.PerCluster, 90*time.Second, nil)
	hub := f.Hub.Client

	// The examples as the README shows them, bound to the fleet's
	// ShardingConfig. The breaker on ConfigMap requests stays open 3 s
	// instead of 30, for the test's length.
	cb := &ctrlmeshv1alpha1.CircuitBreaker{}
	readExample(t, "circuitbreaker.yaml", cb)
	cb.Namespace, cb.Spec.ShardingConfig.Name = fleettest.OpNamespace, fleettest.OpName
	const breaker = "configmap-writes"
	i := slices.IndexFunc(cb.Spec.Breakers, func(b ctrlmeshv1alpha1.Breaker) bool { return b.Name == breaker })
	if i < 0 {
		t.Fatalf("the example CircuitBreaker has no breaker %s", breaker)
	}
	cb.Spec.Breakers[i].OpenSeconds = 3
	fi := &ctrlmeshv1alpha1.FaultInjection{}
	readExample(t, "faultinjection.yaml", fi)
	fi.Namespace, fi.Spec.ShardingConfig.Name = fleettest.OpNamespace, fleettest.OpName
	// The example's own faults hit Deployment updates of the canary in a
	// window and an external host: nothing the demo operator does. This
	// one hits what it does on every reconcile that changes something, with
	// 500: client-go retries a 503 (which comes with Retry-After), not a
	// 500, so each failed reconcile is the fault's, in the operator's log.
	const fault = "configmap-write-errors"
	fi.Spec.Faults = append(fi.Spec.Faults, ctrlmeshv1alpha1.Fault{Name: fault,
		Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}},
			Verbs: []ctrlmeshv1alpha1.Verb{"patch"}},
		Percent: 100, Abort: &ctrlmeshv1alpha1.FaultAbort{StatusCode: 500}})

	t0 := time.Now()
	env.Create(t, ctx, hub, cb)
	env.Create(t, ctx, hub, fi)
	f.Logf("CircuitBreaker %s and FaultInjection %s applied", cb.Name, fi.Name)

	// Every proxy in both members enforces both.
	enforcedEverywhere(t, f, cb, 1, t0)
	enforcedEverywhere(t, f, fi, 1, t0)

	// The fault lands: each pod's operator got the proxy's injected 503.
	injected := fmt.Sprintf("fault %s of FaultInjection %s injected", fault, fi.Name)
	env.Eventually(t, policyWithin, "every operator pod got the injected fault", func() error {
		for _, m := range []string{member1, member2} {
			for n := range 2 {
				log := filepath.Join(f.WorkDir, "logs", fmt.Sprintf("%s-%s-%d-operator.log", m, m, n))
				data, err := os.ReadFile(log)
				if err != nil {
					return err
				}
				if !strings.Contains(string(data), injected) {
					return fmt.Errorf("%s has no %q yet", log, injected)
				}
			}
		}
		return nil
	})
	f.Logf("every operator pod got the injected fault")

	// The breaker opens in both members, and the hub says so.
	key := client.ObjectKeyFromObject(cb)
	env.Eventually(t, policyWithin, "the breaker Open in both members in the hub's status", func() error {
		var cur ctrlmeshv1alpha1.CircuitBreaker
		if err := hub.Get(ctx, key, &cur); err != nil {
			return err
		}
		for _, m := range []string{member1, member2} {
			b := clusterBreaker(&cur, m, breaker)
			if b == nil || b.State != ctrlmeshv1alpha1.BreakerOpen {
				return fmt.Errorf("%s: breaker %s is %+v, status %+v", m, breaker, b, cur.Status.Clusters)
			}
			if len(b.Pods) == 0 || slices.ContainsFunc(b.Pods, func(p string) bool { return !strings.HasPrefix(p, m+"-") }) {
				return fmt.Errorf("%s: breaker %s open in pods %v, not the member's", m, breaker, b.Pods)
			}
			// Truncated to the second by the proxies, on this machine's clock.
			if b.LastTransitionTime.Time.Before(t0.Truncate(time.Second)) || b.LastTransitionTime.Time.After(time.Now()) {
				return fmt.Errorf("%s: breaker %s open since %v, not since the policies were applied at %v", m, breaker, b.LastTransitionTime, t0)
			}
		}
		return nil
	})
	f.Logf("breaker %s Open in both members in the hub's status", breaker)

	// ctrlmeshctl status prints it so.
	var out string
	env.Eventually(t, policyWithin, "ctrlmeshctl status shows the breaker open in both members", func() error {
		cmd := exec.CommandContext(ctx, ctrlmeshctl, "status", fleettest.OpName, "-n", fleettest.OpNamespace, "--kubeconfig", f.Hub.KubeconfigPath)
		b, err := cmd.CombinedOutput()
		out = string(b)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		for _, want := range []string{
			`(?m)^CircuitBreaker ` + fleettest.OpNamespace + `/` + cb.Name + `: generation 1, observed 1$`,
			`(?m)^FaultInjection ` + fleettest.OpNamespace + `/` + fi.Name + `: generation 1, observed 1$`,
			`(?m)^` + member1 + `\s+2/2\s+` + breaker + `\s+Open\s+` + member1 + `-[01](,` + member1 + `-1)?\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\s*$`,
			`(?m)^` + member2 + `\s+2/2\s+` + breaker + `\s+Open\s+` + member2 + `-[01](,` + member2 + `-1)?\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\s*$`,
			`(?m)^` + member1 + `\s+2/2\s*$`,
			`(?m)^` + member2 + `\s+2/2\s*$`,
		} {
			if !regexp.MustCompile(want).MatchString(out) {
				return fmt.Errorf("no line matching %s in\n%s", want, out)
			}
		}
		return nil
	})
	f.Logf("ctrlmeshctl status:\n%s", out)

	// Without the fault, the breaker's half-open probes pass: it closes in
	// every proxy.
	if err := hub.Delete(ctx, fi); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	env.Eventually(t, policyWithin, "the breaker closed in every proxy of both members", func() error {
		var cur ctrlmeshv1alpha1.CircuitBreaker
		if err := hub.Get(ctx, key, &cur); err != nil {
			return err
		}
		if len(cur.Status.Clusters) != 2 {
			return fmt.Errorf("status %+v", cur.Status.Clusters)
		}
		for _, c := range cur.Status.Clusters {
			if len(c.Breakers) > 0 || c.Proxies != 2 || c.Enforcing != 2 {
				return fmt.Errorf("%s: %+v", c.Cluster, c)
			}
		}
		return nil
	})
	f.Logf("breaker %s closed in both members %.1fs after the FaultInjection's deletion", breaker, time.Since(t1).Seconds())
	// The operator writes again: every object, changed once more, is
	// reconciled by its owner.
	t1 = run.Begin("breaker closed")
	f.Probe(objects, "breaker closed")
	f.ReconciledSince("breaker closed", t1, fleettest.ServedWithin, placed, objects, fleettest.PerCluster)

	// A new generation of the CircuitBreaker reaches every proxy again.
	t2 := run.Begin("policy edited")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur ctrlmeshv1alpha1.CircuitBreaker
		if err := hub.Get(ctx, key, &cur); err != nil {
			return err
		}
		cur.Spec.Breakers[i].OpenSeconds = 4
		return hub.Update(ctx, &cur)
	})
	if err != nil {
		t.Fatal(err)
	}
	enforcedEverywhere(t, f, cb, 2, t2)
	run.Finish()
}

// buildCtrlmeshctl builds the command users run, for the test to run it.
func buildCtrlmeshctl(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "ctrlmeshctl")
	build := exec.Command("go", "build", "-o", bin, "./cmd/ctrlmeshctl")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building ctrlmeshctl: %v\n%s", err, out)
	}
	return bin
}

// readExample reads a worked example of scenarios/policies into obj.
func readExample(t *testing.T, file string, obj client.Object) {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "scenarios", "policies", file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// policyObject is a traffic policy as a client object.
type policyObject interface {
	client.Object
	ctrlmeshv1alpha1.Policy
}

// enforcedEverywhere waits until the hub's status of p reports its
// generation enforced by every proxy in both members (the two operator
// pods of each), and Enforced True.
func enforcedEverywhere(t *testing.T, f *fleettest.Fleet, p policyObject, generation int64, since time.Time) {
	t.Helper()
	what := fmt.Sprintf("%T %s generation %d enforced by every proxy", p, p.GetName(), generation)
	env.Eventually(t, policyWithin, what, func() error {
		if err := f.Err(); err != nil {
			return err
		}
		if err := f.Hub.Client.Get(context.Background(), client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		st := p.PolicyStatus()
		if p.GetGeneration() != generation || st.ObservedGeneration != generation {
			return fmt.Errorf("generation %d, observed %d", p.GetGeneration(), st.ObservedGeneration)
		}
		var clusters []string
		for _, c := range st.Clusters {
			clusters = append(clusters, c.Cluster)
			if c.Proxies != 2 || c.Enforcing != 2 {
				return fmt.Errorf("%s: %d of %d proxies enforce it, want 2 of 2", c.Cluster, c.Enforcing, c.Proxies)
			}
		}
		if !slices.Equal(clusters, []string{member1, member2}) {
			return fmt.Errorf("clusters %v", clusters)
		}
		if !meta.IsStatusConditionTrue(st.Conditions, ctrlmeshv1alpha1.ConditionEnforced) {
			return fmt.Errorf("conditions %+v", st.Conditions)
		}
		return nil
	})
	f.Logf("%s %.1fs after the change", what, time.Since(since).Seconds())
}

// clusterBreaker is the hub's status of breaker name in cluster, nil when
// it is closed in every proxy there.
func clusterBreaker(cb *ctrlmeshv1alpha1.CircuitBreaker, cluster, name string) *ctrlmeshv1alpha1.ClusterBreakerStatus {
	for _, c := range cb.Status.Clusters {
		if c.Cluster != cluster {
			continue
		}
		for i := range c.Breakers {
			if c.Breakers[i].Name == name {
				return &c.Breakers[i]
			}
		}
	}
	return nil
}
