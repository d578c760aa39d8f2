// Package proxy is ctrlmesh's sidecar proxy: it sits between one operator
// container and kube-apiserver and makes that pod see, write and lead only its
// shard. The operator's kubeconfig points at the proxy on loopback; the proxy
// forwards to the real API server with verified TLS and the operator's own
// credentials, so it never widens what the operator may do.
package proxy

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ctrlmesh/ctrlmesh/proxy/internal/request"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/rest"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/apistatus"
	"github.com/ctrlmesh/ctrlmesh/proxy/policy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/proxy/watchstream"
)

// maxNamedBody bounds the request bodies the proxy reads for the name of
// the object they write: a lock to rename, a Namespace to fence.
const maxNamedBody = 1 << 20

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
	// ClientToken, when set, must be the first segment of every API
	// request's path ("/<token>/api/v1/…"), which the proxy strips. Anything
	// in the pod's network namespace can reach the proxy, and the proxy acts
	// with the operator's credentials; the token, written only into the
	// operator's kubeconfig (its server URL), lets only the operator's
	// containers use them. A path, not a bearer token: client-go drops a
	// kubeconfig's credentials for plain-HTTP servers.
	ClientToken string
	// ClientTokenBearer expects ClientToken as the request's bearer token
	// (Authorization: Bearer <token>) instead of in the path: an operator
	// using in-cluster configuration (Environment and Iptables
	// interception) sends the token file the proxy wrote for it, over TLS.
	ClientTokenBearer bool
	// Metrics to count into; NewMetrics() when nil.
	Metrics *Metrics
	// Log for rule changes and errors; the proxy logs nothing per request at
	// Info level.
	Log logr.Logger
	// SettleTimeout bounds the wait for the operator to relist after a
	// selection change before the new rules count as applied anyway (an
	// informer that was stopped never relists). Default DefaultSettleTimeout.
	SettleTimeout time.Duration
	// StateDir, when set, keeps the operator's watched streams across
	// restarts of the proxy (see streamsFile): the first rules of a proxy
	// restarted beside a running operator count as applied once those
	// streams have relisted under them, as after any change.
	StateDir string
}

// DefaultSettleTimeout is the default of Config.SettleTimeout.
const DefaultSettleTimeout = 30 * time.Second

// Proxy is an http.Handler serving the operator's API requests.
type Proxy struct {
	log     logr.Logger
	metrics *Metrics
	scopes  rules.Scopes
	// clientToken is Config.ClientToken, expected as a bearer token when
	// clientTokenBearer.
	clientToken       string
	clientTokenBearer bool
	reverse           *httputil.ReverseProxy
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

	// latest is the snapshot SetRules was given last, nil after Withdraw;
	// validUntil is when rules that expire stop being served unless
	// renewed (Renew), on the proxy's monotonic clock, and lapse fires
	// then. All under mu.
	latest     *rules.Snapshot
	validUntil time.Time
	lapse      *time.Timer

	// policies enforces the traffic policies of the rules last put in
	// force; replaced under mu. Withdrawn or lapsed rules keep theirs.
	policies atomic.Pointer[policy.Engine]
	// namespaces follows the Namespaces' labels for isolation; it starts
	// with the first rules that isolate.
	namespaces *namespaceView
}

// state is one snapshot with its selection epoch. The epoch changes only
// when the pod's selection changes; the watches of the resources whose
// selection changed then end (expiries), those of the others carry over.
type state struct {
	snap     *rules.Snapshot
	epoch    uint64
	expiries *expiries
	// withdrawn, when not empty, tells the operator why the pod serves no
	// shard although it has rules — they were withdrawn (Withdraw), or
	// their validity lapsed (lapsed) — and what to do; snap is then the
	// last rules with the pod in no shard.
	withdrawn string
	// lapsed is true when withdrawn is for a lapsed validity: a renewal
	// puts the rules back in force.
	lapsed bool
	// settled closes once the operator has taken up the epoch's selection
	// (every stream it keeps relisted under it), or once a newer change
	// supersedes it. States of one epoch share it: rules that leave the
	// selection as it was are taken up when the rules before them are,
	// which may not have happened yet. Set and read under Proxy.mu.
	settled <-chan struct{}
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
	metrics := cfg.Metrics
	if metrics == nil {
		metrics = NewMetrics()
	}
	var record *streamRecord
	if cfg.StateDir != "" {
		var err error
		if record, err = loadStreamRecord(cfg.StateDir); err != nil {
			return nil, err
		}
	}
	p := &Proxy{
		log:               cfg.Log,
		metrics:           metrics,
		scopes:            cfg.Scopes,
		clientToken:       cfg.ClientToken,
		clientTokenBearer: cfg.ClientTokenBearer,
		infos: &request.RequestInfoFactory{
			APIPrefixes:          sets.New[string]("api", "apis"),
			GrouplessAPIPrefixes: sets.New[string]("api"),
		},
		selections:     newSelections(record),
		appliedChanged: make(chan struct{}),
		settleTimeout:  cfg.SettleTimeout,
		stopped:        make(chan struct{}),
	}
	if p.settleTimeout == 0 {
		p.settleTimeout = DefaultSettleTimeout
	}
	var err error
	if p.reverse, err = p.newReverse(cfg.Upstream); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if p.namespaces, err = newNamespaceView(cfg.Upstream, cfg.Log.WithName("namespaces"), p.namespacesChanged); err != nil {
		return nil, err
	}
	p.lockReverse = p.reverse
	if cfg.LockUpstream != nil {
		if p.lockReverse, err = p.newReverse(cfg.LockUpstream); err != nil {
			return nil, fmt.Errorf("lock upstream: %w", err)
		}
	}
	return p, nil
}

