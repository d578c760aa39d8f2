package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"k8s.io/apimachinery/pkg/api/equality"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// Loader checks rules offered by a source and puts good ones in force. Bad
// rules are refused with an error and the last good rules stay.
type Loader struct {
	Proxy  *Proxy
	Pod    string
	Scopes rules.Scopes
	// Mode fixes the selector mode; when empty, DetectMode decides, once.
	Mode rules.Mode
	// Upstream and Mapper are used to detect the mode.
	Upstream *rest.Config
	Mapper   meta.RESTMapper
	Log      logr.Logger

	mu sync.Mutex
}

// Offer compiles route and, when it is good, puts it in force.
func (l *Loader) Offer(ctx context.Context, route *ctrlmeshv1alpha1.ShardRoute) (*rules.Snapshot, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	snap, err := l.compile(ctx, route)
	if err != nil {
		l.Proxy.metrics.rulesLoaded.With("refused").Inc()
		l.Log.Error(err, "rules refused; the last good rules stay in force", "hash", route.Spec.RulesHash, "generation", route.Spec.RoutingGeneration)
		return nil, err
	}
	l.Proxy.metrics.rulesLoaded.With("applied").Inc()
	l.Proxy.SetRules(snap)
	return snap, nil
}

func (l *Loader) compile(ctx context.Context, route *ctrlmeshv1alpha1.ShardRoute) (*rules.Snapshot, error) {
	if l.Mode == "" {
		gr, ok := rules.ProbeResource(route)
		if !ok {
			return nil, errors.New("cannot detect the selector mode: the limits name no resource without wildcards; set the mode explicitly")
		}
		mode, err := DetectMode(ctx, l.Upstream, l.Mapper, gr)
		if err != nil {
			return nil, fmt.Errorf("detecting the selector mode: %w", err)
		}
		l.Log.Info("selector mode detected", "mode", mode, "probe", gr.String())
		l.Mode = mode
	}
	return rules.Compile(route, l.Pod, l.Mode, l.Scopes)
}

// parseRulesFile reads a ShardRoute from the YAML or JSON content of the
// file path, refusing fields the schema does not know.
func parseRulesFile(path string, data []byte) (*ctrlmeshv1alpha1.ShardRoute, error) {
	var route ctrlmeshv1alpha1.ShardRoute
	if err := yaml.UnmarshalStrict(data, &route); err != nil {
		return nil, fmt.Errorf("rules file %s: %w", path, err)
	}
	return &route, nil
}

// RunFileSource offers the rules in path now and whenever its content
// changes, checking every interval (files mounted from ConfigMaps change by
// symlink swaps, which polling the content sees reliably); a file deleted
// withdraws them (Proxy.Withdraw). It returns when ctx ends.
func RunFileSource(ctx context.Context, path string, interval time.Duration, loader *Loader) {
	var last []byte
	check := func() {
		// The content is compared before it is parsed: parsing the YAML
		// every interval cost 3.5 ms of CPU a second with the benchmark's
		// rules (20 policies; make bench-proxy -proxy-cpuprofile).
		data, err := os.ReadFile(path)
		if err != nil {
			data = nil
		}
		if errors.Is(err, fs.ErrNotExist) {
			// Gone, as a deleted ShardRoute: keeping the last rules would
			// serve buckets the hub may give elsewhere.
			if last != nil {
				last = nil
				loader.Proxy.Withdraw(fmt.Sprintf("the rules file %s was deleted", path))
				loader.Log.Info("rules file deleted: the proxy serves the operator's sharded reads empty, refuses its writes (403) and leader election (503) until it exists again", "path", path)
			}
			return
		}
		if data != nil && bytes.Equal(data, last) {
			return
		}
		last = data
		var route *ctrlmeshv1alpha1.ShardRoute
		if err == nil {
			route, err = parseRulesFile(path, data)
		}
		if err == nil && route.Spec.ValiditySeconds > 0 {
			err = fmt.Errorf("rules file %s: rules with spec.validitySeconds are renewed through the ShardRoute's status, which a file has not: serve them from the ShardRoute (--rules-name) instead", path)
		}
		if err != nil {
			loader.Proxy.metrics.rulesLoaded.With("refused").Inc()
			loader.Log.Error(err, "rules file refused; the last good rules stay in force")
			return
		}
		// Offer logs and counts its own refusals.
		_, _ = loader.Offer(ctx, route)
	}
	check()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			check()
		}
	}
}

