package placementmap_test

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placementmap"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// golden is the screenshot of the map the layout is compared with; it is
// also the README's picture. CTRLMESH_UPDATE_GOLDEN=1 rewrites it.
const golden = "testdata/placement-map.png"

// The browser window; the screenshot is of this viewport.
const width, height = 1280, 1000

// findChromium returns Debian's chromium, or an error saying how to install
// it. A missing browser fails the test: never a skip.
func findChromium() (string, error) {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("chromium not found on $PATH: run 'make browser-packages' (make test does this for you) to install Debian's chromium package")
}

// unownedColor is the page's colour of a bucket no shard serves.
const unownedColor = "rgb(45, 51, 59)"

func placement(shard, cluster, buckets string, state ctrlmeshv1alpha1.ShardState, health ctrlmeshv1alpha1.ShardHealth, pods ...string) ctrlmeshv1alpha1.ShardPlacement {
	p := ctrlmeshv1alpha1.ShardPlacement{Shard: shard, Cluster: cluster, Buckets: buckets, State: state, Health: health, Pods: pods}
	if len(pods) > 0 {
		p.Leader = pods[0]
	}
	return p
}

const (
	serving, pending = ctrlmeshv1alpha1.ShardServing, ctrlmeshv1alpha1.ShardPending
	healthy, sick    = ctrlmeshv1alpha1.ShardHealthy, ctrlmeshv1alpha1.ShardUnhealthy
)

// fleetStatus is a Fleet config's placement over 4096 buckets: eight
// shards across three clusters, the last buckets unowned.
func fleetStatus() ctrlmeshv1alpha1.ShardingConfigStatus {
	st := ctrlmeshv1alpha1.ShardingConfigStatus{Conditions: []metav1.Condition{{
		Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonShardsNotReady,
		Message: "7 of 8 shards serve and are healthy", LastTransitionTime: metav1.Now(),
	}}}
	clusters := []string{"member1", "member2", "member3"}
	for i := 0; i < 8; i++ {
		first, last := i*500, i*500+499
		health := healthy
		if i == 5 {
			health = sick
		}
		st.Placement = append(st.Placement, placement(strconv.Itoa(i), clusters[i%3], fmt.Sprintf("%d-%d", first, last), serving, health,
			fmt.Sprintf("fleet-op-%d", i)))
	}
	return st
}

// demoStatus is a PerCluster config over 256 buckets in two clusters: a
// move in flight in member1, a canary namespace, an unhealthy shard in
// member2.
func demoStatus(canaryNS string) ctrlmeshv1alpha1.ShardingConfigStatus {
	canary := placement("canary", "member1", "", serving, healthy, "demo-op-canary")
	canary.Namespaces, canary.Canary = []string{canaryNS}, true
	return ctrlmeshv1alpha1.ShardingConfigStatus{
		Conditions: []metav1.Condition{{
			Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonHandoverPending,
			Message: "buckets move in member1 once these proxies enforce generation 4: member1/demo-op-0", LastTransitionTime: metav1.Now(),
		}, {
			Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonHandoverPending,
			Message: "buckets move in member1 once these proxies enforce generation 4: member1/demo-op-0", LastTransitionTime: metav1.Now(),
		}},
		Placement: []ctrlmeshv1alpha1.ShardPlacement{
			placement("0", "member1", "0-95", serving, healthy, "demo-op-0"),
			placement("1", "member1", "96-191", serving, healthy, "demo-op-1"),
			placement("2", "member1", "192-255", pending, healthy, "demo-op-2"),
			canary,
			placement("0", "member2", "0-127", serving, healthy, "demo-op-5", "demo-op-6"),
			placement("1", "member2", "128-255", serving, sick, "demo-op-7"),
		},
	}
}

func createConfig(ctx context.Context, t *testing.T, c client.Client, name string, scope ctrlmeshv1alpha1.ShardingScope, buckets int32, status ctrlmeshv1alpha1.ShardingConfigStatus) *ctrlmeshv1alpha1.ShardingConfig {
	t.Helper()
	sc := &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: name},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
			}}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"member1", "member2", "member3"}},
			Scope:    scope,
			Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: buckets},
		},
	}
	if err := c.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	sc.Status = status
	if err := c.Status().Update(ctx, sc); err != nil {
		t.Fatal(err)
	}
	return sc
}