// newReverse builds the reverse proxy forwarding to the API server of cfg:
// UpstreamReverseProxy, with the proxy's refusals written as API statuses
// and its checks of sharded reads' responses.
func (p *Proxy) newReverse(cfg *rest.Config) (*httputil.ReverseProxy, error) {
	reverse, err := UpstreamReverseProxy(cfg)
	if err != nil {
		return nil, err
	}
	reverse.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		var refused *refusal
		if errors.As(err, &refused) {
			apistatus.Write(w, refused.code, refused.reason, refused.message, nil)
			return
		}
		p.log.V(1).Info("upstream request failed", "method", r.Method, "path", r.URL.Path, "upstream", cfg.Host, "error", err.Error())
		apistatus.Write(w, http.StatusBadGateway, metav1.StatusReasonServiceUnavailable, "ctrlmesh proxy: the API server could not be reached: "+err.Error(), nil)
	}
	reverse.ModifyResponse = func(resp *http.Response) error {
		read, ok := resp.Request.Context().Value(shardedReadKey{}).(*shardedRead)
		if !ok || resp.StatusCode != http.StatusOK {
			return nil
		}
		return p.checkRead(resp, read)
	}
	return reverse, nil
}

// refusal is an answer the proxy gives instead of the API server's: an
// error of ModifyResponse that ErrorHandler writes as it is.
type refusal struct {
	code    int32
	reason  metav1.StatusReason
	message string
}

func (r *refusal) Error() string { return r.message }

type shardedReadKey struct{}

// shardedRead is what the proxy knows of a sharded list or watch it
// forwarded, for checking its response.
type shardedRead struct {
	verb string
	gr   schema.GroupResource
	// expire ends a watch when the rules change.
	expire chan string
	// proof, in range mode, is what the response must be proven against.
	proof *shardProof
	// listStreamed, for a watch that streams its list first, records that
	// the list has ended (its initial-events-end bookmark seen).
	listStreamed func()
}

// checkRead prepares the 200 response to a sharded list or watch: a watch
// is framed so that a rules change can end it, and in range mode a list or
// watch is handed on only as far as it is proven sharded (see verify.go).
// Whatever the proxy cannot frame or check is refused, never passed on.
func (p *Proxy) checkRead(resp *http.Response, read *shardedRead) error {
	refused := func(err error) {
		p.metrics.unsharded.With(read.verb).Inc()
		p.log.Info("refused a sharded response the API server did not prove sharded", "verb", read.verb, "resource", read.gr.String(), "reason", err.Error())
	}
	if read.verb == "watch" {
		var check watchstream.Check
		if read.proof != nil {
			check = func(framing watchstream.Framing, frame []byte) error {
				err := read.proof.checkEvent(framing, frame)
				if err != nil {
					refused(err)
					return errors.New(unshardedText(read, err))
				}
				return nil
			}
		}
		if read.listStreamed != nil {
			// The list ends with a bookmark, recorded as it is handed on:
			// the operator's cache holds the new selection once its
			// reflector has read it. Check sees the frames in order, from
			// one goroutine.
			proven, streamed := check, false
			check = func(framing watchstream.Framing, frame []byte) error {
				if proven != nil {
					if err := proven(framing, frame); err != nil {
						return err
					}
				}
				if !streamed && initialEventsEnd(framing, frame) {
					streamed = true
					read.listStreamed()
				}
				return nil
			}
		}
		wrapped := watchstream.WrapResponse(resp, read.expire, check, func(res watchstream.Result, _ error) {
			if res.Outcome == watchstream.Expired {
				p.metrics.relistsForced.With("rules-changed").Inc()
			}
		})
		if !wrapped {
			return &refusal{code: http.StatusServiceUnavailable, reason: metav1.StatusReasonServiceUnavailable, message: fmt.Sprintf(
				"ctrlmesh proxy: watch of %s refused: the API server answered it as %q (Content-Encoding %q), which the proxy cannot frame, so it could not end the watch when the rules change",
				read.gr, resp.Header.Get("Content-Type"), resp.Header.Get("Content-Encoding"))}
		}
		return nil
	}
	if read.proof == nil {
		return nil
	}
	if err := checkList(resp, *read.proof, refused); err != nil {
		return &refusal{code: http.StatusServiceUnavailable, reason: metav1.StatusReasonServiceUnavailable, message: unshardedText(read, err)}
	}
	return nil
}

