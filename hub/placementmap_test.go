package hub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/hub/placementmap"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestPlacementMapServedByHub: the hub serves the placement map on its
// metrics address (--placement-map), and the owners its JSON gives every
// bucket are those of the ShardingConfig's status the hub wrote. (The page
// itself is drawn and checked in a browser by hub/placementmap's test.)
func TestPlacementMapServedByHub(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := startFleet(t, ctx)
	for _, m := range members {
		env.Create(t, ctx, f.members[m].Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ops"}})
		f.startAgent(t, ctx, m)
	}
	env.Create(t, ctx, f.hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ops"}})
	address := fmt.Sprintf("127.0.0.1:%d", env.FreePort(t))
	run(t, ctx, "hub", func(ctx context.Context) error {
		return hub.Run(ctx, hub.Options{Config: f.hubIdentity, AutoAccept: true, RulesValidity: testRulesValidity,
			MetricsAddress: address, HealthAddress: "0", PlacementMap: true, Log: logr.Discard()})
	})
	for _, m := range members {
		for i := range 2 {
			f.startPod(t, ctx, m, "ops", "demo-op", fmt.Sprintf("demo-op-%d", i))
		}
	}
	sc := shardingConfig("ops", "demo-op", ctrlmeshv1alpha1.ScopePerCluster)
	env.Create(t, ctx, f.hub.Client, sc)
	f.waitReady(t, ctx, sc, 4, 90*time.Second)
	if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err != nil {
		t.Fatal(err)
	}

	get := func(path string) (string, string) {
		t.Helper()
		resp, err := http.Get("http://" + address + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v\n%s", path, resp.StatusCode, err, body)
		}
		return resp.Header.Get("Content-Type"), string(body)
	}
	if ctype, page := get(placementmap.Path); !strings.HasPrefix(ctype, "text/html") || !strings.Contains(page, "ctrlmesh placement map") {
		t.Errorf("GET %s: %s, not the map's page", placementmap.Path, ctype)
	}
	_, body := get(placementmap.Path + "placement.json")
	var got placementmap.Placement
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Configs) != 1 || got.Configs[0].Name != "demo-op" || len(got.Configs[0].Domains) != len(members) {
		t.Fatalf("placement.json: %s", body)
	}
	space := sharding.MustSpace(int(sc.Spec.Sharding.Buckets))
	for _, d := range got.Configs[0].Domains {
		for b, owner := range d.Owners {
			var want []string
			for _, p := range sc.Status.Placement {
				set, err := space.ParseSet(p.Buckets)
				if err != nil {
					t.Fatal(err)
				}
				if p.Cluster == d.Cluster && set.Has(b) {
					want = append(want, p.Shard)
				}
			}
			if len(want) != 1 || owner < 0 || d.Shards[owner].ID != want[0] {
				t.Errorf("%s bucket %d: the map's owner is %d of %v, the status says %v", d.Cluster, b, owner, d.Shards, want)
			}
		}
		if !slices.ContainsFunc(d.Shards, func(s placementmap.Shard) bool { return s.State == "Serving" && s.Health == "Healthy" }) {
			t.Errorf("%s: no Serving, Healthy shard in %+v", d.Cluster, d.Shards)
		}
	}
	// The serving metrics of the same hub say the same: every bucket
	// served, both clusters selected and available, four shards Serving
	// and Healthy.
	_, scrape := get("/metrics")
	for _, want := range []string{
		`ctrlmesh_hub_unserved_buckets{name="demo-op",namespace="ops"} 0`,
		`ctrlmesh_hub_clusters_selected{name="demo-op",namespace="ops"} 2`,
		`ctrlmesh_hub_clusters_available{name="demo-op",namespace="ops"} 2`,
		`ctrlmesh_hub_handovers_pending{name="demo-op",namespace="ops"} 0`,
		`ctrlmesh_hub_shards{health="Healthy",name="demo-op",namespace="ops",state="Serving"} 4`,
		`ctrlmesh_hub_proxies_behind{name="demo-op",namespace="ops"} 0`,
	} {
		if !strings.Contains(scrape, want+"\n") {
			t.Errorf("the hub's /metrics lacks %s", want)
		}
	}
	// test/cmd/dashboardshot draws the dashboard's first row from this
	// scrape (README's picture).
	if path := os.Getenv("CTRLMESH_METRICS_SCRAPE"); path != "" {
		if err := os.WriteFile(path, []byte(scrape), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Read-only.
	resp, err := http.Post("http://"+address+placementmap.Path+"placement.json", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST to the map: %d, want 405", resp.StatusCode)
	}
}
