package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// discoveryTimeout bounds one discovery request.
const discoveryTimeout = 30 * time.Second

// discoveryMapper is the proxy's RESTMapper: it learns one API group at a
// time from the API server's discovery documents, when a request first
// needs it, and learns the group again whenever it is asked for a resource
// or kind the group did not have (a CRD installed since). It answers only
// what the proxy asks: the group of every partial resource is exact (""
// is the core group), and it knows served resources, not subresources.
//
// It reads discovery with plain JSON requests rather than client-go's
// discovery client, whose OpenAPI machinery would cost every sidecar
// megabytes of memory for documents the proxy never reads.
type discoveryMapper struct {
	host   *url.URL
	client *http.Client

	// load serialises loading; mu guards groups.
	load   sync.Mutex
	mu     sync.RWMutex
	groups map[string]*meta.DefaultRESTMapper
}

var _ meta.RESTMapper = &discoveryMapper{}

func newDiscoveryMapper(host string, client *http.Client) (*discoveryMapper, error) {
	u, err := url.Parse(host)
	if err != nil {
		return nil, fmt.Errorf("host %q: %w", host, err)
	}
	if u.Scheme == "" {
		u.Scheme = "https"
	}
	return &discoveryMapper{host: u, client: client, groups: map[string]*meta.DefaultRESTMapper{}}, nil
}

// in runs ask on the group's mapper, loading the group first if it is not
// known yet, and again when ask finds no match in what was loaded before.
func (m *discoveryMapper) in(group string, ask func(meta.RESTMapper) error) error {
	m.mu.RLock()
	known := m.groups[group]
	m.mu.RUnlock()
	if known != nil {
		err := ask(known)
		if !meta.IsNoMatchError(err) {
			return err
		}
	}
	loaded, err := m.loadGroup(group, known)
	if err != nil {
		return err
	}
	return ask(loaded)
}

// loadGroup reads the group's discovery, unless another caller replaced
// stale (what the caller saw) while it waited.
func (m *discoveryMapper) loadGroup(group string, stale *meta.DefaultRESTMapper) (*meta.DefaultRESTMapper, error) {
	m.load.Lock()
	defer m.load.Unlock()
	m.mu.RLock()
	current := m.groups[group]
	m.mu.RUnlock()
	if current != nil && current != stale {
		return current, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), discoveryTimeout)
	defer cancel()
	versions, err := m.groupVersions(ctx, group)
	if err != nil {
		return nil, err
	}
	gvs := make([]schema.GroupVersion, 0, len(versions))
	for _, v := range versions {
		gvs = append(gvs, schema.GroupVersion{Group: group, Version: v})
	}
	mapper := meta.NewDefaultRESTMapper(gvs)
	for _, gv := range gvs {
		var list metav1.APIResourceList
		found, err := m.get(ctx, groupVersionPath(gv), &list)
		if err != nil {
			return nil, err
		}
		if !found {
			// Removed since the group was listed.
			continue
		}
		for _, r := range list.APIResources {
			if strings.Contains(r.Name, "/") {
				continue
			}
			rgv := gv
			if r.Group != "" || r.Version != "" {
				rgv = schema.GroupVersion{Group: r.Group, Version: r.Version}
			}
			singular := r.SingularName
			if singular == "" {
				singular = strings.ToLower(r.Kind)
			}
			scope := meta.RESTScopeRoot
			if r.Namespaced {
				scope = meta.RESTScopeNamespace
			}
			mapper.AddSpecific(rgv.WithKind(r.Kind), rgv.WithResource(r.Name), rgv.WithResource(singular), scope)
		}
	}
	m.mu.Lock()
	m.groups[group] = mapper
	m.mu.Unlock()
	return mapper, nil
}

// groupVersions lists the versions the API server serves of group, the
// preferred one first; none for a group it does not serve.
func (m *discoveryMapper) groupVersions(ctx context.Context, group string) ([]string, error) {
	if group == "" {
		var versions metav1.APIVersions
		if _, err := m.get(ctx, "/api", &versions); err != nil {
			return nil, err
		}
		return versions.Versions, nil
	}
	var g metav1.APIGroup
	found, err := m.get(ctx, "/apis/"+group, &g)
	if err != nil || !found {
		return nil, err
	}
	versions := []string{g.PreferredVersion.Version}
	for _, v := range g.Versions {
		if v.Version != g.PreferredVersion.Version {
			versions = append(versions, v.Version)
		}
	}
	return versions, nil
}

func groupVersionPath(gv schema.GroupVersion) string {
	if gv.Group == "" {
		return "/api/" + gv.Version
	}
	return "/apis/" + gv.Group + "/" + gv.Version
}

// get reads the JSON discovery document at path into into; false when the
// API server does not serve it (404).
func (m *discoveryMapper) get(ctx context.Context, path string, into any) (bool, error) {
	u := *m.host
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := m.client.Do(req)
	if err != nil {
		return false, fmt.Errorf("discovery of %s: %w", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return false, fmt.Errorf("discovery of %s: %w", path, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return false, nil
	case resp.StatusCode != http.StatusOK:
		return false, fmt.Errorf("discovery of %s: HTTP %d: %s", path, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, into); err != nil {
		return false, fmt.Errorf("discovery of %s: %w", path, err)
	}
	return true, nil
}

func (m *discoveryMapper) KindFor(resource schema.GroupVersionResource) (gvk schema.GroupVersionKind, err error) {
	err = m.in(resource.Group, func(g meta.RESTMapper) (err error) {
		gvk, err = g.KindFor(resource)
		return err
	})
	return gvk, err
}

func (m *discoveryMapper) KindsFor(resource schema.GroupVersionResource) (gvks []schema.GroupVersionKind, err error) {
	err = m.in(resource.Group, func(g meta.RESTMapper) (err error) {
		gvks, err = g.KindsFor(resource)
		return err
	})
	return gvks, err
}

func (m *discoveryMapper) ResourceFor(input schema.GroupVersionResource) (gvr schema.GroupVersionResource, err error) {
	err = m.in(input.Group, func(g meta.RESTMapper) (err error) {
		gvr, err = g.ResourceFor(input)
		return err
	})
	return gvr, err
}

func (m *discoveryMapper) ResourcesFor(input schema.GroupVersionResource) (gvrs []schema.GroupVersionResource, err error) {
	err = m.in(input.Group, func(g meta.RESTMapper) (err error) {
		gvrs, err = g.ResourcesFor(input)
		return err
	})
	return gvrs, err
}

func (m *discoveryMapper) RESTMapping(gk schema.GroupKind, versions ...string) (mapping *meta.RESTMapping, err error) {
	err = m.in(gk.Group, func(g meta.RESTMapper) (err error) {
		mapping, err = g.RESTMapping(gk, versions...)
		return err
	})
	return mapping, err
}

func (m *discoveryMapper) RESTMappings(gk schema.GroupKind, versions ...string) (mappings []*meta.RESTMapping, err error) {
	err = m.in(gk.Group, func(g meta.RESTMapper) (err error) {
		mappings, err = g.RESTMappings(gk, versions...)
		return err
	})
	return mappings, err
}

// ResourceSingularizer is not used by the proxy: a resource without its
// group names no group to learn.
func (m *discoveryMapper) ResourceSingularizer(resource string) (string, error) {
	return "", errors.New("ctrlmesh proxy: singularizing a resource without its group is not supported")
}
