package labeler_test

import (
	"context"
	"os"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// apiServer is the package's one kube-apiserver, started by TestMain.
var apiServer *rest.Config

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "member"}}}, func(ctx context.Context, f *env.Fleet) (func(), error) {
		apiServer = rest.CopyConfig(f.Cluster("member").Config)
		apiServer.QPS, apiServer.Burst = 1000, 2000
		return nil, nil
	}))
}
