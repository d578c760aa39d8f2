package proxy_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

var fleet *env.Fleet

func TestMain(m *testing.M) {
	flag.Parse()
	if fuzz := flag.Lookup("test.fuzz"); fuzz != nil && fuzz.Value.String() != "" {
		// A fuzzing run (coordinator and every worker process) runs only the
		// fuzz target, which needs no cluster: starting two per process
		// stalled make fuzz.
		os.Exit(m.Run())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	var err error
	fleet, err = env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{
		// CBOR too, so that a client can ask for a watch format the proxy
		// cannot frame.
		{Name: "range", FeatureGates: []string{env.FeatureShardedListAndWatch, env.FeatureCBORServingAndStorage}},
		{Name: "label"},
	}})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := fleet.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

const namespaces = 40

var scheme32 = sharding.MustSpace(32)

func nsName(i int) string { return fmt.Sprintf("team-%d-prod", i) }

// seed creates the namespaces with one ConfigMap each, labeled as the agent's
// labeler would label them (the labels are ignored in range mode).
func seed(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	t.Helper()
	for i := 0; i < namespaces; i++ {
		ns := nsName(i)
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: ns, Labels: map[string]string{
			ctrlmeshv1alpha1.ShardingHashLabel: sharding.LabelValue(scheme32.Bucket(ns)),
			ctrlmeshv1alpha1.NamespaceLabel:    ns,
			"app":                              "demo",
		}}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

func route(hash string, generation int64, bucketsA, bucketsB string) *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: ctrlmeshv1alpha1.GroupVersion.String(), Kind: "ShardRoute"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "operators", Name: "demo"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: "member", RoutingGeneration: generation, RulesHash: hash, Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector:   metav1.LabelSelector{MatchLabels: map[string]string{"app": "demo-operator"}},
			Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "demo"},
			Limits: ctrlmeshv1alpha1.Limits{{
				RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}},
				Selector:        &metav1.LabelSelector{MatchLabels: map[string]string{"app": "demo"}},
			}},
			Shards: []ctrlmeshv1alpha1.RouteShard{
				{ID: "0", Buckets: bucketsA, Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "pod-a"}}},
				{ID: "1", Buckets: bucketsB, Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "pod-b"}}},
			},
		},
	}
}

func writeRules(t *testing.T, path string, r *ctrlmeshv1alpha1.ShardRoute) {
	t.Helper()
	data, err := yaml.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	// Write then rename, as a ConfigMap volume update does.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type runningProxy struct {
	pod    string
	config *rest.Config // the operator's view: through the proxy
	health string
	// forward is the forward proxy's URL, for http.ProxyURL.
	forward *url.URL
}

func startProxy(t *testing.T, ctx context.Context, upstream *rest.Config, pod, rulesFile string, mode rules.Mode) *runningProxy {
	t.Helper()
	return runProxy(t, ctx, proxy.Options{
		Upstream: upstream, Pod: pod, RulesFile: rulesFile, RulesFileInterval: 50 * time.Millisecond, Mode: mode,
	})
}