// APISource watches one ShardRoute through the API server (read-only:
// get/list/watch on shardroutes) and reports the applied rules hash into its
// status by server-side apply (patch on shardroutes/status).
type APISource struct {
	Config    *rest.Config
	Namespace string
	Name      string
	Loader    *Loader
}

// offer identifies a route offered to the Loader: the object and the
// generation of its spec.
type offer struct {
	uid        types.UID
	generation int64
}

// discoveryRetry is how soon rules that discovery kept from compiling are
// offered again.
const discoveryRetry = 5 * time.Second

// Run watches the rules until ctx ends.
func (s *APISource) Run(ctx context.Context) error {
	shardRoutes, err := shardRouteClient(s.Config)
	if err != nil {
		return fmt.Errorf("rules client: %w", err)
	}
	// The one ShardRoute, read with the pod's own rights in its namespace.
	informer := toolscache.NewSharedIndexInformer(
		toolscache.NewListWatchFromClient(shardRoutes, shardRoutesResource, s.Namespace, fields.OneTermEqualSelector("metadata.name", s.Name)),
		&ctrlmeshv1alpha1.ShardRoute{}, 0, toolscache.Indexers{})
	// The latest route seen, for the reporter to compare its status with.
	latest := make(chan *ctrlmeshv1alpha1.ShardRoute, 1)
	// offered is the route (object and generation) last offered; handle
	// runs from the informer's goroutine and from discovery retries, so it
	// holds mu.
	var mu sync.Mutex
	var offered offer
	// current is the route last seen, nil once deleted: a retry offers
	// it, never an older one.
	var current *ctrlmeshv1alpha1.ShardRoute
	var handle func(obj any)
	retry := func() {
		mu.Lock()
		route := current
		mu.Unlock()
		if route != nil && ctx.Err() == nil {
			handle(route)
		}
	}
	handle = func(obj any) {
		route, ok := obj.(*ctrlmeshv1alpha1.ShardRoute)
		if !ok {
			return
		}
		mu.Lock()
		current = route
		// Status writes (this proxy's reports among them) do not change
		// metadata.generation: only a new spec is offered, once. A route
		// created again under the name is a new object, whatever its
		// generation.
		if next := (offer{uid: route.UID, generation: route.Generation}); next != offered {
			offered = next
			// Offer logs and counts refusals; the last good rules stay.
			if _, err := s.Loader.Offer(ctx, route); errors.Is(err, rules.ErrDiscovery) {
				// Discovery failed, not the rules: offer them again.
				offered = offer{}
				time.AfterFunc(discoveryRetry, retry)
			}
		}
		// Under mu: two senders must not race for the one slot.
		replaceLatest(latest, route)
		mu.Unlock()
	}
	// withdraw takes the rules away when the ShardRoute is deleted.
	withdraw := func(any) {
		mu.Lock()
		defer mu.Unlock()
		offered, current = offer{}, nil
		s.Loader.Proxy.Withdraw(fmt.Sprintf("the ShardRoute %s/%s this pod followed was deleted", s.Namespace, s.Name))
		s.Loader.Log.Info("ShardRoute deleted: the proxy now serves the operator's sharded reads empty, refuses its writes (403) and leader election (503) until a ShardRoute of this name exists again. "+
			"To run the operator without ctrlmesh, remove the label "+ctrlmeshv1alpha1.EnableProxyLabel+" from its pod template and restart its pods",
			"shardRoute", s.Namespace+"/"+s.Name)
		// Nothing to report the applied rules into any more.
		replaceLatest(latest, nil)
	}
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
		// Also for a deletion the informer missed (a tombstone).
		DeleteFunc: withdraw,
	}); err != nil {
		return err
	}
	go s.report(ctx, shardRoutes, latest)
	informer.RunWithContext(ctx)
	return nil
}