// unshardedText tells the operator why a sharded response was refused, and
// what to do.
func unshardedText(read *shardedRead, err error) string {
	advice := ""
	if errors.Is(err, errUnsharded) {
		advice = "; in range mode every kube-apiserver must have the ShardedListAndWatch feature gate: turn it on, or run the proxy with --selector-mode label"
	}
	return fmt.Sprintf("ctrlmesh proxy: %s of %s refused, so that no object of another shard reaches this pod: %v%s", read.verb, read.gr, err, advice)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// Metrics returns the proxy's metrics.
func (p *Proxy) Metrics() *Metrics { return p.metrics }

// SetRules puts a snapshot in force. When the pod's selection of a resource
// changes, every sharded watch of it opened under the old rules ends with
// 410 Expired, so the operator's informers relist under the new selector;
// the snapshot counts as applied once they have (see Applied). Watches of
// resources whose selection did not change (another resource's limit
// changed) go on: a forced relist costs the operator a full list, and
// client-go's reflector backs off longer after each one.
//
// Rules that expire (spec.validitySeconds, Fleet scope) are served only
// while valid: until Renew was told of a granted renewal, SetRules puts them
// in force with the pod in no shard, as when they lapse.
func (p *Proxy) SetRules(snap *rules.Snapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latest = snap
	if snap.Expires() && !time.Now().Before(p.validUntil) {
		p.lapseLocked(snap)
		return
	}
	p.setRulesLocked(snap)
}

// setRulesLocked puts snap in force; the caller holds mu.
func (p *Proxy) setRulesLocked(snap *rules.Snapshot) {
	snap = p.isolate(snap)
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
	p.setPoliciesLocked(snap.Policies)
	p.log.Info("rules in force", "hash", snap.Hash(), "generation", snap.Generation(), "shard", snap.Shard,
		"ownership", ownershipText(snap), "mode", snap.Mode, "selectionChanged", changed)
	switch {
	case !changed:
		// Same selection, same epoch: applied once the rules before are.
		// Those may still wait for the operator to relist without buckets
		// they revoked; counting these applied at once would tell the hub
		// to grant those buckets elsewhere while the operator's cache still
		// holds their objects.
		next.settled = old.settled
	default:
		// A pod that now serves nothing waits too: it is served empty
		// lists and watches, and its informers drop what they held once
		// they have relisted (serveRead).
		next.settled = p.selections.beginChange(next.epoch, unchanged)
	}
	select {
	case <-next.settled:
		p.setApplied(snap)
		return
	default:
	}
	go func() {
		timer := time.NewTimer(p.settleTimeout)
		defer timer.Stop()
		select {
		case <-p.stopped:
			return
		case <-next.settled:
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
	if snap != nil {
		p.metrics.rulesInfo.With(snap.Hash(), strconv.FormatInt(snap.Generation(), 10), snap.Shard, string(snap.Mode)).Set(1)
	}
	close(p.appliedChanged)
	p.appliedChanged = make(chan struct{})
}

// Stop ends the proxy's background work; call it once the servers using the
// proxy have stopped.
func (p *Proxy) Stop() {
	p.stopOnce.Do(func() { close(p.stopped) })
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lapse != nil {
		p.lapse.Stop()
	}
}

// Withdraw takes the pod out of every shard because its rules are gone —
// the ShardRoute it follows was deleted (its ShardingConfig deleted, or the
// cluster deselected) — until SetRules puts rules in force again. Sharded
// reads are then served empty (the watches opened under the rules end, and
// the operator's informers relist empty), writes get 403 and leader
// election 503, each naming reason. It never falls back
// to passing requests unnarrowed and unfenced, and keeping the last rules
// would let the pod go on reconciling buckets the hub may grant elsewhere.
// Resources the last rules did not shard pass as before.
func (p *Proxy) Withdraw(reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latest = nil
	old := p.state.Load()
	if old == nil || (old.withdrawn != "" && !old.lapsed) {
		// No rules in force: every API request already gets 503.
		return
	}
	p.unassignLocked(old.snap, withdrawnText(reason), false)
	p.setApplied(nil)
}

// unassignLocked puts snap in force with the pod in no shard, telling the
// operator message; the watches opened before end. The caller holds mu.
func (p *Proxy) unassignLocked(snap *rules.Snapshot, message string, lapsed bool) {
	old := p.state.Load()
	unassigned := *snap
	unassigned.Shard = ""
	next := &state{snap: &unassigned, epoch: 1, expiries: newExpiries(), withdrawn: message, lapsed: lapsed}
	never := func(schema.GroupResource) bool { return false }
	if old != nil {
		next.epoch = old.epoch + 1
		old.expiries.handOver(next.expiries, never)
	}
	next.settled = p.selections.beginChange(next.epoch, never)
	p.state.Store(next)
}

// Renew extends the validity of the rules of hash to until, on the proxy's
// monotonic clock (a time.Now() taken before the renewal request was sent,
// plus the validity), and puts them back in force if they lapsed. A grant
// seen beside other rules than those SetRules was given last renews
// nothing: the agent grants renewals only while the member holds the rules
// the hub publishes, and rules the proxy refused or has not taken up yet
// are not those — the hub may have given their buckets elsewhere.
func (p *Proxy) Renew(hash string, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.latest == nil || p.latest.Hash() != hash || !until.After(p.validUntil) {
		return
	}
	p.validUntil = until
	if p.lapse == nil {
		p.lapse = time.AfterFunc(time.Until(until), p.expire)
	} else {
		p.lapse.Reset(time.Until(until))
	}
	if st := p.state.Load(); st != nil && st.lapsed {
		p.log.Info("rules valid again: serving them", "hash", p.latest.Hash(), "validUntil", until.Format(time.RFC3339))
		p.setRulesLocked(p.latest)
	}
}

// expire takes rules that expire out of force once their validity ran out
// without a renewal.
func (p *Proxy) expire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.state.Load()
	if st == nil || st.withdrawn != "" || !st.snap.Expires() || time.Now().Before(p.validUntil) {
		return
	}
	p.lapseLocked(st.snap)
}

// lapseLocked puts rules whose validity ran out in force with the pod in no
// shard. The caller holds mu.
func (p *Proxy) lapseLocked(snap *rules.Snapshot) {
	message := fmt.Sprintf("its rules (generation %d) are not valid: the agent of this member has not renewed their validity within %s, "+
		"so the hub may give this pod's buckets to pods in other clusters; the proxy serves again once they are renewed. "+
		"Check that the ctrlmesh agent runs and reaches the hub", snap.Generation(), snap.Validity())
	old := p.state.Load()
	if old != nil && old.lapsed && old.withdrawn == message {
		return
	}
	if old != nil && old.withdrawn == "" {
		// Rules that were served ran out, rather than rules not valid yet.
		p.log.Info("rules validity lapsed: the proxy serves the operator's sharded reads empty, refuses its writes (403) and leader election (503) until the agent renews it",
			"hash", snap.Hash(), "generation", snap.Generation(), "validity", snap.Validity())
		p.metrics.validityLapses.Inc()
	}
	p.unassignLocked(snap, message, true)
	// The pod serves nothing: nothing to relist for.
	p.setApplied(snap)
}

// RulesInForce returns the rules in force, nil before the first, and, when
// the pod serves no shard although it has them — they were withdrawn, or
// their validity lapsed — why and what to do; "" while it serves them.
func (p *Proxy) RulesInForce() (*rules.Snapshot, string) {
	if st := p.state.Load(); st != nil {
		return st.snap, st.withdrawn
	}
	return nil, ""
}

// withdrawnText tells the operator its proxy serves nothing, and how to run
// it without ctrlmesh.
func withdrawnText(reason string) string {
	return fmt.Sprintf("%s, so this pod serves no shard. To run the operator without ctrlmesh, remove the label %s from its pod template and restart its pods",
		reason, ctrlmeshv1alpha1.EnableProxyLabel)
}

// Applied returns the snapshot the operator has taken up — enforced by the
// proxy and relisted under by the operator's informers; nil before the
// first rules and once they are withdrawn — and a channel that closes when
// that changes. Its hash is what the proxy reports to the agent,
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
	if p.clientToken != "" {
		var ok bool
		if r, ok = p.authenticated(r); !ok {
			p.count("unknown", outcomeRefused)
			message := "ctrlmesh proxy: only the operator may use this proxy: use the server URL of the kubeconfig the proxy wrote (--operator-kubeconfig)"
			if p.clientTokenBearer {
				message = "ctrlmesh proxy: only the operator may use this proxy: send the token of the service-account directory the proxy wrote (in-cluster configuration)"
			}
			apistatus.Write(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, message, nil)
			return
		}
	}
	info, err := p.infos.NewRequestInfo(r)
	if err != nil || !info.IsResourceRequest {
		p.pass(w, r, "nonresource")
		return
	}
	w, done, ok := p.checkPolicies(w, r, info)
	if !ok {
		return
	}
	if done != nil {
		defer done()
	}
	st := p.state.Load()
	if st == nil {
		p.count(info.Verb, outcomeUnavailable)
		apistatus.Write(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "ctrlmesh proxy: sharding rules not loaded yet", nil)
		return
	}
	gr := schema.GroupResource{Group: info.APIGroup, Resource: info.Resource}
	if st.snap.LeaderElectionName != "" && isLockResource(gr) && info.Subresource == "" {
		next, handled := p.serveLock(w, r, st, info, gr)
		if handled {
			return
		}
		r = next
	}
	limit, sharded := st.snap.LimitFor(gr)
	if st.snap.Isolation != nil {
		if gr == namespacesResource {
			var answered bool
			if r, answered = p.serveIsolatedNamespace(w, r, st, info); answered {
				return
			}
		} else {
			namespaced, answered := p.namespaced(w, info, gr)
			if answered {
				return
			}
			if namespaced {
				if !sharded {
					limit = nil
				}
				if p.serveIsolated(w, r, st, info, gr, limit) {
					return
				}
			}
		}
	}
	if !sharded {
		p.pass(w, r, info.Verb)
		return
	}
	if gr == namespacesResource {
		// Only a limit on every resource ("*") names Namespaces: limits
		// naming a cluster-scoped resource are refused.
		p.serveNamespace(w, r, st, info)
		return
	}
	namespaced, answered := p.namespaced(w, info, gr)
	switch {
	case answered:
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
		p.serveWrite(w, r, st, info, info.Namespace)
	default:
		p.pass(w, r, info.Verb)
	}
}

// namespaced tells whether gr is namespaced, or answers the request when
// discovery cannot say: resources the rules shard or isolate fail closed.
func (p *Proxy) namespaced(w http.ResponseWriter, info *request.RequestInfo, gr schema.GroupResource) (namespaced, answered bool) {
	namespaced, err := p.scopes.IsNamespaced(gr)
	switch {
	case meta.IsNoMatchError(err):
		// Unknown to discovery, yet sharded or isolated: the API server
		// may serve it by now (a CRD installed since), so passing it on
		// could read or write every shard's objects. Not found is what the
		// operator would get from a server without it, and it retries.
		p.count(info.Verb, outcomeUnavailable)
		apistatus.Write(w, http.StatusNotFound, metav1.StatusReasonNotFound,
			fmt.Sprintf("ctrlmesh proxy: %s is not known to discovery yet, and the rules shard or isolate it: %v", gr, err), nil)
		return false, true
	case err != nil:
		// Discovery failed: fail closed with an error the operator retries.
		p.count(info.Verb, outcomeUnavailable)
		apistatus.Write(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			fmt.Sprintf("ctrlmesh proxy: cannot tell whether %s is namespaced, so cannot shard or isolate it: %v", gr, err), nil)
		return false, true
	}
	return namespaced, false
}

// authenticated checks that r carries the client token, as its bearer
// token or as the first segment of its path, and returns r without it.
func (p *Proxy) authenticated(r *http.Request) (*http.Request, bool) {
	if p.clientTokenBearer {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(token), []byte(p.clientToken)) != 1 {
			return nil, false
		}
		// The director drops the header: upstream, the credentials are
		// the pod's own.
		return r, true
	}
	token, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if subtle.ConstantTimeCompare([]byte(token), []byte(p.clientToken)) != 1 {
		return nil, false
	}
	out := r.Clone(r.Context())
	out.URL.Path = "/" + rest
	if out.URL.RawPath != "" {
		_, rawRest, _ := strings.Cut(strings.TrimPrefix(out.URL.RawPath, "/"), "/")
		out.URL.RawPath = "/" + rawRest
	}
	out.RequestURI = out.URL.RequestURI()
	return out, true
}

