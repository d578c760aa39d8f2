// Package proxy is ctrlmesh's sidecar proxy: it sits between one operator
// container and kube-apiserver and makes that pod see, write and lead only its
// shard. The operator's kubeconfig points at the proxy on loopback; the proxy
// forwards to the real API server with verified TLS and the operator's own
// credentials, so it never widens what the operator may do.
package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/rest"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/apistatus"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/proxy/watchstream"
)

// maxLockBody bounds the lock object bodies the proxy reads to rename.
const maxLockBody = 1 << 20

// Config of a Proxy.
type Config struct {
	// Upstream is the real API server, with the operator's own credentials.
	Upstream *rest.Config
	// LockUpstream is the API server holding the shards' leader-election
	// locks (<name>---<shard>), with the operator's credentials there; nil
	// means Upstream. It differs when the operator's objects live on another
	// API server than its pod (Fleet scope over the hub's objects): the
	// locks stay in the pod's own cluster, whose agent reports each shard's
	// leader from them.
	LockUpstream *rest.Config
	// Scopes tells namespaced resources from cluster-scoped ones.
	Scopes rules.Scopes
	// Metrics to count into; NewMetrics() when nil.
	Metrics *Metrics
	// Log for rule changes and errors; the proxy logs nothing per request at
	// Info level.
	Log logr.Logger
	// SettleTimeout bounds the wait for the operator to relist after a
	// selection change before the new rules count as applied anyway (an
	// informer that was stopped never relists). Default DefaultSettleTimeout.
	SettleTimeout time.Duration
}

// DefaultSettleTimeout is the default of Config.SettleTimeout.
const DefaultSettleTimeout = 30 * time.Second

// Proxy is an http.Handler serving the operator's API requests.
type Proxy struct {
	log     logr.Logger
	metrics *Metrics
	scopes  rules.Scopes
	reverse *httputil.ReverseProxy
	// lockReverse forwards the renamed requests on the shard's lock to
	// LockUpstream; it is reverse when the locks live upstream.
	lockReverse *httputil.ReverseProxy
	infos       *request.RequestInfoFactory
	bodies      bodyRenamer

	// state is the rules in force; mu serialises its replacement.
	state atomic.Pointer[state]
	mu    sync.Mutex

	// selections knows which epoch each list/watch stream was last served
	// under: a watch resuming from a resourceVersion of an older epoch must
	// relist, and a change is applied once the open streams have relisted.
	selections *selections
	// applied is the snapshot whose selection the operator has taken up:
	// its proxy enforces it and its informers have relisted under it. It is
	// what the proxy reports; appliedChanged closes at every change of it.
	applied        atomic.Pointer[rules.Snapshot]
	appliedMu      sync.Mutex
	appliedChanged chan struct{}
	settleTimeout  time.Duration
	// stopped closes on Stop, ending goroutines that wait for a change to
	// settle.
	stopped  chan struct{}
	stopOnce sync.Once
}

// state is one snapshot with its selection epoch. The epoch changes only
// when the pod's selection changes; the watches of the resources whose
// selection changed then end (expiries), those of the others carry over.
type state struct {
	snap     *rules.Snapshot
	epoch    uint64
	expiries *expiries
}

// expiries holds, per resource, the channel whose closing ends the sharded
// watches of that resource opened under one state.
type expiries struct {
	mu     sync.Mutex
	byGR   map[schema.GroupResource]chan string
	sealed bool
}

func newExpiries() *expiries { return &expiries{byGR: map[schema.GroupResource]chan string{}} }

// channel is the expiry channel of gr's watches. Once the state is
// replaced (sealed), a watch that still got the old state is ended at once:
// it would otherwise escape the next change.
func (e *expiries) channel(gr schema.GroupResource) chan string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sealed {
		c := make(chan string)
		close(c)
		return c
	}
	c, ok := e.byGR[gr]
	if !ok {
		c = make(chan string)
		e.byGR[gr] = c
	}
	return c
}

