package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// TestBreakerReported: a proxy following its ShardRoute in the API server
// reports an open breaker in status.pods[].breakers (the CRD accepts its
// apply), then half-open when the recovery window ends, and nothing once
// a probe closed it.
func TestBreakerReported(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	member := fleet.Cluster("label")
	cs := kubernetes.NewForConfigOrDie(member.Config)
	seed(t, ctx, cs)
	const rulesNS = "policy-report"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rulesNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	ns := nsName(9)
	p := breakerPolicy(ctrlmeshv1alpha1.CircuitBreakerSpec{Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "cm", Match: configMapsIn(ns),
		FailureRatioPercent: ptr.To[int32](100), MinRequests: 1, WindowSeconds: 10, OpenSeconds: 2, HalfOpenProbes: 1}}})
	p.FaultInjections = []ctrlmeshv1alpha1.RouteFaultInjection{{Name: "fi", Generation: 1, Spec: ctrlmeshv1alpha1.FaultInjectionSpec{
		ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: "demo"},
		Faults:         []ctrlmeshv1alpha1.Fault{{Name: "once", Percent: 100, Match: configMapsIn(ns, "list"), Abort: &ctrlmeshv1alpha1.FaultAbort{StatusCode: 500}}},
	}}}
	r := policyRoute("rep1", p)
	r.Namespace = rulesNS
	if err := member.Client.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	a := runProxy(t, ctx, proxy.Options{Upstream: member.Config, Pod: "pod-a", RulesNamespace: rulesNS, RulesName: r.Name, Mode: rules.ModeLabel})
	awaitReported(t, ctx, member.Client, client.ObjectKeyFromObject(r), "pod-a", "rep1")
	breakers := func() []ctrlmeshv1alpha1.PodBreakerStatus {
		var got ctrlmeshv1alpha1.ShardRoute
		if err := member.Client.Get(ctx, client.ObjectKeyFromObject(r), &got); err != nil {
			t.Fatal(err)
		}
		for _, pod := range got.Status.Pods {
			if pod.Name == "pod-a" {
				return pod.Breakers
			}
		}
		return nil
	}
	// One injected failure of a list opens it.
	if code, _, body := rawGet(t, a, "/api/v1/namespaces/"+ns+"/configmaps"); code != http.StatusInternalServerError {
		t.Fatalf("the injected failure: %d %s", code, body)
	}
	for _, want := range []ctrlmeshv1alpha1.BreakerState{ctrlmeshv1alpha1.BreakerOpen, ctrlmeshv1alpha1.BreakerHalfOpen} {
		eventually(t, "breaker reported "+string(want), func() (bool, string) {
			b := breakers()
			return len(b) == 1 && b[0].Policy == "cb" && b[0].Name == "cm" && b[0].State == want, "reported: " + describe(b)
		})
	}
	// A GET is the probe; it succeeds and the breaker closes.
	if code, _, body := rawGet(t, a, "/api/v1/namespaces/"+ns+"/configmaps/cm"); code != http.StatusOK {
		t.Fatalf("the probe: %d %s", code, body)
	}
	eventually(t, "closed breaker no longer reported", func() (bool, string) {
		b := breakers()
		return len(b) == 0, "reported: " + describe(b)
	})
}

func describe(b []ctrlmeshv1alpha1.PodBreakerStatus) string {
	out := ""
	for _, x := range b {
		out += x.Policy + "/" + x.Name + "=" + string(x.State) + "@" + x.LastTransitionTime.Format(time.RFC3339) + " "
	}
	return out
}