// runProxy runs a proxy with opts on loopback ports, logging to t, until ctx
// ends; the test fails if it stops with an error.
func runProxy(t *testing.T, ctx context.Context, opts proxy.Options) *runningProxy {
	t.Helper()
	pod := opts.Pod
	ready := make(chan [3]net.Addr, 1)
	errc := make(chan error, 1)
	if opts.ListenAddress == "" {
		opts.ListenAddress = "127.0.0.1:0"
	}
	opts.HealthAddress, opts.ForwardProxyAddress = "127.0.0.1:0", "127.0.0.1:0"
	opts.Ready = func(api, health, forward net.Addr) { ready <- [3]net.Addr{api, health, forward} }
	opts.Log = testr.New(t).WithName(pod)
	go func() { errc <- proxy.Run(ctx, opts) }()
	select {
	case addrs := <-ready:
		t.Cleanup(func() {
			if err := <-errc; err != nil {
				t.Errorf("proxy %s: %v", pod, err)
			}
		})
		return &runningProxy{pod: pod, config: &rest.Config{Host: "http://" + addrs[0].String()}, health: "http://" + addrs[1].String(),
			forward: &url.URL{Scheme: "http", Host: addrs[2].String()}}
	case err := <-errc:
		t.Fatalf("proxy %s: %v", pod, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("proxy %s did not start", pod)
	}
	return nil
}

// informerView runs a client-go informer on ConfigMaps through a proxy and
// returns a function listing the namespaces in its cache.
func informerView(t *testing.T, ctx context.Context, cfg *rest.Config, contentType string) func() []string {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.ContentType = contentType
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(cs, 0)
	inf := factory.Core().V1().ConfigMaps().Informer()
	factory.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	return func() []string {
		var out []string
		for _, obj := range inf.GetStore().List() {
			out = append(out, obj.(*corev1.ConfigMap).Namespace)
		}
		sort.Strings(out)
		return out
	}
}

func owned(buckets string) []string {
	set, err := scheme32.ParseSet(buckets)
	if err != nil {
		panic(err)
	}
	var out []string
	for i := 0; i < namespaces; i++ {
		if set.HasNamespace(nsName(i)) {
			out = append(out, nsName(i))
		}
	}
	sort.Strings(out)
	return out
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestTwoProxiesShardTheirOperators(t *testing.T) {
	for _, tc := range []struct {
		cluster string
		mode    rules.Mode
	}{
		{"range", rules.ModeRange},
		{"label", rules.ModeLabel},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cluster := fleet.Cluster(tc.cluster)
			admin := kubernetes.NewForConfigOrDie(cluster.Config)
			seed(t, ctx, admin)

			rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
			writeRules(t, rulesFile, route("h1", 1, "0-15", "16-31"))
			// Mode "" detects: the gated server must come out as range mode.
			a := startProxy(t, ctx, cluster.Config, "pod-a", rulesFile, "")
			b := startProxy(t, ctx, cluster.Config, "pod-b", rulesFile, "")
			viewA := informerView(t, ctx, a.config, "application/json")
			viewB := informerView(t, ctx, b.config, "application/vnd.kubernetes.protobuf")

			if got, want := viewA(), owned("0-15"); !slices.Equal(got, want) {
				t.Fatalf("pod-a sees %v, want %v", got, want)
			}
			if got, want := viewB(), owned("16-31"); !slices.Equal(got, want) {
				t.Fatalf("pod-b sees %v, want %v", got, want)
			}
			if len(owned("0-15")) == 0 || len(owned("16-31")) == 0 {
				t.Fatal("the namespaces do not split over both shards")
			}
			checkMetric(t, a.health, fmt.Sprintf(`ctrlmesh_proxy_rules_info{generation="1",hash="h1",mode="%s",shard="0"} 1`, tc.mode))

			// Writes are fenced by namespace.
			csA := kubernetes.NewForConfigOrDie(a.config)
			mine, theirs := owned("0-15")[0], owned("16-31")[0]
			if _, err := csA.CoreV1().ConfigMaps(mine).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "write-ok"}}, metav1.CreateOptions{}); err != nil {
				t.Fatalf("write in own namespace: %v", err)
			}
			_, err := csA.CoreV1().ConfigMaps(theirs).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "write-fenced"}}, metav1.CreateOptions{})
			wantMsg := fmt.Sprintf(`create of configmaps in namespace %q is refused: its bucket %d is served by shard "1"`, theirs, scheme32.Bucket(theirs))
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), wantMsg) {
				t.Fatalf("write in the other shard's namespace: %v, want 403 containing %q", err, wantMsg)
			}
			if err := csA.CoreV1().ConfigMaps(theirs).Delete(ctx, "cm", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
				t.Fatalf("delete in the other shard's namespace: %v", err)
			}

			checkLeaseRenaming(t, ctx, admin, csA, kubernetes.NewForConfigOrDie(b.config))

			// Move buckets 0-7 from pod-a to pod-b: pod-a's watches end with
			// 410, both relist, and pod-a may no longer write there.
			writeRules(t, rulesFile, route("h2", 2, "8-15", "0-7,16-31"))
			eventually(t, "pod-a relists under the new rules", func() (bool, string) {
				got := viewA()
				return slices.Equal(got, owned("8-15")), fmt.Sprintf("pod-a sees %v, want %v", got, owned("8-15"))
			})
			eventually(t, "pod-b relists under the new rules", func() (bool, string) {
				got := viewB()
				return slices.Equal(got, owned("0-7,16-31")), fmt.Sprintf("pod-b sees %v, want %v", got, owned("0-7,16-31"))
			})
			checkMetric(t, a.health, `ctrlmesh_proxy_relists_forced_total{reason="rules-changed"}`)
			if moved := owned("0-7"); len(moved) > 0 {
				_, err := csA.CoreV1().ConfigMaps(moved[0]).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-move"}}, metav1.CreateOptions{})
				if !apierrors.IsForbidden(err) {
					t.Fatalf("pod-a wrote to moved namespace %s: %v", moved[0], err)
				}
			}

			// Bad rules are refused; the last good rules stay in force.
			bad := route("h3", 3, "8-15", "0-7,16-31")
			bad.Spec.Limits[0].RelateResources[0].Resources = []string{"configmapz"}
			writeRules(t, rulesFile, bad)
			eventually(t, "bad rules refused", func() (bool, string) {
				body := scrape(t, a.health)
				return strings.Contains(body, `ctrlmesh_proxy_rules_loads_total{result="refused"} 1`), "no refusal counted"
			})
			checkMetric(t, a.health, `ctrlmesh_proxy_rules_info{generation="2",hash="h2"`)
			if got := viewA(); !slices.Equal(got, owned("8-15")) {
				t.Fatalf("after bad rules pod-a sees %v", got)
			}
		})
	}
}

