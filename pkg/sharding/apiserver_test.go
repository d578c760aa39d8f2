package sharding_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// listResponse is the part of a ConfigMapList this test reads. shardInfo is
// decoded by hand because client-go v0.34 predates KEP-5866.
type listResponse struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		ShardInfo       *struct {
			Selector string `json:"selector"`
		} `json:"shardInfo"`
	} `json:"metadata"`
	Items []corev1.ConfigMap `json:"items"`
}

// TestBucketMathMatchesAPIServer lists ConfigMaps of 64 namespaces from a real
// kube-apiserver with the ShardedListAndWatch gate on, by shardSelector and by
// label selector, and checks both return exactly the namespaces our math puts
// in the bucket set. A second API server with the gate off shows how clients
// tell the two apart: its list has no metadata.shardInfo.
func TestBucketMathMatchesAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{
		{Name: "sharded", FeatureGates: []string{env.FeatureShardedListAndWatch}},
		{Name: "plain"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()

	const namespaces = 64
	scheme32 := sharding.MustSpace(32)
	sharded := clientset(t, fleet.Cluster("sharded"))
	plain := clientset(t, fleet.Cluster("plain"))
	for _, cs := range []*kubernetes.Clientset{sharded, plain} {
		for i := 0; i < namespaces; i++ {
			// Names that differ early spread over the buckets; names that
			// differ only at the end (tenant-NN) share few: FNV-1a's top bits
			// hardly depend on the last bytes. Both kinds are here.
			ns := fmt.Sprintf("team-%d-prod", i)
			if i%4 == 0 {
				ns = fmt.Sprintf("tenant-%02d", i)
			}
			if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: ns}}
			if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// all also holds the ConfigMaps kube-apiserver makes itself in kube-system
	// and kube-public: the comparison covers them too.
	all := allNamespaces(t, sharded, ctx)
	if len(all) < namespaces {
		t.Fatalf("want at least %d ConfigMaps, found %d", namespaces, len(all))
	}

	cases := []struct {
		buckets int
		set     string
	}{
		{32, "0-7,12"},
		{32, "16-31"},
		{32, "0-31"},
		{32, "1,3,5,7,9,11,13,15,17,19,21,23,25,27,29,31"},
		{4, "2"},
		{2, "1"},
		{256, "0-63,200-255"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s of %d", tc.set, tc.buckets), func(t *testing.T) {
			space := sharding.MustSpace(tc.buckets)
			set, err := space.ParseSet(tc.set)
			if err != nil {
				t.Fatal(err)
			}
			selector, err := set.ShardSelector()
			if err != nil {
				t.Fatal(err)
			}
			want := expected(all, set)
			if partial := set.Len() < space.Buckets(); partial && (len(want) == 0 || len(want) == len(all)) {
				t.Fatalf("buckets %s select %d of %d namespaces: pick a set that splits them", tc.set, len(want), len(all))
			}
			resp := listWithShardSelector(t, ctx, sharded, selector)
			if resp.Metadata.ShardInfo == nil || resp.Metadata.ShardInfo.Selector != selector {
				t.Fatalf("shardInfo = %+v, want the selector echoed back", resp.Metadata.ShardInfo)
			}
			if got := namespacesOf(resp.Items); !slices.Equal(got, want) {
				t.Errorf("API server returned %d namespaces %v\nour math says %d: %v", len(got), got, len(want), want)
			}
			t.Logf("%d of %d namespaces in buckets %s", len(want), len(all), tc.set)
		})
	}

	// Label mode: label every ConfigMap with its bucket, then the label
	// selector of a set returns the same namespaces as its shard selector.
	existing, err := sharded.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range existing.Items {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, ctrlmeshv1alpha1.ShardingHashLabel, sharding.LabelValue(scheme32.Bucket(cm.Namespace)))
		if _, err := sharded.CoreV1().ConfigMaps(cm.Namespace).Patch(ctx, cm.Name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, text := range []string{"0-7,12", "31", "2-5,17,29-30"} {
		set, err := scheme32.ParseSet(text)
		if err != nil {
			t.Fatal(err)
		}
		labelSel, err := set.LabelSelector()
		if err != nil {
			t.Fatal(err)
		}
		byLabel, err := sharded.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: labelSel.String()})
		if err != nil {
			t.Fatal(err)
		}
		shardSel, err := set.ShardSelector()
		if err != nil {
			t.Fatal(err)
		}
		byRange := listWithShardSelector(t, ctx, sharded, shardSel)
		if got, want := namespacesOf(byLabel.Items), namespacesOf(byRange.Items); !slices.Equal(got, want) || !slices.Equal(got, expected(all, set)) {
			t.Errorf("buckets %s: label selector gives %v, shard selector gives %v", text, got, want)
		}
	}

	// Ownerships that carve single namespaces out of buckets, or grant them
	// exactly, select the same objects by hash ranges and by labels.
	for _, cm := range existing.Items {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, ctrlmeshv1alpha1.NamespaceLabel, cm.Namespace)
		if _, err := sharded.CoreV1().ConfigMaps(cm.Namespace).Patch(ctx, cm.Name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	low, err := scheme32.ParseSet("0-15")
	if err != nil {
		t.Fatal(err)
	}
	var carved, granted string
	for _, ns := range all {
		if low.HasNamespace(ns) && carved == "" {
			carved = ns
		}
		if !low.HasNamespace(ns) && granted == "" {
			granted = ns
		}
	}
	noBuckets, err := scheme32.NewSet()
	if err != nil {
		t.Fatal(err)
	}
	for _, own := range []sharding.Ownership{
		sharding.NewOwnership(low, []string{granted}, []string{carved}),
		sharding.NewOwnership(low, nil, []string{carved}),
		sharding.NewOwnership(noBuckets, []string{granted}, nil),
	} {
		want := []string{}
		for _, ns := range all {
			if own.Owns(ns) {
				want = append(want, ns)
			}
		}
		shardSel, err := own.ShardSelector()
		if err != nil {
			t.Fatal(err)
		}
		if got := namespacesOf(listWithShardSelector(t, ctx, sharded, shardSel).Items); !slices.Equal(got, want) {
			t.Errorf("%s by shard selector: got %v, want %v", own, got, want)
		}
		reqs, err := own.LabelRequirements()
		if errors.Is(err, sharding.ErrNotLabelExpressible) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		byLabel, err := sharded.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: labels.NewSelector().Add(reqs...).String()})
		if err != nil {
			t.Fatal(err)
		}
		if got := namespacesOf(byLabel.Items); !slices.Equal(got, want) {
			t.Errorf("%s by label selector: got %v, want %v", own, got, want)
		}
	}

	// A watch with a shard selector delivers only events of its buckets.
	set, err := scheme32.ParseSet("0-15")
	if err != nil {
		t.Fatal(err)
	}
	selector, err := set.ShardSelector()
	if err != nil {
		t.Fatal(err)
	}
	rv := listWithShardSelector(t, ctx, sharded, selector).Metadata.ResourceVersion
	stream, err := sharded.CoreV1().RESTClient().Get().AbsPath("/api/v1/configmaps").
		Param("watch", "true").Param("resourceVersion", rv).Param("shardSelector", selector).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stream.Close() }()
	var inside, outside string
	for _, ns := range all {
		if set.HasNamespace(ns) && inside == "" {
			inside = ns
		}
		if !set.HasNamespace(ns) && outside == "" {
			outside = ns
		}
	}
	for _, ns := range []string{outside, inside} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "watched", Namespace: ns}}
		if _, err := sharded.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var event struct {
		Type   string           `json:"type"`
		Object corev1.ConfigMap `json:"object"`
	}
	if err := json.NewDecoder(bufio.NewReader(stream)).Decode(&event); err != nil {
		t.Fatal(err)
	}
	// The outside object was created first; a watch that leaked it would
	// deliver it first.
	if event.Type != "ADDED" || event.Object.Namespace != inside || event.Object.Name != "watched" {
		t.Errorf("first watch event %s %s/%s, want ADDED %s/watched", event.Type, event.Object.Namespace, event.Object.Name, inside)
	}

	// With the gate off the parameter is ignored: no shardInfo, every object.
	resp := listWithShardSelector(t, ctx, plain, selector)
	if resp.Metadata.ShardInfo != nil {
		t.Errorf("API server without the gate returned shardInfo %+v", resp.Metadata.ShardInfo)
	}
	if got, want := namespacesOf(resp.Items), allNamespaces(t, plain, ctx); !slices.Equal(got, want) {
		t.Errorf("API server without the gate returned %d of %d objects", len(got), len(want))
	}
}

func clientset(t *testing.T, c *env.Cluster) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func listWithShardSelector(t *testing.T, ctx context.Context, cs *kubernetes.Clientset, selector string) listResponse {
	t.Helper()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/configmaps").Param("shardSelector", selector).DoRaw(ctx)
	if err != nil {
		t.Fatalf("list with shardSelector %q: %v", selector, err)
	}
	var resp listResponse
	if err := json.Unmarshal(raw, &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

func allNamespaces(t *testing.T, cs *kubernetes.Clientset, ctx context.Context) []string {
	t.Helper()
	list, err := cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return namespacesOf(list.Items)
}

func expected(all []string, set sharding.Set) []string {
	out := []string{}
	for _, ns := range all {
		if set.HasNamespace(ns) {
			out = append(out, ns)
		}
	}
	return out
}

func namespacesOf(items []corev1.ConfigMap) []string {
	out := make([]string, 0, len(items))
	for _, cm := range items {
		out = append(out, cm.Namespace)
	}
	sort.Strings(out)
	return out
}