func (p *Proxy) pass(w http.ResponseWriter, r *http.Request, verb string) {
	p.count(verb, outcomePassthrough)
	p.reverse.ServeHTTP(w, r)
}

func (p *Proxy) count(verb, outcome string) {
	p.metrics.requests.With(verb, outcome).Inc()
}

// serveRead narrows a list or watch to the shard.
func (p *Proxy) serveRead(w http.ResponseWriter, r *http.Request, st *state, info *request.RequestInfo, gr schema.GroupResource, limit *rules.Limit) {
	snap := st.snap
	// A pod that serves no bucket (not listed in its rules, its shard with
	// pending buckets only, its rules withdrawn or lapsed) is served
	// nothing rather than refused: its informers relist empty and drop
	// what they held, and its rules count as applied once they have.
	// Refused, they would keep their last objects, and the operator would
	// go on reconciling them from its cache while the hub grants their
	// buckets elsewhere. Its writes and its leader election say why.
	empty := limit != nil && !snap.Serving()
	query := r.URL.Query()
	key := selectionKey{gr: gr, namespace: info.Namespace, labelSel: query.Get("labelSelector"), fieldSel: query.Get("fieldSelector")}
	var ranges []sharding.HashRange
	var err error
	if empty {
		err = narrowToNothing(query)
	} else if limit != nil {
		ranges, err = snap.Narrow(query, limit)
	} else {
		err = narrowIsolated(query, snap, info.Namespace)
	}
	if err != nil {
		p.count(info.Verb, outcomeRefused)
		apistatus.Write(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "ctrlmesh proxy: "+err.Error(), nil)
		return
	}
	if limit != nil && !empty {
		p.metrics.injectedSelectors.With(string(snap.Mode)).Inc()
	}
	p.count(info.Verb, outcomeSharded)

	out := r.Clone(r.Context())
	out.URL.RawQuery = query.Encode()
	out.Header.Set("Accept", framableAccept(r.Header.Values("Accept")))
	read := &shardedRead{verb: info.Verb, gr: gr}
	if limit != nil && !empty && snap.Mode == rules.ModeRange {
		read.proof = &shardProof{ranges: ranges, sent: query.Get("shardSelector")}
	}
	if read.proof != nil || info.Verb == "watch" {
		// Without the operator's Accept-Encoding the transport asks for
		// gzip itself and hands the body on decoded: the proxy reads what
		// it checks and frames, and serves it plain over loopback.
		out.Header.Del("Accept-Encoding")
		if info.Verb == "list" && acceptsGzip(r.Header.Values("Accept-Encoding")) {
			// Asked for by the proxy, a gzip-compressed list comes as sent:
			// checkList decodes what it checks and, once the list is proven,
			// hands the compressed bytes on to the operator, which accepts
			// them.
			out.Header.Set("Accept-Encoding", "gzip")
		}
	}
	if info.Verb == "watch" {
		// A watch resuming from a resourceVersion must have been preceded by
		// a list or watch under the same selection: otherwise the operator's
		// cache holds objects of another selection, and only a relist fixes
		// it. 410 Expired makes client-go reflectors relist.
		streamsList := query.Get("sendInitialEvents") == "true"
		resumes := query.Get("resourceVersion") != "" && !streamsList
		if resumes && p.selections.servedEpoch(key) != st.epoch {
			p.metrics.relistsForced.With("stale-resource-version").Inc()
			apistatus.Write(w, http.StatusGone, metav1.StatusReasonExpired,
				"ctrlmesh proxy: the shard's selection changed since this resourceVersion was served: relist required", nil)
			return
		}
		if err := p.selections.watchOpened(key, st.epoch, streamsList); err != nil {
			// Unrecorded, the watch would not be waited for by a proxy
			// restarted after this one.
			p.log.Error(err, "refusing a watch")
			apistatus.Write(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
				"ctrlmesh proxy: "+err.Error(), nil)
			return
		}
		if streamsList {
			epoch := st.epoch
			read.listStreamed = func() { p.selections.listStreamed(key, epoch) }
		}
		defer p.selections.watchClosed(key)
		read.expire = st.expiries.channel(gr)
		p.reverse.ServeHTTP(w, out.WithContext(context.WithValue(out.Context(), shardedReadKey{}, read)))
		return
	}
	if query.Get("continue") != "" && p.selections.servedEpoch(key) != st.epoch {
		// The list's earlier pages were served under another selection:
		// the rest under this one would leave the operator's cache holding
		// both. 410 Expired makes client-go's pager list again from the
		// start.
		p.metrics.relistsForced.With("stale-resource-version").Inc()
		apistatus.Write(w, http.StatusGone, metav1.StatusReasonExpired,
			"ctrlmesh proxy: the shard's selection changed during this paginated list: list again from the start", nil)
		return
	}
	rec := &statusRecorder{ResponseWriter: w}
	p.reverse.ServeHTTP(rec, out.WithContext(context.WithValue(out.Context(), shardedReadKey{}, read)))
	if rec.status == http.StatusOK {
		p.selections.markServed(key, st.epoch)
	}
}