// handOver seals e for a selection change: the channels of resources whose
// selection is unchanged move to next, the others close, ending their
// watches with 410 Expired.
func (e *expiries) handOver(next *expiries, unchanged func(schema.GroupResource) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sealed = true
	for gr, c := range e.byGR {
		if unchanged(gr) {
			next.byGR[gr] = c
		} else {
			close(c)
		}
	}
}

// New builds a proxy. It serves 503 for sharded requests until SetRules.
func New(cfg Config) (*Proxy, error) {
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		return nil, err
	}
	metrics := cfg.Metrics
	if metrics == nil {
		metrics = NewMetrics()
	}
	p := &Proxy{
		log:     cfg.Log,
		metrics: metrics,
		scopes:  cfg.Scopes,
		infos: &request.RequestInfoFactory{
			APIPrefixes:          sets.NewString("api", "apis"),
			GrouplessAPIPrefixes: sets.NewString("api"),
		},
		bodies:         bodyRenamer{codecs: serializer.NewCodecFactory(scheme)},
		selections:     newSelections(),
		appliedChanged: make(chan struct{}),
		settleTimeout:  cfg.SettleTimeout,
		stopped:        make(chan struct{}),
	}
	if p.settleTimeout == 0 {
		p.settleTimeout = DefaultSettleTimeout
	}
	if p.reverse, err = p.newReverse(cfg.Upstream); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	p.lockReverse = p.reverse
	if cfg.LockUpstream != nil {
		if p.lockReverse, err = p.newReverse(cfg.LockUpstream); err != nil {
			return nil, fmt.Errorf("lock upstream: %w", err)
		}
	}
	return p, nil
}

// newReverse builds the reverse proxy forwarding to the API server of cfg.
func (p *Proxy) newReverse(cfg *rest.Config) (*httputil.ReverseProxy, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("host %q: %w", cfg.Host, err)
	}
	if target.Scheme == "" {
		target.Scheme = "https"
	}
	// Upstream requests travel over HTTP/1.1, not the HTTP/2 that TLS would
	// negotiate with kube-apiserver: upgraded connections (exec, attach,
	// port-forward) need it, and for everything else Go's HTTP/2 client
	// costs more per request than a pool of keep-alive HTTP/1.1
	// connections (make bench-proxy: GET p50 1.17x of direct over HTTP/2,
	// 1.06-1.09x over HTTP/1.1, in one session on 2 shared cores). A watch
	// holds its own connection, as with any HTTP/1.1 client.
	// TransportFor verifies the server against the configured CA and adds
	// the operator's credentials (token files are re-read on rotation).
	http1 := rest.CopyConfig(cfg)
	http1.TLSClientConfig.NextProtos = []string{"http/1.1"}
	transport, err := rest.TransportFor(http1)
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// The upstream credentials are the operator's own, added by the
			// transport; whatever the client sent is not forwarded.
			pr.Out.Header.Del("Authorization")
		},
		Transport:  transport,
		BufferPool: newBufferPool(),
		// Flush every write: watches and chunked lists must not stall.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.log.V(1).Info("upstream request failed", "method", r.Method, "path", r.URL.Path, "host", target.Host, "error", err.Error())
			apistatus.Write(w, http.StatusBadGateway, metav1.StatusReasonServiceUnavailable, "ctrlmesh proxy: the API server could not be reached: "+err.Error(), nil)
		},
		ModifyResponse: func(resp *http.Response) error {
			if expire, ok := resp.Request.Context().Value(watchExpireKey{}).(chan string); ok {
				watchstream.WrapResponse(resp, expire, func(res watchstream.Result, _ error) {
					if res.Outcome == watchstream.Expired {
						p.metrics.relistsForced.WithLabelValues("rules-changed").Inc()
					}
				})
			}
			return nil
		},
	}, nil
}

type watchExpireKey struct{}