// drawnGrid is one grid as the browser drew it: the colour at the centre
// of every bucket's cell, and each shard's legend colour.
type drawnGrid struct {
	Config   string `json:"config"`
	Cluster  string `json:"cluster"`
	Swatches []struct {
		Shard   string `json:"shard"`
		Cluster string `json:"cluster"`
		Color   string `json:"color"`
	} `json:"swatches"`
	Cells []string `json:"cells"`
}

const readGrids = `(() => [...document.querySelectorAll("canvas.grid")].map(c => {
  const n = Number(c.dataset.buckets), cols = Number(c.dataset.cols), cell = Number(c.dataset.cell);
  const img = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  const cells = [];
  for (let b = 0; b < n; b++) {
    const x = (b % cols) * cell + Math.floor((cell - 1) / 2), y = Math.floor(b / cols) * cell + Math.floor((cell - 1) / 2);
    const i = (y * c.width + x) * 4;
    cells.push("rgb(" + img[i] + ", " + img[i + 1] + ", " + img[i + 2] + ")");
  }
  const swatches = [...c.closest(".domain").querySelectorAll(".swatch")].map(s =>
    ({ shard: s.dataset.shard, cluster: s.dataset.cluster, color: getComputedStyle(s).backgroundColor }));
  return { config: c.dataset.config, cluster: c.dataset.cluster, swatches, cells };
}))()`

// checkOwners compares the drawn grids with the ShardingConfigs' status:
// every bucket's cell has the colour of the shard whose buckets hold it,
// computed here from status.placement, or the unowned colour.
func checkOwners(t *testing.T, grids []drawnGrid, configs ...*ctrlmeshv1alpha1.ShardingConfig) {
	t.Helper()
	seen := 0
	for _, sc := range configs {
		id := sc.Namespace + "/" + sc.Name
		space := sharding.MustSpace(int(sc.Spec.Sharding.Buckets))
		domains := map[string][]ctrlmeshv1alpha1.ShardPlacement{}
		for _, p := range sc.Status.Placement {
			key := p.Cluster
			if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
				key = ""
			}
			domains[key] = append(domains[key], p)
		}
		for cluster, shards := range domains {
			var g *drawnGrid
			for i := range grids {
				if grids[i].Config == id && grids[i].Cluster == cluster {
					g = &grids[i]
				}
			}
			if g == nil {
				t.Errorf("%s: no grid drawn for cluster %q", id, cluster)
				continue
			}
			seen++
			color := map[string]string{}
			for _, s := range g.Swatches {
				color[s.Cluster+"/"+s.Shard] = s.Color
			}
			if len(g.Cells) != space.Buckets() {
				t.Errorf("%s %q: %d cells drawn, want %d", id, cluster, len(g.Cells), space.Buckets())
				continue
			}
			mismatches := 0
			for b := 0; b < space.Buckets(); b++ {
				want, owner := unownedColor, "nobody"
				for _, p := range shards {
					set, err := space.ParseSet(p.Buckets)
					if err != nil {
						t.Fatal(err)
					}
					if set.Has(b) {
						want, owner = color[p.Cluster+"/"+p.Shard], "shard "+p.Shard+" in "+p.Cluster
						break
					}
				}
				if want == "" || g.Cells[b] != want {
					if mismatches++; mismatches <= 5 {
						t.Errorf("%s %q bucket %d: drawn %s, want %s (%s)", id, cluster, b, g.Cells[b], want, owner)
					}
				}
			}
		}
	}
	if seen != len(grids) {
		t.Errorf("%d grids drawn, %d expected", len(grids), seen)
	}
}