// acceptsGzip reports whether an Accept-Encoding header lists gzip, plainly
// (as Go's transport sends it); gzip with parameters (a q-value) counts as
// not accepted, and the list is then served decoded.
func acceptsGzip(values []string) bool {
	for _, v := range values {
		for _, coding := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(coding), "gzip") {
				return true
			}
		}
	}
	return false
}

// framableAccept is the Accept header of a sharded list or watch: the
// client's media ranges the proxy can read and frame — JSON and Kubernetes
// protobuf, with their parameters — or JSON when none is left. A watch in
// CBOR, say, could be neither checked nor ended when the rules change, so
// it would go on under the old selection. Every Kubernetes client reads
// JSON, and kube-apiserver may always answer with it.
func framableAccept(values []string) string {
	var kept []string
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			part = strings.TrimSpace(part)
			mediaType, _, err := mime.ParseMediaType(part)
			if err == nil && (mediaType == watchstream.MediaTypeJSON || mediaType == watchstream.MediaTypeProtobuf) {
				kept = append(kept, part)
			}
		}
	}
	if len(kept) == 0 {
		return watchstream.MediaTypeJSON
	}
	return strings.Join(kept, ", ")
}

// narrowToNothing narrows a list or watch to no object at all: the
// request's label selector AND a label both present and absent, which the
// API server matches against no object, in either mode.
func narrowToNothing(query url.Values) error {
	sel, err := labels.Parse(query.Get("labelSelector"))
	if err != nil {
		return fmt.Errorf("the request's labelSelector: %w", err)
	}
	present, err := labels.NewRequirement(ctrlmeshv1alpha1.ShardingHashLabel, selection.Exists, nil)
	if err != nil {
		return err
	}
	absent, err := labels.NewRequirement(ctrlmeshv1alpha1.ShardingHashLabel, selection.DoesNotExist, nil)
	if err != nil {
		return err
	}
	query.Set("labelSelector", sel.Add(*present, *absent).String())
	return nil
}

