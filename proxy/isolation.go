package proxy

import (
	"fmt"
	"net/http"
	"net/url"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/apistatus"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/request"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// isolate is snap over the namespaces the view confirms inside its
// isolation; snap itself when it does not isolate. The caller holds mu.
func (p *Proxy) isolate(snap *rules.Snapshot) *rules.Snapshot {
	if snap == nil || snap.Isolation == nil {
		return snap
	}
	p.namespaces.start(p.stopped)
	inside, _ := p.namespaces.inside(snap.Isolation)
	p.metrics.insideNamespaces.Set(float64(len(inside)))
	return snap.Isolated(inside)
}

// refuseIsolated refuses a request outside isolation with 403.
func (p *Proxy) refuseIsolated(w http.ResponseWriter, info *request.RequestInfo, refusal string) {
	p.metrics.isolated.Inc()
	p.count(info.Verb, outcomeRefused)
	apistatus.Write(w, http.StatusForbidden, metav1.StatusReasonForbidden, refusal,
		&metav1.StatusDetails{Name: info.Name, Group: info.APIGroup, Kind: info.Resource})
}

// namespacesChanged puts the rules in force again over the namespaces now
// inside, when that changes what the pod selects: a namespace relabelled
// out leaves the shard's ownership, so the operator's watches end and its
// informers relist without the namespace's objects (deleting them from
// its cache), and its writes there are refused; one relabelled in enters
// alike.
func (p *Proxy) namespacesChanged() {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.state.Load()
	if st == nil || st.snap.Isolation == nil {
		return
	}
	if st.withdrawn != "" {
		// The pod serves no shard, but unsharded reads and writes still
		// follow the namespaces inside.
		next := p.isolate(st.snap)
		if !st.snap.SameSelection(next) {
			p.unassignLocked(next, st.withdrawn, st.lapsed)
		}
		return
	}
	if p.latest == nil || st.snap.SameSelection(p.isolate(p.latest)) {
		return
	}
	p.setRulesLocked(p.latest)
}

// isolatedText is the text of a refusal of a namespace outside isolation.
func isolatedText(snap *rules.Snapshot, what, ns string) string {
	return fmt.Sprintf("ctrlmesh proxy: %s is refused: namespace %q is outside the operator's isolation (%s), or the proxy could not confirm its labels; "+
		"label the namespace to match the ShardingConfig's spec.isolation, or change it", what, ns, snap.Isolation)
}

// noneRequirements select nothing: an object cannot both carry and not
// carry one namespace label value. Added to a list or watch in a namespace
// outside isolation, they make the API server answer an empty list and a
// watch that sends nothing, so that the operator's informers sync and drop
// what they held there.
func noneRequirements() labels.Requirements {
	in, _ := labels.NewRequirement(ctrlmeshv1alpha1.NamespaceLabel, selection.In, []string{rules.NoNamespace})
	notIn, _ := labels.NewRequirement(ctrlmeshv1alpha1.NamespaceLabel, selection.NotIn, []string{rules.NoNamespace})
	return labels.Requirements{*in, *notIn}
}

// serveIsolated applies isolation to a request of a namespaced resource gr
// (sharded by limit when limit is not nil) and reports whether it
// answered it. Reads in one namespace are narrowed to nothing outside;
// reads across namespaces of a sharded resource are narrowed by the
// isolated ownership (serveRead); any other request outside, and reads
// across namespaces of an unsharded resource, are refused with 403.
func (p *Proxy) serveIsolated(w http.ResponseWriter, r *http.Request, st *state, info *request.RequestInfo, gr schema.GroupResource, limit *rules.Limit) bool {
	snap := st.snap
	read := info.Verb == "list" || info.Verb == "watch"
	switch {
	case read && limit != nil:
		// Narrowed by the isolated ownership, in one namespace or across.
		return false
	case read && info.Namespace == "":
		p.refuseIsolated(w, info, fmt.Sprintf("ctrlmesh proxy: %s of %s across all namespaces is refused: the operator is isolated to %s and %s is not sharded; "+
			"list it per namespace, or add it to the ShardingConfig's limits so that the proxy narrows it", info.Verb, gr, snap.Isolation, gr))
		return true
	case read:
		p.serveRead(w, r, st, info, gr, nil)
		return true
	case info.Namespace == "" || !snap.Inside(info.Namespace):
		resource := info.Resource
		if info.Subresource != "" {
			resource += "/" + info.Subresource
		}
		p.refuseIsolated(w, info, isolatedText(snap, fmt.Sprintf("%s of %s in namespace %q", info.Verb, resource, info.Namespace), info.Namespace))
		return true
	}
	return false
}

// serveIsolatedNamespace applies isolation to a request on Namespace
// objects and reports whether it answered it: a Namespace outside may not
// be read or written, none may be created (its labels are not confirmed
// before it exists), and lists and watches are narrowed by the isolation's
// selector — refused when it names a regex, which no selector can state.
func (p *Proxy) serveIsolatedNamespace(w http.ResponseWriter, r *http.Request, st *state, info *request.RequestInfo) (*http.Request, bool) {
	snap := st.snap
	switch info.Verb {
	case "list", "watch":
		if snap.Isolation.Regex != nil {
			p.refuseIsolated(w, info, fmt.Sprintf("ctrlmesh proxy: %s of Namespaces is refused: the operator is isolated to %s, and a name pattern cannot be sent as a selector; get the namespaces it may use by name",
				info.Verb, snap.Isolation))
			return r, true
		}
		reqs, _ := snap.Isolation.Selector.Requirements()
		query := r.URL.Query()
		sel, err := labels.Parse(query.Get("labelSelector"))
		if err != nil {
			apistatus.Write(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "ctrlmesh proxy: the request's labelSelector: "+err.Error(), nil)
			return r, true
		}
		query.Set("labelSelector", sel.Add(reqs...).String())
		out := r.Clone(r.Context())
		out.URL.RawQuery = query.Encode()
		return out, false
	case "create", "deletecollection":
		p.refuseIsolated(w, info, fmt.Sprintf("ctrlmesh proxy: %s of Namespaces is refused: the operator is isolated to %s", info.Verb, snap.Isolation))
		return r, true
	}
	if !snap.Inside(info.Name) {
		p.refuseIsolated(w, info, isolatedText(snap, fmt.Sprintf("%s of Namespace %q", info.Verb, info.Name), info.Name))
		return r, true
	}
	return r, false
}

// narrowIsolated narrows a list or watch of an unsharded resource in one
// namespace under isolation: to nothing when the namespace is outside.
func narrowIsolated(query url.Values, snap *rules.Snapshot, namespace string) error {
	if snap.Inside(namespace) {
		return nil
	}
	sel, err := labels.Parse(query.Get("labelSelector"))
	if err != nil {
		return fmt.Errorf("the request's labelSelector: %w", err)
	}
	query.Set("labelSelector", sel.Add(noneRequirements()...).String())
	return nil
}