// TestPlacementMapInBrowser loads the map in Debian's chromium against a
// real API server holding ShardingConfigs with status, checks the owners
// drawn against the status, follows a status change live, and compares
// the layout with the golden screenshot.
func TestPlacementMapInBrowser(t *testing.T) {
	chromium, err := findChromium()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	hub := fleet.Cluster("hub").Client
	if err := hub.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ops"}}); err != nil {
		t.Fatal(err)
	}
	demo := createConfig(ctx, t, hub, "demo-op", ctrlmeshv1alpha1.ScopePerCluster, 256, demoStatus("team-canary"))
	fleetOp := createConfig(ctx, t, hub, "fleet-op", ctrlmeshv1alpha1.ScopeFleet, 4096, fleetStatus())

	mux := http.NewServeMux()
	mux.Handle(placementmap.Path, &placementmap.Handler{Reader: hub})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(width, height), chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("font-render-hinting", "none"), chromedp.Flag("force-device-scale-factor", "1"))
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
	if err := chromedp.Do(browser, chromedp.EmulateViewport(width, height), chromedp.Navigate(srv.URL+placementmap.Path)); err != nil {
		t.Fatalf("loading the map in %s: %v", chromium, err)
	}
	waitDrawn := func(after int) int {
		t.Helper()
		for {
			n, err := chromedp.Run(browser, chromedp.Evaluate[string](`document.body.dataset.drawn || "0"`))
			if err != nil {
				t.Fatal(err)
			}
			if d, _ := strconv.Atoi(n); d > after {
				return d
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the map drew nothing after draw %d", after)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	drawn := waitDrawn(0)
	grids, err := chromedp.Run(browser, chromedp.Evaluate[[]drawnGrid](readGrids))
	if err != nil {
		t.Fatal(err)
	}
	checkOwners(t, grids, demo, fleetOp)
	if t.Failed() {
		return
	}

	// Live: a failover in member2 moves shard 1's buckets to shard 0; the
	// page follows without a reload.
	demo.Status.Placement[4].Buckets, demo.Status.Placement[5].Buckets = "0-255", ""
	if err := hub.Status().Update(ctx, demo); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		drawn = waitDrawn(drawn)
		if grids, err = chromedp.Run(browser, chromedp.Evaluate[[]drawnGrid](readGrids)); err != nil {
			t.Fatal(err)
		}
		// The change shows once member2's bucket 255 has shard 0's colour.
		moved := false
		for _, g := range grids {
			if g.Config == "ops/demo-op" && g.Cluster == "member2" && len(g.Swatches) > 0 && g.Cells[255] == g.Swatches[0].Color {
				moved = true
			}
		}
		if moved || time.Now().After(deadline) {
			break
		}
	}
	checkOwners(t, grids, demo, fleetOp)
	if t.Failed() {
		return
	}

	// The layout: the screenshot of the original status.
	demo.Status = demoStatus("team-canary")
	if err := hub.Status().Update(ctx, demo); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		drawn = waitDrawn(drawn)
		if grids, err = chromedp.Run(browser, chromedp.Evaluate[[]drawnGrid](readGrids)); err != nil {
			t.Fatal(err)
		}
		if g := grids[1]; g.Config == "ops/demo-op" && g.Cells[255] != g.Swatches[0].Color {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the map did not follow the status back within a minute")
		}
	}
	shot, err := chromedp.Run(browser, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	compareGolden(t, shot)
}

// compareGolden compares a screenshot with the golden one: same size, and
// at most 1% of the pixels differing by more than a small amount in some
// channel (text antialiasing may vary a little; a moved or missing grid,
// table or heading differs in far more).
func compareGolden(t *testing.T, shot []byte) {
	t.Helper()
	if os.Getenv("CTRLMESH_UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d bytes)", golden, len(shot))
		return
	}
	got, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v: run the test with CTRLMESH_UPDATE_GOLDEN=1 to write it", err)
	}
	want, err := png.Decode(bytes.NewReader(f))
	if err != nil {
		t.Fatal(err)
	}
	if got.Bounds() != want.Bounds() {
		t.Fatalf("screenshot is %v, golden %v", got.Bounds(), want.Bounds())
	}
	differ := differingPixels(got, want, 40)
	total := want.Bounds().Dx() * want.Bounds().Dy()
	t.Logf("screenshot: %d of %d pixels differ from %s", differ, total, golden)
	if differ*100 > total {
		out := filepath.Join(t.TempDir(), "placement-map.png")
		_ = os.WriteFile(out, shot, 0o644)
		t.Errorf("the map's layout changed: %d of %d pixels differ from %s (this run's screenshot: %s; CTRLMESH_UPDATE_GOLDEN=1 rewrites the golden)", differ, total, golden, out)
	}
}

func differingPixels(a, b image.Image, tolerance int) int {
	n := 0
	r := a.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			ar, ag, ab, _ := a.At(x, y).RGBA()
			br, bg, bb, _ := b.At(x, y).RGBA()
			for _, d := range []int{int(ar>>8) - int(br>>8), int(ag>>8) - int(bg>>8), int(ab>>8) - int(bb>>8)} {
				if d > tolerance || d < -tolerance {
					n++
					break
				}
			}
		}
	}
	return n
}