// serveWrite fences a write of an object of namespace ns — for a Namespace,
// the one it names: it passes only when the pod's shard serves ns. Every
// write verb and subresource (status, scale, eviction, finalize…), dry runs
// and server-side apply included, comes here: what the write changes is
// named by its path, whatever the verb.
func (p *Proxy) serveWrite(w http.ResponseWriter, r *http.Request, st *state, info *request.RequestInfo, ns string) {
	snap := st.snap
	resource := info.Resource
	if info.Subresource != "" {
		resource += "/" + info.Subresource
	}
	what := fmt.Sprintf("%s of %s in namespace %q", info.Verb, resource, ns)
	if info.APIGroup == "" && info.Resource == namespacesResource.Resource {
		what = fmt.Sprintf("%s of Namespace %q", info.Verb, ns)
		if info.Subresource != "" {
			what = fmt.Sprintf("%s of %s of Namespace %q", info.Verb, info.Subresource, ns)
		}
	}
	var refusal string
	switch {
	case st.withdrawn != "":
		refusal = fmt.Sprintf("ctrlmesh proxy: %s is refused: %s", what, st.withdrawn)
	case ns == "":
		refusal = fmt.Sprintf("ctrlmesh proxy: %s of %s across all namespaces is refused: the resource is sharded, and this pod serves only %s",
			info.Verb, resource, ownershipText(snap))
	case !snap.Owns(ns):
		refusal = fmt.Sprintf("ctrlmesh proxy: %s is refused: its bucket %d %s; this pod (shard %q) serves %s (rules generation %d)",
			what, snap.Bucket(ns), ownerText(snap, ns), snap.Shard, ownershipText(snap), snap.Generation())
	}
	if refusal == "" {
		p.pass(w, r, info.Verb)
		return
	}
	p.fence(w, info, refusal)
}

