package proxy_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestRulesFromTheAPIServer: the proxy follows its ShardRoute through the API
// server and reports the hash it has applied into the route's status, under
// its own field manager, again after anyone overwrites it — running as a
// user with only the operator's own rights plus deploy/rbac/proxy.yaml bound
// in the operator's namespace, so that shipped RBAC is shown to be enough.
func TestRulesFromTheAPIServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster := fleet.Cluster("label")
	c := cluster.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "api-rules"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	r := route("a1", 1, "0-15", "16-31")
	r.Namespace = "api-rules"
	if err := c.Create(ctx, r); err != nil {
		t.Fatal(err)
	}

	operatorConfig := restrictedOperator(t, ctx, cluster, "api-rules")

	ready := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- proxy.Run(ctx, proxy.Options{
			Upstream: operatorConfig, ListenAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0", Pod: "pod-a",
			RulesNamespace: "api-rules", RulesName: "demo", Mode: "",
			Ready: func(_, health, _ net.Addr) { ready <- health },
			Log:   testr.New(t).WithName("pod-a"),
		})
	}()
	var health string
	select {
	case addr := <-ready:
		health = "http://" + addr.String()
	case err := <-errc:
		t.Fatal(err)
	}

	reported := func(want string) {
		t.Helper()
		awaitReported(t, ctx, c, client.ObjectKeyFromObject(r), "pod-a", want)
	}
	reported("a1")
	waitReady(t, health, "a1")

	// New rules: applied and reported.
	var current ctrlmeshv1alpha1.ShardRoute
	if err := c.Get(ctx, client.ObjectKeyFromObject(r), &current); err != nil {
		t.Fatal(err)
	}
	current.Spec.RulesHash, current.Spec.RoutingGeneration, current.Spec.Shards[0].Buckets = "a2", 2, "0-7"
	current.Spec.Shards[1].Buckets = "16-31"
	if err := c.Update(ctx, &current); err != nil {
		t.Fatal(err)
	}
	reported("a2")

	// Someone overwrites the status: the proxy puts its entry back.
	if err := c.Get(ctx, client.ObjectKeyFromObject(r), &current); err != nil {
		t.Fatal(err)
	}
	current.Status.Pods = nil
	if err := c.Status().Update(ctx, &current); err != nil {
		t.Fatal(err)
	}
	reported("a2")

	// Bad rules from the API server are refused like bad files.
	if err := c.Get(ctx, client.ObjectKeyFromObject(r), &current); err != nil {
		t.Fatal(err)
	}
	current.Spec.RulesHash, current.Spec.RoutingGeneration = "a3", 3
	current.Spec.Limits[0].RelateResources[0].Resources = []string{"configmapz"}
	if err := c.Update(ctx, &current); err != nil {
		t.Fatal(err)
	}
	checkMetric(t, health, `ctrlmesh_proxy_rules_loads_total{result="refused"} 1`)
	body := scrape(t, health)
	if !strings.Contains(body, `hash="a2"`) || strings.Contains(body, `hash="a3"`) {
		t.Fatal("bad rules replaced the last good ones")
	}
	reported("a2")

	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("proxy did not stop")
	}
}

// awaitReported waits until the ShardRoute key, read with c, reports hash
// as applied by pod, under the pod's own status field manager.
func awaitReported(t *testing.T, ctx context.Context, c client.Client, key client.ObjectKey, pod, hash string) {
	t.Helper()
	eventually(t, pod+" reports "+hash, func() (bool, string) {
		var got ctrlmeshv1alpha1.ShardRoute
		if err := c.Get(ctx, key, &got); err != nil {
			return false, err.Error()
		}
		for _, p := range got.Status.Pods {
			if p.Name == pod && p.AppliedRulesHash == hash {
				for _, mf := range got.ManagedFields {
					if mf.Manager == ctrlmeshv1alpha1.ProxyFieldManager(pod) && mf.Subresource == "status" {
						return true, ""
					}
				}
				return false, "no status field manager " + ctrlmeshv1alpha1.ProxyFieldManager(pod)
			}
		}
		return false, fmt.Sprintf("status %+v", got.Status)
	})
}

// restrictedOperator returns credentials with an operator's usual rights on
// ConfigMaps cluster-wide, plus the proxy's shipped ClusterRole bound in
// namespace only.
func restrictedOperator(t *testing.T, ctx context.Context, cluster *env.Cluster, namespace string) *rest.Config {
	t.Helper()
	const user = "system:serviceaccount:operators:demo-operator"
	data, err := os.ReadFile(filepath.Join("..", "deploy", "rbac", "proxy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var proxyRole rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(data, &proxyRole); err != nil {
		t.Fatal(err)
	}
	operatorRole := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "demo-operator"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
	}
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user}}
	for _, obj := range []client.Object{
		&proxyRole, operatorRole,
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "demo-operator"}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "demo-operator"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ctrlmesh-proxy", Namespace: namespace}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: proxyRole.Name}},
	} {
		if err := cluster.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	cfg, err := cluster.AddUser(user)
	if err != nil {
		t.Fatal(err)
	}
	// The user may not touch ShardRoutes elsewhere, nor write their spec.
	restricted, err := client.New(cfg, client.Options{Scheme: cluster.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := restricted.List(ctx, &ctrlmeshv1alpha1.ShardRouteList{}, client.InNamespace("default")); !apierrors.IsForbidden(err) {
		t.Fatalf("the proxy's credentials list ShardRoutes outside %s: %v", namespace, err)
	}
	return cfg
}
