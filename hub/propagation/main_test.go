package propagation

import (
	"context"
	"os"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The fleet the API server tests use: a hub and one member, for the agent
// that applies Works in standalone mode. Each test uses its own cluster
// names and namespaces, so the tests stay independent.
var (
	fleet       *env.Fleet
	hub, member *env.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}, {Name: "member1"}}}, func(_ context.Context, f *env.Fleet) (func(), error) {
		fleet = f
		hub, member = f.Cluster("hub"), f.Cluster("member1")
		return nil, nil
	}))
}

// testNames keeps the names the tests use unique (see env.Names).
var testNames env.Names

func unique(base string) string { return testNames.Unique(base) }

func createNamespace(t testing.TB, ctx context.Context, c client.Client, name string) {
	t.Helper()
	env.Create(t, ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

var (
	hubWriterOnce   sync.Once
	hubWriterClient client.Client
	hubWriterErr    error
)

// writerClient is a hub client of a user bound to RBACRules alone.
func writerClient(t testing.TB) client.Client {
	t.Helper()
	hubWriterOnce.Do(func() {
		ctx := context.Background()
		const user = "ctrlmesh-hub-propagation"
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: RBACRules()}
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		for _, obj := range []client.Object{role, binding} {
			if err := hub.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
				hubWriterErr = err
				return
			}
		}
		config, err := hub.AddUser(user)
		if err != nil {
			hubWriterErr = err
			return
		}
		hubWriterClient, hubWriterErr = client.New(config, client.Options{Scheme: fleet.Scheme})
	})
	if hubWriterErr != nil {
		t.Fatalf("the writer's hub client: %v", hubWriterErr)
	}
	return hubWriterClient
}

// hubCache is the hub's cache options for Works (CacheOptions).
func hubCache(t testing.TB) cache.Options {
	t.Helper()
	opts, err := CacheOptions(hub.Config, fleet.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

// startCache starts a cache of the hub's API server with opts, after
// prepare (an index, say) when not nil, until ctx ends, and returns it with
// a client that reads through it and writes to the API server as admin.
func startCache(t testing.TB, ctx context.Context, opts cache.Options, prepare func(cache.Cache) error) (cache.Cache, client.Client) {
	t.Helper()
	opts.Scheme = fleet.Scheme
	c, err := cache.New(hub.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		if err := prepare(c); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}
	cached, err := client.New(hub.Config, client.Options{Scheme: fleet.Scheme, Cache: &client.CacheOptions{Reader: c}})
	if err != nil {
		t.Fatal(err)
	}
	return c, cached
}
