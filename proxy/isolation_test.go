package proxy_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// isoNamespaces creates namespaces iso-<tenant>-<i> labeled tenant=<tenant>,
// each with a ConfigMap (sharded, labeled as the labeler would, and
// app=iso, the limit's selector of isolatedRoute) and a
// Secret (not sharded), and returns their names.
func isoNamespaces(t *testing.T, ctx context.Context, cs kubernetes.Interface, tenant string, n int) []string {
	t.Helper()
	var names []string
	for i := 0; i < n; i++ {
		ns := fmt.Sprintf("iso-%s-%d", tenant, i)
		names = append(names, ns)
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"tenant": tenant}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: ns, Labels: map[string]string{
			ctrlmeshv1alpha1.ShardingHashLabel: sharding.LabelValue(scheme32.Bucket(ns)),
			ctrlmeshv1alpha1.NamespaceLabel:    ns,
			// Not the other tests' app=demo: they count every ConfigMap
			// their proxies let through.
			"app": "iso",
		}}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: ns}}
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	return names
}

// isolatedRoute is route with every bucket in pod-a's shard, isolated to
// namespaces labeled tenant=a.
func isolatedRoute(hash string) *ctrlmeshv1alpha1.ShardRoute {
	r := route(hash, 1, "0-31", "")
	r.Spec.Shards = r.Spec.Shards[:1]
	r.Spec.Limits[0].Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "iso"}}
	r.Spec.Isolation = &ctrlmeshv1alpha1.NamespaceIsolation{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}}}
	return r
}

// secretsView runs an informer on the Secrets of one namespace through the
// proxy: a resource the rules do not shard, which isolation still limits.
func secretsView(t *testing.T, ctx context.Context, cfg *rest.Config, namespace string) func() int {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cfg)
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace))
	inf := factory.Core().V1().Secrets().Informer()
	factory.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("secrets informer did not sync")
	}
	return func() int { return len(inf.GetStore().List()) }
}

func only(namespaces []string, prefix string) []string {
	var out []string
	for _, ns := range namespaces {
		if strings.HasPrefix(ns, prefix) {
			out = append(out, ns)
		}
	}
	sort.Strings(out)
	return out
}