// replaceLatest puts route into latest (capacity 1), dropping a value the
// reporter has not taken yet. Its caller must be latest's only sender (it
// holds the source's mu). It never blocks: it empties the slot without
// waiting, and then only the sender fills it. (Sending, and on a full slot
// receiving before sending again, blocked forever when the reporter took
// the value in between: the informer's handler then held mu for good, no
// later ShardRoute was offered, and the proxy never stopped.)
func replaceLatest(latest chan *ctrlmeshv1alpha1.ShardRoute, route *ctrlmeshv1alpha1.ShardRoute) {
	select {
	case <-latest:
	default:
	}
	latest <- route
}

// shardRoutesResource is the resource of ShardRoutes.
const shardRoutesResource = "shardroutes"

// shardRouteClient is a REST client of ctrlmesh.io/v1alpha1 that knows
// only ShardRoutes: the proxy reads nothing else of the API, and a scheme of
// every API would cost each sidecar memory for types it never sees.
func shardRouteClient(cfg *rest.Config) (*rest.RESTClient, error) {
	scheme := runtime.NewScheme()
	if err := ctrlmeshv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &ctrlmeshv1alpha1.GroupVersion
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	return rest.RESTClientFor(c)
}

// podReport is what a proxy reports of itself in status.pods[name=<pod>]:
// the rules hash the operator has taken up, and its renewal request.
type podReport struct {
	hash    string
	request int64
	// breakers are the proxy's breakers that are not closed.
	breakers []ctrlmeshv1alpha1.PodBreakerStatus
}

func (r podReport) equal(o podReport) bool {
	return r.hash == o.hash && r.request == o.request && equality.Semantic.DeepEqual(r.breakers, o.breakers)
}

func (r podReport) empty() bool { return r.equal(podReport{}) }

func reportedBy(route *ctrlmeshv1alpha1.ShardRoute, pod string) (podReport, int64) {
	for _, p := range route.Status.Pods {
		if p.Name == pod {
			return podReport{hash: p.AppliedRulesHash, request: p.RenewalRequest, breakers: p.Breakers}, p.RenewalGranted
		}
	}
	return podReport{}, 0
}

// renewals are the proxy's requests to renew its rules' validity (rules
// that expire, Fleet scope): each a number written into the status, kept
// with the time it was sent.
type renewals struct {
	// sent maps each outstanding request to when it was sent.
	sent map[int64]time.Time
	// current is the request the status should show; 0 for none.
	current int64
}

// next makes a new request, sent now.
func (r *renewals) next(now time.Time) {
	n := max(r.current+1, now.UnixNano())
	if r.sent == nil {
		r.sent = map[int64]time.Time{}
	}
	r.sent[n], r.current = now, n
}

// granted returns when the granted request was sent, forgetting it and
// every older one; false for a request this proxy did not send (an older
// proxy of the pod's) or already took.
func (r *renewals) granted(request int64) (time.Time, bool) {
	sentAt, ok := r.sent[request]
	if !ok {
		return time.Time{}, false
	}
	for n := range r.sent {
		if n <= request {
			delete(r.sent, n)
		}
	}
	return sentAt, true
}

// renewalPause is the least time between two renewal requests: the agent
// grants once per heartbeat, so asking faster gains nothing.
const renewalPause = time.Second

