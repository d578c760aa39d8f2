package rbacutil_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/pkg/rbacutil"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestLeaderElectionPriority: a real kube-apiserver classifies a
// component's Lease requests in its namespace, once LeaderElection's
// objects are applied, at the leader-election priority level (through
// their FlowSchema), and its other requests as before. Without the
// FlowSchema the renewals of a ServiceAccount outside kube-system wait in
// workload-low behind the component's own writes (make bench-scale at 1000
// members × 100 configs: 6,400 s of waiting in three minutes, and the hub's
// leader stepped down).
func TestLeaderElectionPriority(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := env.StartCluster(t, ctx, "c")
	const namespace, name, lease = "ctrlmesh", "component-leader-election", "component"
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: "component"}}
	env.Create(t, ctx, c.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	var flowSchema *flowcontrolv1.FlowSchema
	for _, obj := range rbacutil.LeaderElection(namespace, name, lease, nil, subjects) {
		env.Create(t, ctx, c.Client, obj)
		if fs, ok := obj.(*flowcontrolv1.FlowSchema); ok {
			flowSchema = fs
		}
	}
	if flowSchema == nil {
		t.Fatal("LeaderElection returns no FlowSchema")
	}
	var level flowcontrolv1.PriorityLevelConfiguration
	if err := c.Client.Get(ctx, types.NamespacedName{Name: rbacutil.LeaderElectionPriorityLevel}, &level); err != nil {
		t.Fatalf("the API server's suggested priority level: %v", err)
	}
	identity, err := c.AddUser("system:serviceaccount:"+namespace+":component", "system:serviceaccounts", "system:serviceaccounts:"+namespace)
	if err != nil {
		t.Fatal(err)
	}
	httpClient, err := rest.HTTPClientFor(identity)
	if err != nil {
		t.Fatal(err)
	}
	// classify is the FlowSchema and priority level the API server put a
	// GET of path in, from the response's APF headers (set before
	// authorization: a refused request has them too).
	classify := func(path string) (flowSchemaUID, levelUID string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, identity.Host+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedFlowSchemaUID), resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedPriorityLevelConfigurationUID)
	}
	leasePath := fmt.Sprintf("/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s", namespace, lease)
	// The API server's flow control takes its configuration from its
	// informers: allow it a while.
	var gotSchema, gotLevel string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if gotSchema, gotLevel = classify(leasePath); gotSchema == string(flowSchema.UID) {
			break
		}
	}
	if gotSchema != string(flowSchema.UID) || gotLevel != string(level.UID) {
		t.Errorf("a Lease GET went to FlowSchema %q, priority level %q; want FlowSchema %s (%s), priority level %s (%s)",
			gotSchema, gotLevel, flowSchema.Name, flowSchema.UID, level.Name, level.UID)
	}
	// Only the Lease requests: the component's other requests keep the
	// classification every ServiceAccount has.
	if other, _ := classify(fmt.Sprintf("/api/v1/namespaces/%s/configmaps", namespace)); other == "" || other == string(flowSchema.UID) {
		t.Errorf("a ConfigMap list went to FlowSchema %q; want another than %s", other, flowSchema.Name)
	}
	var applied flowcontrolv1.FlowSchema
	if err := c.Client.Get(ctx, client.ObjectKeyFromObject(flowSchema), &applied); err != nil {
		t.Fatal(err)
	}
	for _, cond := range applied.Status.Conditions {
		if cond.Type == flowcontrolv1.FlowSchemaConditionDangling && cond.Status != flowcontrolv1.ConditionFalse {
			t.Errorf("the FlowSchema is dangling: %s", cond.Message)
		}
	}
}