// fence refuses a write with 403.
func (p *Proxy) fence(w http.ResponseWriter, info *request.RequestInfo, refusal string) {
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

var namespacesResource = schema.GroupResource{Resource: "namespaces"}

// serveNamespace fences writes of Namespace objects, which a limit on every
// resource shards. A Namespace is cluster-scoped, yet it belongs to the
// shard that serves the namespace it names: updating, finalizing or
// deleting another shard's Namespace changes or deletes that shard's
// objects. A create names its Namespace in the body. Reads pass, as for any
// cluster-scoped resource.
func (p *Proxy) serveNamespace(w http.ResponseWriter, r *http.Request, st *state, info *request.RequestInfo) {
	switch info.Verb {
	case "update", "patch", "delete":
		p.serveWrite(w, r, st, info, info.Name)
	case "deletecollection":
		p.fence(w, info, fmt.Sprintf("ctrlmesh proxy: deletecollection of Namespaces is refused: each belongs to the shard that serves it, and this pod serves only %s",
			ownershipText(st.snap)))
	case "create":
		name, out, err := p.bodyName(r)
		if err != nil {
			p.fence(w, info, fmt.Sprintf("ctrlmesh proxy: create of a Namespace is refused: %v; this pod may create only the namespaces its shard serves (%s), named in metadata.name",
				err, ownershipText(st.snap)))
			return
		}
		p.serveWrite(w, out, st, info, name)
	default:
		p.pass(w, r, info.Verb)
	}
}

// bodyName reads metadata.name from a request body of at most
// maxNamedBody bytes, and returns the request to forward, its body
// restored.
func (p *Proxy) bodyName(r *http.Request) (string, *http.Request, error) {
	if r.Body == nil {
		return "", r, errors.New("the request has no body")
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxNamedBody+1))
	if err != nil {
		return "", r, fmt.Errorf("reading the request body: %w", err)
	}
	out := r.Clone(r.Context())
	out.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(body), r.Body), Closer: r.Body}
	if len(body) > maxNamedBody {
		return "", out, fmt.Errorf("the body is larger than %d bytes", maxNamedBody)
	}
	name, err := p.bodies.name(r.Header.Get("Content-Type"), body)
	if err != nil {
		return "", out, err
	}
	if name == "" {
		return "", out, errors.New("the body names no object (metadata.generateName leaves the name to the API server)")
	}
	return name, out, nil
}

// lockNamespace reports whether namespace ns may hold the pod's
// leader-election lock of resource gr: the namespace of its rules, where
// the operator runs and leads, whichever shard serves it; or a namespace
// the fence lets the pod write gr in anyway (gr is not sharded, or the
// shard serves the namespace). Anywhere else an object named like the lock
// is an ordinary object of another shard's namespace, fenced like any
// other.
func lockNamespace(snap *rules.Snapshot, gr schema.GroupResource, ns string) bool {
	if ns != "" && ns == snap.Route.Namespace {
		return true
	}
	_, sharded := snap.LimitFor(gr)
	return !sharded || (ns != "" && snap.Owns(ns))
}

