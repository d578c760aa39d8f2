package clusters_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/clusters"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// controller is one running hub controller, with its own manager and Store.
type controller struct {
	store *state.Store

	mu      sync.Mutex
	changes map[string]int // events on Options.Changes per cluster
}

func (c *controller) changesOf(cluster string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changes[cluster]
}

var (
	usersMu sync.Mutex
	users   = map[bool]*rest.Config{} // by AutoAccept
)

// controllerUser returns the config of a user bound to exactly
// clusters.RBACRules(opts), once RBAC lets it work.
func controllerUser(t *testing.T, ctx context.Context, opts clusters.Options) *rest.Config {
	t.Helper()
	usersMu.Lock()
	defer usersMu.Unlock()
	if cfg := users[opts.AutoAccept]; cfg != nil {
		return cfg
	}
	user := fmt.Sprintf("ctrlmesh-hub-autoaccept-%v", opts.AutoAccept)
	for _, obj := range []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: clusters.RBACRules(opts)},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}},
	} {
		if err := hub.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := hub.AddUser(user)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: fleet.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// RBAC reaches the authorizer through an informer: wait until it has.
	env.Eventually(t, 30*time.Second, "RBAC of the controller's user", func() error {
		return c.List(ctx, &coordinationv1.LeaseList{}, client.MatchingFieldsSelector{
			Selector: fields.OneTermEqualSelector("metadata.name", ctrlmeshv1alpha1.HeartbeatLeaseName)})
	})
	installAcceptPolicy(t, ctx)
	users[opts.AutoAccept] = cfg
	return cfg
}

var acceptPolicyOnce sync.Once

// installAcceptPolicy installs membership.AcceptPolicy, as a hub does for its
// agents, so that auto-acceptance must pass it, and waits until the API
// server enforces it.
func installAcceptPolicy(t *testing.T, ctx context.Context) {
	t.Helper()
	acceptPolicyOnce.Do(func() {
		for _, obj := range membership.AgentHubRBAC("policy") {
			if obj.GetLabels()[ctrlmeshv1alpha1.MemberClusterLabel] != "" {
				continue // the shared objects only
			}
			if err := hub.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
		// A user who may create ManagedClusters but not accept them.
		const writer = "managedcluster-writer"
		for _, obj := range []client.Object{
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: writer}, Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{"cluster.open-cluster-management.io"}, Resources: []string{"managedclusters"}, Verbs: []string{"create"}}}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: writer},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: writer},
				Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: writer}}},
		} {
			if err := hub.Client.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
		}
		cfg, err := hub.AddUser(writer)
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(cfg, client.Options{Scheme: fleet.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		env.Eventually(t, 30*time.Second, "the accept policy", func() error {
			err := c.Create(ctx, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe"},
				Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true}}, client.DryRunAll)
			if apierrors.IsForbidden(err) { // the writer's RBAC allows the create
				return nil
			}
			return fmt.Errorf("dry-run create of an accepted ManagedCluster: %v", err)
		})
	})
}

// startController runs the controller with opts as a user with exactly its
// RBAC, on a new manager and Store, until the test ends or stop is called.
// testRulesValidity is the controllers' rules validity: the tests' heartbeat
// leases last 2 s, and a heartbeat stays fresh for the longer of that and
// route.LapseBound(1 s) = 3.1 s (heartbeatLifetime).
const testRulesValidity = time.Second

func startController(t *testing.T, opts clusters.Options) (c *controller, stop func()) {
	t.Helper()
	setupCtx, cancelSetup := context.WithTimeout(context.Background(), time.Minute)
	defer cancelSetup()
	cfg := controllerUser(t, setupCtx, opts)
	store, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  fleet.Scheme,
		Logger:  logr.Discard(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Tests run several managers, one after the other, in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	c = &controller{store: store, changes: map[string]int{}}
	changes := make(chan event.GenericEvent)
	opts.Changes = changes
	if opts.RulesValidity == 0 {
		opts.RulesValidity = testRulesValidity
	}
	if err := (&clusters.Reconciler{Store: store, Options: opts}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, stop := env.StartManager(t, mgr)
	go func() {
		for {
			select {
			case ev := <-changes:
				c.mu.Lock()
				c.changes[ev.Object.GetName()]++
				c.mu.Unlock()
			case <-ctx.Done():
				return
			}
		}
	}()
	return c, stop
}

func getCluster(t *testing.T, ctx context.Context, name string) *clusterv1.ManagedCluster {
	t.Helper()
	var mc clusterv1.ManagedCluster
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: name}, &mc); err != nil {
		t.Fatal(err)
	}
	return &mc
}

func createCluster(t *testing.T, ctx context.Context, name string, accepted bool) {
	t.Helper()
	mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"test": t.Name()}},
		Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: accepted}}
	if err := hub.Client.Create(ctx, mc); err != nil {
		t.Fatal(err)
	}
}

// conditionIs checks a condition of the ManagedCluster name.
func conditionIs(ctx context.Context, name, condType string, status metav1.ConditionStatus, reason string) error {
	var mc clusterv1.ManagedCluster
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: name}, &mc); err != nil {
		return err
	}
	c := meta.FindStatusCondition(mc.Status.Conditions, condType)
	if c == nil || c.Status != status || c.Reason != reason {
		return fmt.Errorf("condition %s is %+v, want %s %s", condType, c, status, reason)
	}
	return nil
}

// recorded checks the Store's record of a cluster.
func recorded(store *state.Store, name string, accepted, available bool, reason string) error {
	c, ok := store.Snapshot().Cluster(name)
	if !ok {
		return fmt.Errorf("cluster %s not in the store", name)
	}
	if c.Accepted != accepted || c.Available != available || c.Reason != reason {
		return fmt.Errorf("store has %+v, want accepted %v, available %v, reason %q", c, accepted, available, reason)
	}
	return nil
}

func namespaceExists(ctx context.Context, name string) (bool, error) {
	err := hub.Client.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

func hubDiscovery(t *testing.T) discovery.ServerVersionInterface {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	return dc
}
