package routestatus_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ctrlmesh/ctrlmesh/agent/routestatus"
	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The member cluster every test uses, each test in its own namespace, and an
// admin client of it. The controller runs for the whole package, in one
// manager, as a user holding only routestatus.MemberRBACRules.
var (
	member    *rest.Config
	admin     client.Client
	agentUser = "ctrlmesh-agent"
)

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "member"}}}, func(ctx context.Context, f *env.Fleet) (func(), error) {
		// The manager and the builder log through controller-runtime's root
		// logger; its goroutines may outlive any one test.
		ctrl.SetLogger(logr.Discard())
		cluster := f.Cluster("member")
		member, admin = cluster.Config, cluster.Client
		return startAgent(ctx, cluster)
	}))
}

// startAgent runs the controller in a manager as agentUser, bound to a
// ClusterRole of routestatus.MemberRBACRules, so the rules are shown to be
// enough. The returned function stops it and waits.
func startAgent(ctx context.Context, cluster *env.Cluster) (func(), error) {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: agentUser}, Rules: routestatus.MemberRBACRules()}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: agentUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: agentUser},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: agentUser}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := cluster.Client.Create(ctx, obj); err != nil {
			return nil, err
		}
	}
	config, err := cluster.AddUser(agentUser)
	if err != nil {
		return nil, err
	}
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{ByObject: routestatus.CacheByObject()},
	})
	if err != nil {
		return nil, err
	}
	if err := (&routestatus.Reconciler{Clock: agentClock}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	mgrCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mgr.Start(mgrCtx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	})
	return func() { cancel(); wg.Wait() }, nil
}

// agentClock is the controller's clock, which a test may set off the real
// one, as an agent's node clock may be.
var agentClock = &skewedClock{}

type skewedClock struct{ skew atomic.Int64 }

func (c *skewedClock) set(skew time.Duration)          { c.skew.Store(int64(skew)) }
func (c *skewedClock) Now() time.Time                  { return time.Now().Add(time.Duration(c.skew.Load())) }
func (c *skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
