package placementview_test

import (
	"fmt"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/placementview"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

func config(scope ctrlmeshv1alpha1.ShardingScope, placement ...ctrlmeshv1alpha1.ShardPlacement) *ctrlmeshv1alpha1.ShardingConfig {
	return &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "op"},
		Spec:       ctrlmeshv1alpha1.ShardingConfigSpec{Scope: scope, Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 4}},
		Status:     ctrlmeshv1alpha1.ShardingConfigStatus{Placement: placement},
	}
}

// ns is a namespace of the given bucket of 4 (found by search, so that the
// test follows sharding's hash).
func ns(t *testing.T, bucket int, not ...string) string {
	t.Helper()
	space := sharding.MustSpace(4)
	for i := 0; i < 1000; i++ {
		name := fmt.Sprintf("team-%d", i)
		if space.Bucket(name) == bucket && !slices.Contains(not, name) {
			return name
		}
	}
	t.Fatalf("no namespace in bucket %d", bucket)
	return ""
}

func TestOwnersOf(t *testing.T) {
	canaryNS := ns(t, 1)
	sc := config(ctrlmeshv1alpha1.ScopePerCluster,
		ctrlmeshv1alpha1.ShardPlacement{Shard: "0", Cluster: "m1", Buckets: "0-1"},
		ctrlmeshv1alpha1.ShardPlacement{Shard: "1", Cluster: "m1", Buckets: "2-3"},
		ctrlmeshv1alpha1.ShardPlacement{Shard: "canary", Cluster: "m1", Namespaces: []string{canaryNS}, Canary: true},
		ctrlmeshv1alpha1.ShardPlacement{Shard: "0", Cluster: "m2", Buckets: "0-2"},
	)
	v, err := placementview.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	owner := func(o placementview.Owner) string {
		if o.Shard == nil {
			return o.Cluster + ":-"
		}
		return o.Cluster + ":" + o.Shard.Shard
	}
	for _, c := range []struct {
		namespace string
		bucket    int
		want      []string
	}{
		{ns(t, 1, canaryNS), 1, []string{"m1:0", "m2:0"}},
		{canaryNS, 1, []string{"m1:canary", "m2:0"}},
		{ns(t, 3), 3, []string{"m1:1", "m2:-"}},
	} {
		bucket, owners := v.OwnersOf(c.namespace)
		var got []string
		for _, o := range owners {
			got = append(got, owner(o))
		}
		if bucket != c.bucket || !slices.Equal(got, c.want) {
			t.Errorf("OwnersOf(%s) = %d %v, want %d %v", c.namespace, bucket, got, c.bucket, c.want)
		}
	}
	if got := v.Domains[0].BucketOwners(v.Space); !slices.Equal(got, []int{0, 0, 1, 1}) {
		t.Errorf("m1 bucket owners %v", got)
	}
	if got := v.Domains[1].BucketOwners(v.Space); !slices.Equal(got, []int{0, 0, 0, -1}) {
		t.Errorf("m2 bucket owners %v", got)
	}
	if got := v.Domains[0].CanaryBuckets(v.Space); !slices.Equal(got, []int{1}) {
		t.Errorf("m1 canary buckets %v", got)
	}
}

func TestFleetIsOneDomain(t *testing.T) {
	v, err := placementview.New(config(ctrlmeshv1alpha1.ScopeFleet,
		ctrlmeshv1alpha1.ShardPlacement{Shard: "0", Cluster: "m1", Buckets: "0-1"},
		ctrlmeshv1alpha1.ShardPlacement{Shard: "1", Cluster: "m2", Buckets: "2-3"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Domains) != 1 || v.Domains[0].Cluster != "" {
		t.Fatalf("domains %+v, want one fleet domain", v.Domains)
	}
	_, owners := v.OwnersOf(ns(t, 3))
	if len(owners) != 1 || owners[0].Shard.Cluster != "m2" {
		t.Errorf("owners %+v, want shard 1 in m2", owners)
	}
}

func TestBadBuckets(t *testing.T) {
	if _, err := placementview.New(config(ctrlmeshv1alpha1.ScopePerCluster, ctrlmeshv1alpha1.ShardPlacement{Shard: "0", Cluster: "m1", Buckets: "0-9"})); err == nil {
		t.Error("buckets outside the space were accepted")
	}
}