func relabel(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns, tenant string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{"tenant":%q}}}`, tenant)
	if _, err := cs.CoreV1().Namespaces().Patch(ctx, ns, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestNamespaceIsolation: through the proxy the operator lists, watches,
// gets and writes only in namespaces its isolation selects — sharded
// resources narrowed in range and label mode alike, unsharded ones limited
// per namespace and refused across namespaces, Namespace objects too — and
// a namespace relabelled while the operator's informers watch leaves their
// caches and its writes are refused, then comes back when relabelled in.
func TestNamespaceIsolation(t *testing.T) {
	for _, mode := range []rules.Mode{rules.ModeRange, rules.ModeLabel} {
		t.Run(string(mode), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cluster := fleet.Cluster(string(mode))
			admin := kubernetes.NewForConfigOrDie(cluster.Config)
			inside := isoNamespaces(t, ctx, admin, "a", 3)
			outside := isoNamespaces(t, ctx, admin, "b", 2)
			rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
			writeRules(t, rulesFile, isolatedRoute("iso-1"))
			a := startProxy(t, ctx, cluster.Config, "pod-a", rulesFile, mode)
			waitReady(t, a.health, "iso-1")
			operator := kubernetes.NewForConfigOrDie(noRetries(a.config))

			view := informerView(t, ctx, a.config, "application/json")
			eventually(t, "the informer sees exactly the isolated namespaces", func() (bool, string) {
				got := only(view(), "iso-")
				return slices.Equal(got, inside), fmt.Sprintf("sees %v, want %v", got, inside)
			})
			watched := secretsView(t, ctx, a.config, inside[1])
			if n := watched(); n != 1 {
				t.Fatalf("the secrets informer of %s holds %d secrets, want 1", inside[1], n)
			}

			// Reads in a namespace outside: empty lists, gets refused.
			for _, ns := range outside {
				if l, err := operator.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
					t.Errorf("list of sharded configmaps in %s: %d items, %v; want none", ns, len(l.Items), err)
				}
				if l, err := operator.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
					t.Errorf("list of unsharded secrets in %s: %d items, %v; want none", ns, len(l.Items), err)
				}
				if _, err := operator.CoreV1().ConfigMaps(ns).Get(ctx, "cm", metav1.GetOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "outside the operator's isolation") {
					t.Errorf("get of a configmap in %s: %v, want 403 naming the isolation", ns, err)
				}
				if _, err := operator.CoreV1().Secrets(ns).Get(ctx, "s", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
					t.Errorf("get of a secret in %s: %v, want 403", ns, err)
				}
				if _, err := operator.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
					t.Errorf("create in %s: %v, want 403", ns, err)
				}
				if err := operator.CoreV1().Secrets(ns).Delete(ctx, "s", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
					t.Errorf("delete of an unsharded secret in %s: %v, want 403", ns, err)
				}
				if _, err := operator.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
					t.Errorf("get of Namespace %s: %v, want 403", ns, err)
				}
			}
			// Inside: everything as without isolation.
			if _, err := operator.CoreV1().Secrets(inside[0]).Get(ctx, "s", metav1.GetOptions{}); err != nil {
				t.Errorf("get of a secret inside: %v", err)
			}
			if _, err := operator.CoreV1().ConfigMaps(inside[0]).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{}); err != nil {
				t.Errorf("create inside: %v", err)
			} else if err := operator.CoreV1().ConfigMaps(inside[0]).Delete(ctx, "new", metav1.DeleteOptions{}); err != nil {
				t.Errorf("delete inside: %v", err)
			}
			if _, err := operator.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "list it per namespace") {
				t.Errorf("list of unsharded secrets across namespaces: %v, want 403 saying what to do", err)
			}
			nss, err := operator.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatalf("list of Namespaces: %v", err)
			}
			var listed []string
			for _, ns := range nss.Items {
				listed = append(listed, ns.Name)
			}
			if got := only(listed, "iso-"); !slices.Equal(got, inside) {
				t.Errorf("list of Namespaces gives %v, want %v", got, inside)
			}

			// Relabelled out while watched: its objects leave both caches, its
			// writes are refused.
			moved := inside[1]
			relabel(t, ctx, admin, moved, "b")
			eventually(t, "the relabelled namespace leaves the configmap informer", func() (bool, string) {
				got := only(view(), "iso-")
				return !slices.Contains(got, moved), fmt.Sprintf("sees %v", got)
			})
			eventually(t, "the relabelled namespace's secrets leave the namespace's informer", func() (bool, string) {
				return watched() == 0, fmt.Sprintf("holds %d", watched())
			})
			if _, err := operator.CoreV1().ConfigMaps(moved).Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}}, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
				t.Errorf("update in the relabelled namespace: %v, want 403", err)
			}
			checkMetric(t, a.health, `ctrlmesh_proxy_isolation_namespaces 2`)

			// Relabelled in: back in both caches.
			relabel(t, ctx, admin, moved, "a")
			eventually(t, "the namespace relabelled in comes back", func() (bool, string) {
				got := only(view(), "iso-")
				return slices.Equal(got, inside), fmt.Sprintf("sees %v, want %v", got, inside)
			})
			eventually(t, "its secrets come back", func() (bool, string) {
				return watched() == 1, fmt.Sprintf("holds %d", watched())
			})
		})
	}
}

// TestIsolationFailsClosed: a proxy whose operator may not list
// Namespaces cannot confirm any namespace's labels, so it treats every
// namespace as outside: its informers sync on nothing and its writes are
// refused — never the unisolated view.
func TestIsolationFailsClosed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster := fleet.Cluster("label")
	admin := kubernetes.NewForConfigOrDie(cluster.Config)
	inside := isoNamespaces(t, ctx, admin, "a", 2)
	const user = "isolated-operator"
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{ctrlmeshv1alpha1.GroupVersion.Group}, Resources: []string{"shardroutes"}, Verbs: []string{"get", "list", "watch"}},
	}}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	upstream := rest.CopyConfig(cluster.Config)
	upstream.Impersonate = rest.ImpersonationConfig{UserName: user}

	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, isolatedRoute("iso-closed"))
	a := startProxy(t, ctx, upstream, "pod-a", rulesFile, rules.ModeLabel)
	waitReady(t, a.health, "iso-closed")
	operator := kubernetes.NewForConfigOrDie(noRetries(a.config))
	view := informerView(t, ctx, a.config, "application/json")
	if got := view(); len(got) != 0 {
		t.Fatalf("the operator sees configmaps in %v although no namespace's labels could be confirmed", got)
	}
	for _, ns := range inside {
		if l, err := operator.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
			t.Errorf("list of secrets in %s: %d items, %v; want none", ns, len(l.Items), err)
		}
		if _, err := operator.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "could not confirm its labels") {
			t.Errorf("create in %s: %v, want 403 saying the labels are not confirmed", ns, err)
		}
	}
	checkMetric(t, a.health, `ctrlmesh_proxy_isolation_namespaces 0`)
}
