package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// DetectMode asks the API server itself, not its version, whether it serves
// KEP-5866 sharded lists: it lists one object of gr with a whole-space
// shardSelector, and only a server that applied the selector answers with
// metadata.shardInfo. A server without the feature ignores the parameter.
func DetectMode(ctx context.Context, cfg *rest.Config, mapper meta.RESTMapper, gr schema.GroupResource) (rules.Mode, error) {
	gvr, err := mapper.ResourceFor(gr.WithVersion(""))
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", gr, err)
	}
	prefix := "/apis/" + gvr.Group + "/" + gvr.Version
	if gvr.Group == "" {
		prefix = "/api/" + gvr.Version
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return "", err
	}
	u, err := url.Parse(strings.TrimSuffix(cfg.Host, "/") + prefix + "/" + gvr.Resource)
	if err != nil {
		return "", err
	}
	// The whole hash space: a probe that cannot hide objects.
	wholeSpace := sharding.FormatShardSelector([]sharding.HashRange{{First: 0, Last: ^uint64(0)}})
	u.RawQuery = url.Values{"limit": {"1"}, "shardSelector": {wholeSpace}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("probing %s for sharded list support: %w", gr, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return "", fmt.Errorf("probing %s for sharded list support: %w", gr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("probing %s for sharded list support: HTTP %d: %s", gr, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	var list struct {
		Metadata struct {
			ShardInfo *struct {
				Selector string `json:"selector"`
			} `json:"shardInfo"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return "", fmt.Errorf("probing %s for sharded list support: decoding the list: %w", gr, err)
	}
	if list.Metadata.ShardInfo != nil {
		return rules.ModeRange, nil
	}
	return rules.ModeLabel, nil
}