// checkLeaseRenaming: each shard's lock is renamed, only in its name; other
// leases in the same namespace pass untouched; a namespace spelled like the
// lock is never renamed.
func checkLeaseRenaming(t *testing.T, ctx context.Context, admin, csA, csB kubernetes.Interface) {
	t.Helper()
	for _, ns := range []string{"operators", "demo"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		for shard, cs := range map[string]kubernetes.Interface{"0": csA, "1": csB} {
			holder := "holder-" + shard
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: ns}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
			created, err := cs.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("create lock via shard %s in %s: %v", shard, ns, err)
			}
			if created.Name != "demo---"+shard || created.Namespace != ns {
				t.Fatalf("lock created as %s/%s", created.Namespace, created.Name)
			}
			got, err := cs.CoordinationV1().Leases(ns).Get(ctx, "demo", metav1.GetOptions{})
			if err != nil || *got.Spec.HolderIdentity != holder {
				t.Fatalf("get lock via shard %s: %v %v", shard, err, got)
			}
			got.Spec.HolderIdentity = ptrTo(holder + "-renewed")
			if _, err := cs.CoordinationV1().Leases(ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("update lock via shard %s: %v", shard, err)
			}
		}
		for shard, holder := range map[string]string{"0": "holder-0-renewed", "1": "holder-1-renewed"} {
			stored, err := admin.CoordinationV1().Leases(ns).Get(ctx, "demo---"+shard, metav1.GetOptions{})
			if err != nil || *stored.Spec.HolderIdentity != holder {
				t.Fatalf("stored lock of shard %s in %s: %v %v", shard, ns, err, stored)
			}
		}
		if _, err := admin.CoordinationV1().Leases(ns).Get(ctx, "demo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("an unrenamed lock exists in %s: %v", ns, err)
		}
		other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns}}
		if created, err := csA.CoordinationV1().Leases(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil || created.Name != "other" {
			t.Fatalf("another lease was changed: %v %v", err, created)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

func scrape(t *testing.T, health string) string {
	t.Helper()
	resp, err := http.Get(health + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func checkMetric(t *testing.T, health, want string) {
	t.Helper()
	eventually(t, "metric "+want, func() (bool, string) {
		return strings.Contains(scrape(t, health), want), "not in /metrics"
	})
}

// TestServingNothingEmptiesTheCache: rules that take every bucket from a
// pod (its shard keeps only pending buckets, as a canary's does between
// steps, or an unready pod's when the hub drops it) serve its operator
// empty lists and watches of the sharded resources: its informer relists
// empty, and only then are the rules applied. Refused (503), as they were,
// the informer kept its last objects, and the rules counted as applied at
// once: the hub could grant the buckets elsewhere while the operator went
// on reconciling their objects from its cache.
func TestServingNothingEmptiesTheCache(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster := fleet.Cluster("label")
	seed(t, ctx, kubernetes.NewForConfigOrDie(cluster.Config))
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, route("n1", 1, "0-15", "16-31"))
	a := startProxy(t, ctx, cluster.Config, "pod-a", rulesFile, rules.ModeLabel)
	view := informerView(t, ctx, a.config, "application/json")
	if got, want := view(), owned("0-15"); !slices.Equal(got, want) {
		t.Fatalf("pod-a sees %v, want %v", got, want)
	}
	checkMetric(t, a.health, `ctrlmesh_proxy_rules_info{generation="1",hash="n1",mode="label",shard="0"} 1`)

	revoked := route("n2", 2, "", "16-31")
	revoked.Spec.Shards[0].PendingBuckets = "0-15"
	writeRules(t, rulesFile, revoked)
	checkMetric(t, a.health, `ctrlmesh_proxy_rules_info{generation="2",hash="n2",mode="label",shard="0"} 1`)
	eventually(t, "pod-a's informer emptied", func() (bool, string) {
		got := view()
		return len(got) == 0, fmt.Sprintf("pod-a's informer holds objects of %v", got)
	})
	list, err := kubernetes.NewForConfigOrDie(a.config).CoreV1().ConfigMaps(owned("0-15")[0]).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("a sharded list of a pod serving nothing: %v, %v, want an empty list", list, err)
	}
}

// fileProxy runs pod-a's proxy in label mode on seeded objects, with r in a
// rules file, until r is in force; it returns the proxy, the file and the
// operator's client (without retries).
func fileProxy(t *testing.T, ctx context.Context, r *ctrlmeshv1alpha1.ShardRoute) (*runningProxy, string, kubernetes.Interface) {
	t.Helper()
	cluster := fleet.Cluster("label")
	seed(t, ctx, kubernetes.NewForConfigOrDie(cluster.Config))
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, r)
	a := startProxy(t, ctx, cluster.Config, "pod-a", rulesFile, rules.ModeLabel)
	waitReady(t, a.health, r.Spec.RulesHash)
	return a, rulesFile, kubernetes.NewForConfigOrDie(noRetries(a.config))
}

// TestDeletedRulesFileStopsServing: a rules file deleted withdraws its
// rules, as a deleted ShardRoute does, rather than leaving the last ones in
// force; written again, they are served again.
func TestDeletedRulesFileStopsServing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, rulesFile, operator := fileProxy(t, ctx, route("d1", 1, "0-15", "16-31"))
	mine := owned("0-15")[0]

	if err := os.Remove(rulesFile); err != nil {
		t.Fatal(err)
	}
	eventually(t, "sharded reads served empty and writes refused once the rules file is deleted", func() (bool, string) {
		list, err := operator.CoreV1().ConfigMaps(mine).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 0 {
			return false, fmt.Sprintf("a sharded list: %v", err)
		}
		_, err = operator.CoreV1().ConfigMaps(mine).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-deletion"}}, metav1.CreateOptions{})
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "deleted"), errString(err)
	})
	writeRules(t, rulesFile, route("d2", 2, "0-15", "16-31"))
	waitReady(t, a.health, "d2")
	if list, err := operator.CoreV1().ConfigMaps(mine).List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) == 0 {
		t.Errorf("list once the rules file is back: %v", err)
	}
}