// serveLock serves the requests on the pod's leader-election lock: those of
// a lock kind, in a namespace that may hold the lock (lockNamespace), that
// name the lock or a shard's lock <lock>---<shard> — by the path, by the
// body of a create, or by a metadata.name field selector. They skip the
// fence and go to LockUpstream, where the pod's agent reads the locks: the
// lock's own name renamed to the shard's lock; the shard's lock as it is
// (client-go renews by the name the responses carry); another shard's lock
// to be read only. Any other request is not handled, and the request to
// route on is returned: it may carry a body serveLock buffered.
func (p *Proxy) serveLock(w http.ResponseWriter, r *http.Request, st *state, info *request.RequestInfo, gr schema.GroupResource) (*http.Request, bool) {
	snap := st.snap
	if !lockNamespace(snap, gr, info.Namespace) {
		return r, false
	}
	lock := snap.LeaderElectionName
	shardLock := ctrlmeshv1alpha1.ShardLockName(lock, snap.Shard)
	fail := func(code int32, reason metav1.StatusReason, msg string) (*http.Request, bool) {
		p.count(info.Verb, outcomeRefused)
		apistatus.Write(w, code, reason, "ctrlmesh proxy: "+msg, nil)
		return nil, true
	}
	// For a list or watch, RequestInfo takes the name from a metadata.name
	// field selector when the path names no object.
	pathNamesObject := len(info.Parts) >= 2
	name := info.Name
	// out is cloned only to be changed: most requests of a lock kind are not
	// on the lock (every ConfigMap is of one), and pass on unchanged.
	out := r
	var body []byte
	bodyName := ""
	if (info.Verb == "create" || info.Verb == "update") && r.Body != nil {
		out = r.Clone(r.Context())
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, maxNamedBody+1))
		if err != nil {
			return fail(http.StatusBadRequest, metav1.StatusReasonBadRequest, "reading the request body: "+err.Error())
		}
		// A body too large to be a lock is forwarded whole: what was read,
		// then the rest.
		out.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(body), r.Body), Closer: r.Body}
		if len(body) <= maxNamedBody {
			bodyName, _ = p.bodies.name(r.Header.Get("Content-Type"), body)
		}
		if info.Verb == "create" {
			name = bodyName
		}
	}
	switch {
	case name == lock:
	case snap.Assigned() && name == shardLock:
		// The shard's lock, by the name the responses carry.
		p.count(info.Verb, outcomeLock)
		p.lockReverse.ServeHTTP(w, out)
		return nil, true
	case strings.HasPrefix(name, ctrlmeshv1alpha1.ShardLockName(lock, "")):
		owner := strings.TrimPrefix(name, ctrlmeshv1alpha1.ShardLockName(lock, ""))
		if info.Verb != "get" && info.Verb != "list" && info.Verb != "watch" {
			msg := fmt.Sprintf("ctrlmesh proxy: %s of %s %q is refused: it is the leader-election lock of shard %q, and this pod (shard %q) may take only its own",
				info.Verb, info.Resource, name, owner, snap.Shard)
			if st.withdrawn != "" {
				msg = fmt.Sprintf("ctrlmesh proxy: %s of the leader-election lock %q is refused: %s", info.Verb, name, st.withdrawn)
			}
			p.fence(w, info, msg)
			return nil, true
		}
		p.count(info.Verb, outcomeLock)
		p.lockReverse.ServeHTTP(w, out)
		return nil, true
	default:
		// Another object of a lock kind: route it as usual, with the body
		// as buffered.
		return out, false
	}
	if !snap.Assigned() {
		msg := fmt.Sprintf("pod %s is not assigned a shard yet, so it may not take the leader-election lock %q", snap.Pod, lock)
		if st.withdrawn != "" {
			msg = st.withdrawn
		}
		return fail(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, msg)
	}
	if out == r {
		out = r.Clone(r.Context())
	}
	if pathNamesObject {
		path, err := renameNameSegment(r.URL.Path, info.Parts, lock, shardLock)
		if err != nil {
			return fail(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
		}
		out.URL.Path, out.URL.RawPath = path, ""
	}
	if info.Verb == "list" || info.Verb == "watch" {
		query := out.URL.Query()
		sel, renamed, err := renameFieldSelector(query.Get("fieldSelector"), lock, shardLock)
		if err != nil {
			return fail(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
		}
		if renamed {
			query.Set("fieldSelector", sel)
			out.URL.RawQuery = query.Encode()
		}
	}
	if bodyName == lock {
		renamedBody, err := p.bodies.rename(r.Header.Get("Content-Type"), body, shardLock)
		if err != nil {
			return fail(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
		}
		out.Body = io.NopCloser(bytes.NewReader(renamedBody))
		out.ContentLength = int64(len(renamedBody))
		out.Header.Set("Content-Length", strconv.Itoa(len(renamedBody)))
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