func contextWithExpire(ctx context.Context, expire chan string) context.Context {
	return context.WithValue(ctx, watchExpireKey{}, expire)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// Metrics returns the proxy's metrics.
func (p *Proxy) Metrics() *Metrics { return p.metrics }

// Rules returns the snapshot in force, or nil before the first SetRules.
func (p *Proxy) Rules() *rules.Snapshot {
	if st := p.state.Load(); st != nil {
		return st.snap
	}
	return nil
}

// SetRules puts a snapshot in force. When the pod's selection of a resource
// changes, every sharded watch of it opened under the old rules ends with
// 410 Expired, so the operator's informers relist under the new selector;
// the snapshot counts as applied once they have (see Applied). Watches of
// resources whose selection did not change (another resource's limit
// changed) go on: a forced relist costs the operator a full list, and
// client-go's reflector backs off longer after each one.
func (p *Proxy) SetRules(snap *rules.Snapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.state.Load()
	next := &state{snap: snap, epoch: 1, expiries: newExpiries()}
	changed := old == nil || !old.snap.SameSelection(snap)
	unchanged := func(schema.GroupResource) bool { return false }
	if old != nil {
		if changed {
			next.epoch = old.epoch + 1
			unchanged = func(gr schema.GroupResource) bool { return old.snap.SameSelectionOf(snap, gr) }
			old.expiries.handOver(next.expiries, unchanged)
		} else {
			next.epoch, next.expiries = old.epoch, old.expiries
		}
	}
	p.state.Store(next)
	p.log.Info("rules in force", "hash", snap.Hash(), "generation", snap.Generation(), "shard", snap.Shard,
		"ownership", ownershipText(snap), "mode", snap.Mode, "selectionChanged", changed)
	if !changed {
		p.setApplied(snap)
		return
	}
	settled := p.selections.beginChange(next.epoch, unchanged)
	if !snap.Serving() {
		// A pod that now serves nothing is done once its old watches have
		// ended (above): its sharded reads get 503 and its writes 403, so
		// no relist can come to wait for.
		p.setApplied(snap)
		return
	}
	go func() {
		timer := time.NewTimer(p.settleTimeout)
		defer timer.Stop()
		select {
		case <-p.stopped:
			return
		case <-settled:
		case <-timer.C:
			p.log.Info("not every open watch was re-established under the new rules in time; counting them applied",
				"hash", snap.Hash(), "timeout", p.settleTimeout, "waitingFor", p.selections.pending())
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.state.Load() == next {
			p.setApplied(snap)
		}
	}()
}

func (p *Proxy) setApplied(snap *rules.Snapshot) {
	p.appliedMu.Lock()
	defer p.appliedMu.Unlock()
	if p.applied.Load() == snap {
		return
	}
	p.applied.Store(snap)
	p.metrics.rulesInfo.Reset()
	p.metrics.rulesInfo.WithLabelValues(snap.Hash(), strconv.FormatInt(snap.Generation(), 10), snap.Shard, string(snap.Mode)).Set(1)
	close(p.appliedChanged)
	p.appliedChanged = make(chan struct{})
}

// Stop ends the proxy's background work; call it once the servers using the
// proxy have stopped.
func (p *Proxy) Stop() {
	p.stopOnce.Do(func() { close(p.stopped) })
}

// Applied returns the snapshot the operator has taken up — enforced by the
// proxy and relisted under by the operator's informers — and a channel that
// closes when that changes. Its hash is what the proxy reports to the agent,
// so the hub grants a revoked bucket elsewhere only after this pod let go.
func (p *Proxy) Applied() (*rules.Snapshot, <-chan struct{}) {
	p.appliedMu.Lock()
	defer p.appliedMu.Unlock()
	return p.applied.Load(), p.appliedChanged
}

func ownershipText(snap *rules.Snapshot) string {
	if !snap.Assigned() {
		return "none (pod not in the rules)"
	}
	return snap.Ownership.String()
}

// ServeHTTP handles one request from the operator.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	info, err := p.infos.NewRequestInfo(r)
	if err != nil || !info.IsResourceRequest {
		p.pass(w, r, "nonresource")
		return
	}
	st := p.state.Load()
	if st == nil {
		p.count(info.Verb, outcomeUnavailable)
		apistatus.Write(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "ctrlmesh proxy: sharding rules not loaded yet", nil)
		return
	}
	gr := schema.GroupResource{Group: info.APIGroup, Resource: info.Resource}
	if st.snap.LeaderElectionName != "" && isLockResource(gr) && info.Subresource == "" {
		next, handled := p.serveLock(w, r, st.snap, info)
		if handled {
			return
		}
		r = next
	}
	limit, sharded := st.snap.LimitFor(gr)
	if !sharded {
		p.pass(w, r, info.Verb)
		return
	}
	namespaced, err := p.scopes.IsNamespaced(gr)
	switch {
	case meta.IsNoMatchError(err):
		// Unknown to discovery, yet sharded by a wildcard limit: the API
		// server may serve it by now (a CRD installed since), so passing it
		// on could read or write every shard's objects. Not found is what
		// the operator would get from a server without it, and it retries.
		p.count(info.Verb, outcomeUnavailable)
		apistatus.Write(w, http.StatusNotFound, metav1.StatusReasonNotFound,
			fmt.Sprintf("ctrlmesh proxy: %s is not known to discovery yet, and the rules shard it: %v", gr, err), nil)
		return
	case err != nil:
		// Discovery failed: fail closed with an error the operator retries.
		p.count(info.Verb, outcomeUnavailable)
		apistatus.Write(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			fmt.Sprintf("ctrlmesh proxy: cannot tell whether %s is namespaced, so cannot shard it: %v", gr, err), nil)
		return
	case !namespaced:
		// Cluster-scoped objects have no namespace and belong to no shard.
		p.pass(w, r, info.Verb)
		return
	}
	switch info.Verb {
	case "list", "watch":
		p.serveRead(w, r, st, info, gr, limit)
	case "create", "update", "patch", "delete", "deletecollection":
		p.serveWrite(w, r, st.snap, info)
	default:
		p.pass(w, r, info.Verb)
	}
}

func (p *Proxy) pass(w http.ResponseWriter, r *http.Request, verb string) {
	p.count(verb, outcomePassthrough)
	p.reverse.ServeHTTP(w, r)
}

func (p *Proxy) count(verb, outcome string) {
	p.metrics.requests.WithLabelValues(verb, outcome).Inc()
}

// serveRead narrows a list or watch to the shard.
func (p *Proxy) serveRead(w http.ResponseWriter, r *http.Request, st *state, info *request.RequestInfo, gr schema.GroupResource, limit *rules.Limit) {
	snap := st.snap
	if !snap.Serving() {
		p.count(info.Verb, outcomeUnavailable)
		apistatus.Write(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			fmt.Sprintf("ctrlmesh proxy: pod %s serves no buckets in rules generation %d yet", snap.Pod, snap.Generation()), nil)
		return
	}
	query := r.URL.Query()
	key := selectionKey{gr: gr, namespace: info.Namespace, labelSel: query.Get("labelSelector"), fieldSel: query.Get("fieldSelector")}
	if err := narrow(query, snap, limit); err != nil {
		p.count(info.Verb, outcomeRefused)
		apistatus.Write(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "ctrlmesh proxy: "+err.Error(), nil)
		return
	}
	p.metrics.injectedSelectors.WithLabelValues(string(snap.Mode)).Inc()
	p.count(info.Verb, outcomeSharded)

	out := r.Clone(r.Context())
	out.URL.RawQuery = query.Encode()
	if info.Verb == "watch" {
		// A watch resuming from a resourceVersion must have been preceded by
		// a list or watch under the same selection: otherwise the operator's
		// cache holds objects of another selection, and only a relist fixes
		// it. 410 Expired makes client-go reflectors relist.
		resumes := query.Get("resourceVersion") != "" && query.Get("sendInitialEvents") != "true"
		if resumes && p.selections.servedEpoch(key) != st.epoch {
			p.metrics.relistsForced.WithLabelValues("stale-resource-version").Inc()
			apistatus.Write(w, http.StatusGone, metav1.StatusReasonExpired,
				"ctrlmesh proxy: the shard's selection changed since this resourceVersion was served: relist required", nil)
			return
		}
		p.selections.watchOpened(key, st.epoch)
		defer p.selections.watchClosed(key)
		out = out.WithContext(contextWithExpire(out.Context(), st.expiries.channel(gr)))
		p.reverse.ServeHTTP(w, out)
		return
	}
	rec := &statusRecorder{ResponseWriter: w}
	p.reverse.ServeHTTP(rec, out)
	if rec.status == http.StatusOK {
		p.selections.markServed(key, st.epoch)
	}
}

// narrow adds the shard's selection and the limit's selector to a list or
// watch query. A selector the client already sent on the same key is
// intersected with the shard's, never overridden.
func narrow(query url.Values, snap *rules.Snapshot, limit *rules.Limit) error {
	reqs := append(labels.Requirements{}, limit.Requirements...)
	switch snap.Mode {
	case rules.ModeRange:
		ranges := snap.Ownership.HashRanges()
		if theirs := query.Get("shardSelector"); theirs != "" {
			parsed, err := sharding.ParseShardSelector(theirs)
			if err != nil {
				return fmt.Errorf("the request's shardSelector: %w", err)
			}
			ranges = sharding.IntersectRanges(ranges, parsed)
			if len(ranges) == 0 {
				return fmt.Errorf("the request's shardSelector %q selects nothing of this pod's shard (%s)", theirs, snap.Ownership)
			}
		}
		query.Set("shardSelector", sharding.FormatShardSelector(ranges))
	case rules.ModeLabel:
		own, err := snap.Ownership.LabelRequirements()
		if err != nil {
			return err
		}
		reqs = append(reqs, own...)
	}
	if len(reqs) == 0 {
		return nil
	}
	sel, err := labels.Parse(query.Get("labelSelector"))
	if err != nil {
		return fmt.Errorf("the request's labelSelector: %w", err)
	}
	// labels.Selector.Add ANDs: a requirement on a key the client already
	// constrains narrows it further.
	query.Set("labelSelector", sel.Add(reqs...).String())
	return nil
}

// serveWrite fences writes outside the shard.
func (p *Proxy) serveWrite(w http.ResponseWriter, r *http.Request, snap *rules.Snapshot, info *request.RequestInfo) {
	ns := info.Namespace
	var refusal string
	switch {
	case ns == "":
		refusal = fmt.Sprintf("ctrlmesh proxy: %s of %s across all namespaces is refused: the resource is sharded, and this pod serves only %s",
			info.Verb, info.Resource, ownershipText(snap))
	case !snap.Owns(ns):
		refusal = fmt.Sprintf("ctrlmesh proxy: %s of %s in namespace %q is refused: its bucket %d %s; this pod (shard %q) serves %s (rules generation %d)",
			info.Verb, info.Resource, ns, snap.Bucket(ns), ownerText(snap, ns), snap.Shard, ownershipText(snap), snap.Generation())
	}
	if refusal == "" {
		p.pass(w, r, info.Verb)
		return
	}
	p.metrics.fencedWrites.Inc()
	p.count(info.Verb, outcomeFenced)
	apistatus.Write(w, http.StatusForbidden, metav1.StatusReasonForbidden, refusal,
		&metav1.StatusDetails{Name: info.Name, Group: info.APIGroup, Kind: info.Resource})
}

func ownerText(snap *rules.Snapshot, ns string) string {
	owner := snap.OwnerOf(ns)
	switch {
	case owner == nil:
		return "is being handed over and has no serving shard yet"
	case slices.Contains(owner.Namespaces, ns):
		return fmt.Sprintf("does not decide: the namespace itself is served by shard %q", owner.ID)
	default:
		return fmt.Sprintf("is served by shard %q", owner.ID)
	}
}

// serveLock renames requests on the leader-election lock to the shard's
// lock and sends them, like requests already on a shard's lock, to
// LockUpstream. When the request is not on the lock it is not handled, and
// the request to route on is returned: it may carry a body serveLock
// buffered.
func (p *Proxy) serveLock(w http.ResponseWriter, r *http.Request, snap *rules.Snapshot, info *request.RequestInfo) (*http.Request, bool) {
	lock := snap.LeaderElectionName
	out := r.Clone(r.Context())
	renamed := false
	fail := func(code int32, reason metav1.StatusReason, msg string) (*http.Request, bool) {
		p.count(info.Verb, outcomeRefused)
		apistatus.Write(w, code, reason, "ctrlmesh proxy: "+msg, nil)
		return nil, true
	}
	shardLock := ctrlmeshv1alpha1.ShardLockName(lock, snap.Shard)
	if info.Name != lock && strings.HasPrefix(info.Name, ctrlmeshv1alpha1.ShardLockName(lock, "")) {
		// Already a shard's lock: responses keep the renamed name, so
		// client-go's lock renews <lock>---<shard> by that name. It lives
		// with the shards' other locks: forwarded as is to LockUpstream.
		p.count(info.Verb, outcomeLock)
		p.lockReverse.ServeHTTP(w, r)
		return nil, true
	}
	if info.Name == lock {
		if !snap.Assigned() {
			return fail(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
				fmt.Sprintf("pod %s is not assigned a shard yet, so it may not take the leader-election lock %q", snap.Pod, lock))
		}
		path, err := renameNameSegment(r.URL.Path, info.Parts, lock, shardLock)
		if err != nil {
			return fail(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
		}
		out.URL.Path, out.URL.RawPath = path, ""
		renamed = true
	}
	if info.Verb == "list" || info.Verb == "watch" {
		query := out.URL.Query()
		sel, did, err := renameFieldSelector(query.Get("fieldSelector"), lock, shardLock)
		if err != nil {
			return fail(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
		}
		if did {
			if !snap.Assigned() {
				return fail(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
					fmt.Sprintf("pod %s is not assigned a shard yet, so it may not watch the leader-election lock %q", snap.Pod, lock))
			}
			query.Set("fieldSelector", sel)
			out.URL.RawQuery = query.Encode()
			renamed = true
		}
	}
	if (info.Verb == "create" || info.Verb == "update") && r.Body != nil {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxLockBody+1))
		if err != nil {
			return fail(http.StatusBadRequest, metav1.StatusReasonBadRequest, "reading the request body: "+err.Error())
		}
		// A body too large to be a lock is forwarded whole: what was read,
		// then the rest.
		out.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(body), r.Body), Closer: r.Body}
		contentType := r.Header.Get("Content-Type")
		if len(body) <= maxLockBody {
			if name, err := p.bodies.name(contentType, body); err == nil && name == lock {
				if !snap.Assigned() {
					return fail(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
						fmt.Sprintf("pod %s is not assigned a shard yet, so it may not take the leader-election lock %q", snap.Pod, lock))
				}
				renamedBody, err := p.bodies.rename(contentType, body, shardLock)
				if err != nil {
					return fail(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
				}
				out.Body = io.NopCloser(bytes.NewReader(renamedBody))
				out.ContentLength = int64(len(renamedBody))
				out.Header.Set("Content-Length", strconv.Itoa(len(renamedBody)))
				renamed = true
			}
		}
	}
	if !renamed {
		// Another object of a lock kind: route it as usual, with the body
		// as buffered.
		return out, false
	}
	p.metrics.lockRenames.Inc()
	p.count(info.Verb, outcomeLock)
	// The shard's lock lives where the pod's agent reads it (LockUpstream);
	// other objects of lock kinds were returned above to go upstream.
	p.lockReverse.ServeHTTP(w, out)
	return nil, true
}

// statusRecorder remembers the status code written through it. It keeps
// http.Flusher working for streamed responses.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