// TestPaginatedListAcrossRulesChange: a paginated list whose pages span a
// rules change would leave the operator's cache holding the old selection's
// first pages and the new one's last: the page after the change is refused
// with 410 Expired, on which client-go's pager lists again from the start.
func TestPaginatedListAcrossRulesChange(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, rulesFile, operator := fileProxy(t, ctx, route("p1", 1, "0-15", "16-31"))

	first, err := operator.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if first.Continue == "" {
		t.Fatal("the first page has no continue token: seed more objects")
	}
	// A page under the same rules goes on.
	if _, err := operator.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{Limit: 1, Continue: first.Continue}); err != nil {
		t.Fatalf("next page under the same rules: %v", err)
	}
	writeRules(t, rulesFile, route("p2", 2, "0-7", "8-31"))
	checkMetric(t, a.health, `ctrlmesh_proxy_rules_info{generation="2",hash="p2",mode="label",shard="0"} 1`)
	_, err = operator.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{Limit: 1, Continue: first.Continue})
	if !apierrors.IsResourceExpired(err) {
		t.Fatalf("next page after the rules changed: %v, want 410 Expired", err)
	}
	if _, err := operator.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Fatalf("a list from the start: %v", err)
	}
}

// TestOtherResourceLimitKeepsWatches: rules that only shard one more
// resource leave the operator's ConfigMap watch alone — no forced relist —
// and count as applied at once.
func TestOtherResourceLimitKeepsWatches(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster := fleet.Cluster("range")
	admin := kubernetes.NewForConfigOrDie(cluster.Config)
	seed(t, ctx, admin)
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, route("o1", 1, "0-15", "16-31"))
	a := startProxy(t, ctx, cluster.Config, "pod-a", rulesFile, rules.ModeRange)
	view := informerView(t, ctx, a.config, "application/json")
	checkMetric(t, a.health, `ctrlmesh_proxy_rules_info{generation="1",hash="o1",mode="range",shard="0"} 1`)

	wider := route("o2", 2, "0-15", "16-31")
	wider.Spec.Limits[0].RelateResources[0].Resources = []string{"configmaps", "secrets"}
	writeRules(t, rulesFile, wider)
	checkMetric(t, a.health, `ctrlmesh_proxy_rules_info{generation="2",hash="o2",mode="range",shard="0"} 1`)
	if body := scrape(t, a.health); strings.Contains(body, `ctrlmesh_proxy_relists_forced_total{reason="rules-changed"}`) {
		t.Fatal("adding a limit on secrets ended the ConfigMap watch")
	}
	// The watch still delivers: a new ConfigMap in the pod's shard shows up.
	// It is deleted afterwards: other tests compare what their informers
	// see in these namespaces.
	ns, name := owned("0-15")[0], fmt.Sprintf("after-o2-%d", time.Now().UnixNano())
	want := append(view(), ns)
	sort.Strings(want)
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "demo"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := admin.CoreV1().ConfigMaps(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	})
	eventually(t, "the ConfigMap created under o2 reaches the informer", func() (bool, string) {
		got := view()
		return slices.Equal(got, want), fmt.Sprintf("pod-a sees %v, want %v", got, want)
	})
}
