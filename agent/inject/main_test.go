package inject_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	"github.com/ctrlmesh/ctrlmesh/agent/routestatus"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/certs"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// proxyImage is the image the tests' injector puts into pods; envtest runs
// no kubelet, so it is never pulled.
const proxyImage = "registry.example/ctrlmesh-proxy:test"

// What every test shares: one member cluster with the injection webhook
// registered, served from a manager whose cache the tests also read.
var (
	member *env.Cluster
	cs     kubernetes.Interface
	// agentCache is the cache the Handler reads ShardRoutes from.
	agentCache cache.Cache
	// agentMetrics holds the Replacer's metrics.
	agentMetrics = prometheus.NewRegistry()
)

// replacePace is the Replacer's pace in the tests, short so that they see
// several evictions of one owner.
const replacePace = 300 * time.Millisecond

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "member", FeatureGates: []string{env.FeatureShardedListAndWatch}}}}, func(ctx context.Context, f *env.Fleet) (func(), error) {
		// The manager outlives every test; its logs would go to a finished test.
		ctrllog.SetLogger(logr.Discard())
		member = f.Cluster("member")
		var err error
		if cs, err = kubernetes.NewForConfig(member.Config); err != nil {
			return nil, err
		}
		return startAgent(ctx, f)
	}))
}

// startAgent runs what the agent's main wires for injection: a manager with
// the EventReconciler, the Replacer and the RouteDeletedReconciler, and the Handler served over TLS and registered by the
// configuration WebhookConfiguration builds. It returns once the API server
// calls the webhook.
func startAgent(ctx context.Context, fleet *env.Fleet) (stop func(), err error) {
	agentConfig, err := agentIdentity(ctx)
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(agentConfig, ctrl.Options{
		Scheme:                 fleet.Scheme,
		Cache:                  cache.Options{ByObject: routestatus.CacheByObject()},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Logger:                 logr.Discard(),
	})
	if err != nil {
		return nil, err
	}
	if err := (&inject.EventReconciler{}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := (&inject.Replacer{Pace: replacePace, Registerer: agentMetrics}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := (&inject.RouteDeletedReconciler{}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	agentCache = mgr.GetCache()
	mgrCtx, stopMgr := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := mgr.Start(mgrCtx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	var srv *httptest.Server
	stop = func() {
		stopMgr()
		wg.Wait()
		if srv != nil {
			srv.Close()
		}
	}
	fail := func(err error) (func(), error) {
		stop()
		return nil, err
	}
	if _, err := agentCache.GetInformer(ctx, &ctrlmeshv1alpha1.ShardRoute{}); err != nil {
		return fail(err)
	}
	if !agentCache.WaitForCacheSync(ctx) {
		return fail(errors.New("the cache never synced"))
	}

	dir, err := os.MkdirTemp("", "ctrlmesh-inject-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	caPEM, err := certs.WriteServing(dir, "127.0.0.1")
	if err != nil {
		return fail(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.CertFile), filepath.Join(dir, certs.KeyFile))
	if err != nil {
		return fail(err)
	}
	h, err := inject.NewHandler(agentCache, inject.Options{Image: proxyImage}, logr.Discard())
	if err != nil {
		return fail(err)
	}
	srv = httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()

	cfg, err := inject.WebhookConfiguration(inject.WebhookOptions{
		ConfigurationName: "ctrlmesh-proxy-injection",
		WebhookName:       "inject.ctrlmesh.io",
		ClientConfig:      admissionregistrationv1.WebhookClientConfig{URL: ptr.To(srv.URL + "/inject"), CABundle: caPEM},
	})
	if err != nil {
		return fail(err)
	}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	if err := waitForWebhook(ctx); err != nil {
		return fail(err)
	}
	return stop, nil
}

// agentIdentity returns the config of a user with exactly the rights
// MemberRBACRules grants, so that every test also shows they suffice.
func agentIdentity(ctx context.Context) (*rest.Config, error) {
	const name = "ctrlmesh-agent-inject"
	cfg, err := member.AddUser(name)
	if err != nil {
		return nil, err
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: inject.MemberRBACRules()}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	return cfg, nil
}

// waitForWebhook creates labeled probe pods in a namespace without
// ShardRoutes until one comes back annotated: the API server has picked up
// the webhook configuration.
func waitForWebhook(ctx context.Context) error {
	const ns = "webhook-probe"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for i := 0; ; i++ {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("probe-%d", i), Namespace: ns, Labels: map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}
		got, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			return err
		}
		if got.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation] != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("the API server never called the webhook")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

var (
	namesMu   sync.Mutex
	namesUsed = map[string]int{}
)

// createNamespace creates a namespace named base the first time and
// base-r<n> after, so that the tests also pass with -count above 1 against
// the one cluster: envtest runs no namespace controller to delete them.
func createNamespace(t *testing.T, ctx context.Context, base string) string {
	t.Helper()
	namesMu.Lock()
	namesUsed[base]++
	name := base
	if n := namesUsed[base]; n > 1 {
		name = fmt.Sprintf("%s-r%d", base, n)
	}
	namesMu.Unlock()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// createRoute creates the ShardRoute and waits until the agent's cache has
// it, as the Handler reads it from there.
func createRoute(t *testing.T, ctx context.Context, route *ctrlmeshv1alpha1.ShardRoute) {
	t.Helper()
	if err := member.Client.Create(ctx, route); err != nil {
		t.Fatal(err)
	}
	for {
		err := agentCache.Get(ctx, client.ObjectKeyFromObject(route), &ctrlmeshv1alpha1.ShardRoute{})
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the cache never saw ShardRoute %s/%s: %v", route.Namespace, route.Name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// testContext is the context of one test, bounded so that a hang ends it.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
