package route

import (
	"context"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// hub is the API server, with the ShardRoute CRD, that TestBuiltRoutesAreValid
// checks built routes against; the other tests need none.
var hub *env.Cluster

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}}, func(_ context.Context, f *env.Fleet) (func(), error) {
		hub = f.Cluster("hub")
		return nil, nil
	}))
}

// testNames keeps the names the tests use unique (see env.Names).
var testNames env.Names

func unique(base string) string { return testNames.Unique(base) }

func createNamespace(t *testing.T, ctx context.Context, c client.Client, name string) {
	t.Helper()
	env.Create(t, ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}