// report keeps {status.pods[name=pod]} showing the hash of the rules the
// operator has taken up (Proxy.Applied) and, for rules that expire, the
// proxy's current renewal request, applying both as the pod's own field
// manager: after every change, and whenever the status seen lacks them
// (someone overwrote the entry). A granted request renews the rules'
// validity from when it was sent, and the next request follows. Failed
// writes are retried with backoff. Driven by events, never by a ticker.
func (s *APISource) report(ctx context.Context, c *rest.RESTClient, latest <-chan *ctrlmeshv1alpha1.ShardRoute) {
	const initialBackoff = 100 * time.Millisecond
	backoff := initialBackoff
	var route *ctrlmeshv1alpha1.ShardRoute
	var retry, ask <-chan time.Time
	var requests renewals
	for {
		applied, changed := s.Loader.Proxy.Applied()
		breakers, breakersChanged := s.Loader.Proxy.Breakers()
		if route != nil {
			seen, granted := reportedBy(route, s.Loader.Pod)
			if validity := time.Duration(route.Spec.ValiditySeconds) * time.Second; validity > 0 {
				if sentAt, ok := requests.granted(granted); ok {
					s.Loader.Proxy.Renew(route.Spec.RulesHash, sentAt.Add(validity))
				}
				switch {
				case requests.current == 0:
					// Sent below: the time is taken before the write.
					requests.next(time.Now())
				case granted == requests.current && ask == nil:
					ask = time.After(renewalPause)
				}
			} else {
				requests = renewals{}
			}
			want := podReport{request: requests.current, breakers: breakers}
			if applied != nil {
				want.hash = applied.Hash()
			}
			if !want.equal(seen) && !want.empty() && retry == nil {
				if err := s.apply(ctx, c, route, want); err != nil {
					s.Loader.Log.V(1).Info("reporting to the ShardRoute's status failed; retrying", "error", err.Error(), "in", backoff)
					retry = time.After(backoff)
					backoff = min(2*backoff, 5*time.Second)
				} else {
					backoff = initialBackoff
					// Until the watch shows the new status, assume it landed.
					route = route.DeepCopy()
					setReported(route, s.Loader.Pod, want)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-breakersChanged:
		case route = <-latest:
		case <-retry:
			retry = nil
		case <-ask:
			ask = nil
			if route != nil && route.Spec.ValiditySeconds > 0 {
				if _, granted := reportedBy(route, s.Loader.Pod); granted == requests.current {
					requests.next(time.Now())
				}
			}
		}
	}
}

func (s *APISource) apply(ctx context.Context, c *rest.RESTClient, route *ctrlmeshv1alpha1.ShardRoute, report podReport) error {
	entry := map[string]any{"name": s.Loader.Pod}
	if report.hash != "" {
		entry["appliedRulesHash"] = report.hash
	}
	if report.request != 0 {
		entry["renewalRequest"] = report.request
	}
	if len(report.breakers) > 0 {
		// Its own list, replaced whole by each apply: a closed breaker's
		// entry goes.
		var breakers []any
		for _, b := range report.breakers {
			breakers = append(breakers, map[string]any{"policy": b.Policy, "name": b.Name, "state": string(b.State),
				"lastTransitionTime": b.LastTransitionTime.UTC().Format(time.RFC3339)})
		}
		entry["breakers"] = breakers
	}
	patch, err := json.Marshal(map[string]any{
		"apiVersion": ctrlmeshv1alpha1.GroupVersion.String(),
		"kind":       ctrlmeshv1alpha1.ShardRouteGVK.Kind,
		"metadata":   map[string]any{"namespace": route.Namespace, "name": route.Name},
		"status":     map[string]any{"pods": []any{entry}},
	})
	if err != nil {
		return err
	}
	return c.Patch(types.ApplyPatchType).Namespace(route.Namespace).Resource(shardRoutesResource).Name(route.Name).SubResource("status").
		Param("fieldManager", ctrlmeshv1alpha1.ProxyFieldManager(s.Loader.Pod)).Param("force", "true").
		Body(patch).Do(ctx).Error()
}

func setReported(route *ctrlmeshv1alpha1.ShardRoute, pod string, report podReport) {
	for i := range route.Status.Pods {
		if route.Status.Pods[i].Name == pod {
			route.Status.Pods[i].AppliedRulesHash, route.Status.Pods[i].RenewalRequest = report.hash, report.request
			route.Status.Pods[i].Breakers = report.breakers
			return
		}
	}
	route.Status.Pods = append(route.Status.Pods, ctrlmeshv1alpha1.PodRouteStatus{Name: pod, AppliedRulesHash: report.hash, RenewalRequest: report.request, Breakers: report.breakers})
}
