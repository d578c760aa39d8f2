// Package placementmap serves the hub's placement map: a read-only web
// page that draws every ShardingConfig's buckets per cluster as a grid —
// owner, state, health, canary and pending moves — from the status the hub
// writes, polled as JSON. The hub mounts it on its metrics server
// (--placement-map). The page only draws: which shard owns which bucket is
// computed here, by pkg/placementview over pkg/sharding, as ctrlmeshctl
// explain computes it.
package placementmap

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/placementview"
)

// Path is where the hub serves the map; the page fetches
// Path+"placement.json".
const Path = "/placement/"

//go:embed map.html
var page []byte

// Handler serves the page and its JSON, reading ShardingConfigs from
// Reader: the API server, since the hub's cache holds no placement
// (shardingconfig.CacheTransform). It writes nothing.
type Handler struct {
	Reader client.Reader
}

// Placement is the JSON the page polls.
type Placement struct {
	Configs []Config `json:"configs"`
}

// Config is one ShardingConfig.
type Config struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Scope     string `json:"scope"`
	Buckets   int    `json:"buckets"`
	// Ready and Degraded are the conditions, as "True (Reason) message".
	Ready    string `json:"ready,omitempty"`
	Degraded string `json:"degraded,omitempty"`
	// Handover is true while buckets wait for their previous owner
	// (Degraded for HandoverPending).
	Handover bool `json:"handover"`
	// Error says why the placement cannot be drawn.
	Error   string   `json:"error,omitempty"`
	Domains []Domain `json:"domains"`
}

// Domain is one placement domain: a cluster (PerCluster), or the fleet.
type Domain struct {
	Cluster string  `json:"cluster"`
	Shards  []Shard `json:"shards"`
	// Owners[b] is the index in Shards of bucket b's owner, -1 for none.
	Owners []int `json:"owners"`
	// CanaryBuckets are buckets some namespaces of which a canary shard
	// serves exactly.
	CanaryBuckets []int `json:"canaryBuckets"`
}

// Shard is one entry of status.placement.
type Shard struct {
	ID         string   `json:"id"`
	Cluster    string   `json:"cluster"`
	Pods       []string `json:"pods"`
	Leader     string   `json:"leader"`
	Buckets    string   `json:"buckets"`
	Namespaces []string `json:"namespaces"`
	Canary     bool     `json:"canary"`
	State      string   `json:"state"`
	Health     string   `json:"health"`
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the placement map is read-only", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	switch strings.TrimPrefix(r.URL.Path, Path) {
	case "":
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// The page loads nothing from elsewhere.
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		_, _ = w.Write(page)
	case "placement.json":
		p, err := h.placement(r)
		if err != nil {
			http.Error(w, "reading the ShardingConfigs: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(p)
	default:
		http.NotFound(w, r)
	}
}

func (h *Handler) placement(r *http.Request) (Placement, error) {
	var list ctrlmeshv1alpha1.ShardingConfigList
	if err := h.Reader.List(r.Context(), &list); err != nil {
		return Placement{}, err
	}
	slices.SortFunc(list.Items, func(a, b ctrlmeshv1alpha1.ShardingConfig) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	p := Placement{Configs: []Config{}}
	for i := range list.Items {
		p.Configs = append(p.Configs, configOf(&list.Items[i]))
	}
	return p, nil
}

func configOf(sc *ctrlmeshv1alpha1.ShardingConfig) Config {
	c := Config{Namespace: sc.Namespace, Name: sc.Name, Scope: string(sc.Spec.Scope), Buckets: int(sc.Spec.Sharding.Buckets), Domains: []Domain{}}
	if c.Scope == "" {
		c.Scope = string(ctrlmeshv1alpha1.ScopePerCluster)
	}
	condition := func(t string) string {
		if cond := meta.FindStatusCondition(sc.Status.Conditions, t); cond != nil {
			return string(cond.Status) + " (" + cond.Reason + ") " + cond.Message
		}
		return ""
	}
	c.Ready, c.Degraded = condition(ctrlmeshv1alpha1.ConditionReady), condition(ctrlmeshv1alpha1.ConditionDegraded)
	if cond := meta.FindStatusCondition(sc.Status.Conditions, ctrlmeshv1alpha1.ConditionDegraded); cond != nil {
		c.Handover = cond.Status == "True" && cond.Reason == ctrlmeshv1alpha1.ReasonHandoverPending
	}
	view, err := placementview.New(sc)
	if err != nil {
		c.Error = err.Error()
		return c
	}
	for _, d := range view.Domains {
		out := Domain{Cluster: d.Cluster, Owners: d.BucketOwners(view.Space), CanaryBuckets: d.CanaryBuckets(view.Space)}
		if out.CanaryBuckets == nil {
			out.CanaryBuckets = []int{}
		}
		for _, s := range d.Shards {
			out.Shards = append(out.Shards, Shard{
				ID: s.Shard, Cluster: s.Cluster, Pods: nonNil(s.Pods), Leader: s.Leader, Buckets: s.Buckets,
				Namespaces: nonNil(s.Namespaces), Canary: s.Canary, State: string(s.State), Health: string(s.Health),
			})
		}
		c.Domains = append(c.Domains, out)
	}
	return c
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
