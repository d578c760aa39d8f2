// Package webhook is the proxy's admission webhook router. The operator's
// webhook Service targets the router instead of the operator; the router
// sends each admission request to the operator pod whose shard serves the
// object's namespace: to its own operator on loopback, or to a peer's router,
// which serves it locally. It answers nothing on its own: when no operator can
// be asked, it fails with an HTTP error, so that kube-apiserver applies the
// webhook's failurePolicy.
package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	strictjson "sigs.k8s.io/json"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/apistatus"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/metrics"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/stop"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// ForwardedHeader marks a request one router forwarded to another; its value
// is the forwarding pod. A request carrying it is always served locally, so
// routers that disagree during a rule change never bounce a request around.
const ForwardedHeader = "X-Ctrlmesh-Forwarded"

// maxRequestBody bounds an admission review, as controller-runtime's webhook
// server does (an object and its old version, each up to 1.5 MiB, fit).
const maxRequestBody = 7 << 20

// DefaultCertCheckInterval is how often, at most, the serving certificate
// files are re-read to pick up a rotation.
const DefaultCertCheckInterval = 10 * time.Second

// Outcomes, the "outcome" label of ctrlmesh_proxy_webhook_requests_total.
const (
	OutcomeLocal       = "local"
	OutcomeForwarded   = "forwarded"
	OutcomeUnavailable = "unavailable"
	OutcomeInvalid     = "invalid"
)

// Options of a Router.
type Options struct {
	// Rules returns the rules in force — nil until they load — and, when
	// the pod must not route by them, why: they were withdrawn (the
	// ShardRoute deleted) or their validity lapsed, and peers may no longer
	// own what they say. The router then answers 503.
	Rules func() (snap *rules.Snapshot, refusal string)
	// ListenAddress is where Run serves HTTPS, such as ":9443". The
	// operator's webhook Service targets this port; the operator itself keeps
	// serving on webhook.port, which must be another port.
	ListenAddress string
	// ListenPort is the port peers' routers are reached at: it is appended to
	// a RoutePod address that carries no port. A RoutePod address of the form
	// "host:port" is used as it is. Run defaults it to the port it listens on.
	ListenPort int
	// CertDir, when set, is where the proxy container finds the operator's
	// serving certificate (tls.crt, tls.key, optionally ca.crt). Default: the
	// rules' webhook.certDir, which needs the operator's certificate volume
	// mounted at the same path in the proxy container.
	CertDir string
	// CertCheckInterval is how often, at most, the certificate files are
	// re-read. Default DefaultCertCheckInterval.
	CertCheckInterval time.Duration
	// Log for certificate loads and failures; nothing is logged per request
	// at Info level.
	Log logr.Logger
	// Registry receives the router's metrics; nil: a registry of its own,
	// read by nobody.
	Registry *metrics.Registry
}

// Router routes admission requests to the operator pod owning the object.
// It is an http.Handler; Serve and Run add the TLS server around it.
type Router struct {
	rules      func() (*rules.Snapshot, string)
	listenPort int
	log        logr.Logger
	certs      *certSource
	requests   *metrics.CounterVec
	// next rotates the choice among a shard's pods.
	next atomic.Uint64
}

// New builds a router.
func New(opts Options) (*Router, error) {
	if opts.Rules == nil {
		return nil, errors.New("webhook router: no rules source")
	}
	interval := opts.CertCheckInterval
	if interval <= 0 {
		interval = DefaultCertCheckInterval
	}
	rt := &Router{
		rules:      opts.Rules,
		listenPort: opts.ListenPort,
		log:        opts.Log,
	}
	registry := opts.Registry
	if registry == nil {
		registry = metrics.NewRegistry()
	}
	rt.requests = registry.NewCounterVec("ctrlmesh_proxy_webhook_requests_total",
		"Admission requests the webhook router handled, by outcome (local, forwarded, unavailable, invalid).", "outcome")
	// The certificate is the operator's whether or not the rules may be
	// routed by.
	rt.certs = newCertSource(opts.CertDir, func() *rules.Snapshot { snap, _ := opts.Rules(); return snap }, interval, opts.Log)
	for _, o := range []string{OutcomeLocal, OutcomeForwarded, OutcomeUnavailable, OutcomeInvalid} {
		rt.requests.With(o)
	}
	return rt, nil
}

// Run listens on opts.ListenAddress and serves until ctx ends.
func Run(ctx context.Context, opts Options) error {
	if opts.ListenAddress == "" {
		return errors.New("webhook router: no listen address")
	}
	l, err := net.Listen("tcp", opts.ListenAddress)
	if err != nil {
		return fmt.Errorf("webhook router: listening on %s: %w", opts.ListenAddress, err)
	}
	if opts.ListenPort == 0 {
		opts.ListenPort = l.Addr().(*net.TCPAddr).Port
	}
	rt, err := New(opts)
	if err != nil {
		_ = l.Close()
		return err
	}
	opts.Log.Info("webhook router serving", "address", l.Addr().String(), "peerPort", opts.ListenPort)
	return rt.Serve(ctx, l)
}

// Serve serves HTTPS on l, with the operator's serving certificate, until ctx
// ends. It closes l.
func (rt *Router) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           rt,
		TLSConfig:         rt.TLSConfig(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// TLS handshake failures (no certificate yet) and the like: debug
		// level, the certificate source logs its own failures.
		ErrorLog: log.New(logWriter{rt.log}, "", 0),
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(l, "", "") }()
	defer rt.certs.close()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		err := stop.Servers([]*http.Server{srv}, stop.Grace, rt.log)
		<-served
		return err
	}
}

// TLSConfig serves the operator's certificate, reloaded when its files change.
// The handshake fails while there is none (no rules yet, or unreadable files).
func (rt *Router) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			m, err := rt.certs.get()
			if err != nil {
				return nil, err
			}
			return m.cert, nil
		},
	}
}

// The AdmissionReview the router reads: admission.k8s.io/v1. Spelled out
// rather than taken from k8s.io/api/admission/v1, whose typed API (and
// authentication/v1's under it) the sidecar would link and register at
// start for two strings; TestAdmissionVersion holds them equal.
const (
	admissionGroup   = "admission.k8s.io"
	admissionVersion = "v1"
)

// reviewHead is the part of an AdmissionReview the router reads.
type reviewHead struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Request    *admissionRequest `json:"request"`
}

// admissionRequest is the part of an AdmissionReview's request the router
// routes by.
type admissionRequest struct {
	UID       string                      `json:"uid"`
	Resource  metav1.GroupVersionResource `json:"resource"`
	Namespace string                      `json:"namespace"`
}

// parseReview reads an admission.k8s.io/v1 AdmissionReview as kube-apiserver
// sends it: JSON with case-sensitive keys, as the API machinery decodes it
// (encoding/json's case-insensitive matching would let "APIVersion" or
// "NAMESPACE" stand in for the real fields), the kind and apiVersion, a
// request with a UID and a namespace that is empty or a namespace name.
// Anything else is an error, and the router refuses the review rather than
// route it by a guess.
func parseReview(body []byte) (*admissionRequest, error) {
	var review reviewHead
	if err := strictjson.UnmarshalCaseSensitivePreserveInts(body, &review); err != nil {
		return nil, fmt.Errorf("the body is not an AdmissionReview: %w", err)
	}
	if review.APIVersion != admissionGroup+"/"+admissionVersion || review.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("only %s/%s AdmissionReview is supported, got apiVersion %q kind %q: list only %q in the webhook's admissionReviewVersions",
			admissionGroup, admissionVersion, review.APIVersion, review.Kind, admissionVersion)
	}
	r := review.Request
	switch {
	case r == nil:
		return nil, errors.New("the AdmissionReview has no request")
	case r.UID == "":
		return nil, errors.New("the AdmissionReview's request has no uid")
	case r.Namespace != "" && len(validation.IsDNS1123Label(r.Namespace)) > 0:
		return nil, fmt.Errorf("the AdmissionReview's request.namespace %q is not a namespace name", r.Namespace)
	}
	return r, nil
}

// routeOf decides where the request goes under snap: served by the local
// operator (cluster-scoped objects, Namespaces themselves, requests another
// router forwarded, namespaces this pod's shard serves), or else by owner,
// the shard that serves the namespace — nil while nobody does (handover).
func routeOf(snap *rules.Snapshot, r *admissionRequest, forwarded bool) (local bool, owner *ctrlmeshv1alpha1.RouteShard) {
	ns := r.Namespace
	if ns == "" || // cluster-scoped
		(r.Resource.Group == "" && r.Resource.Resource == "namespaces") || // a Namespace itself
		forwarded ||
		snap.Owns(ns) {
		return true, nil
	}
	return false, snap.OwnerOf(ns)
}

// ServeHTTP routes one admission request.
func (rt *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		rt.fail(w, OutcomeInvalid, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed,
			"ctrlmesh webhook router: admission reviews are POSTed, not "+req.Method)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxRequestBody))
	if err != nil {
		rt.fail(w, OutcomeInvalid, http.StatusBadRequest, metav1.StatusReasonBadRequest,
			"ctrlmesh webhook router: reading the admission review: "+err.Error())
		return
	}
	review, err := parseReview(body)
	if err != nil {
		rt.fail(w, OutcomeInvalid, http.StatusBadRequest, metav1.StatusReasonBadRequest, "ctrlmesh webhook router: "+err.Error())
		return
	}

	snap, refusal := rt.rules()
	if snap == nil {
		rt.fail(w, OutcomeUnavailable, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			"ctrlmesh webhook router: the sharding rules are not loaded yet")
		return
	}
	if refusal != "" {
		rt.fail(w, OutcomeUnavailable, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			"ctrlmesh webhook router: this pod routes no admission requests: "+refusal)
		return
	}
	hook := snap.Route.Spec.Webhook
	if hook == nil {
		rt.fail(w, OutcomeUnavailable, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			fmt.Sprintf("ctrlmesh webhook router: the rules (generation %d) configure no webhook", snap.Generation()))
		return
	}
	if rt.listenPort != 0 && int(hook.Port) == rt.listenPort {
		rt.fail(w, OutcomeUnavailable, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			fmt.Sprintf("ctrlmesh webhook router: webhook.port %d is the router's own port: the operator must serve on another one", hook.Port))
		return
	}
	mat, err := rt.certs.get()
	if err != nil {
		rt.fail(w, OutcomeUnavailable, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			"ctrlmesh webhook router: "+err.Error())
		return
	}

	ns := review.Namespace
	local, owner := routeOf(snap, review, req.Header.Get(ForwardedHeader) != "")
	if local {
		operator := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(hook.Port)))
		resp, err := rt.send(req, mat, operator, body, "")
		if err != nil {
			rt.log.V(1).Info("the local operator could not be reached", "uid", review.UID, "error", err.Error())
			rt.fail(w, OutcomeUnavailable, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
				fmt.Sprintf("ctrlmesh webhook router: pod %s: the operator's webhook server at %s could not be reached: %v", snap.Pod, operator, err))
			return
		}
		rt.relay(w, resp, OutcomeLocal)
		return
	}
	if owner == nil {
		rt.fail(w, OutcomeUnavailable, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			fmt.Sprintf("ctrlmesh webhook router: no shard serves namespace %q (bucket %d) while it is handed over under rules generation %d; retry shortly",
				ns, snap.Bucket(ns), snap.Generation()))
		return
	}
	peers, err := rt.peers(snap, owner)
	if err != nil {
		rt.fail(w, OutcomeUnavailable, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			fmt.Sprintf("ctrlmesh webhook router: namespace %q is served by shard %q, but %v", ns, owner.ID, err))
		return
	}
	var errs []error
	for _, peer := range peers {
		resp, err := rt.send(req, mat, peer, body, snap.Pod)
		if err == nil {
			rt.relay(w, resp, OutcomeForwarded)
			return
		}
		errs = append(errs, fmt.Errorf("%s: %w", peer, err))
		// Try another pod only when this one was not reached at all: a
		// request that may have been delivered is not sent twice.
		if !errors.As(err, new(*dialError)) {
			break
		}
	}
	err = errors.Join(errs...)
	rt.log.V(1).Info("the owning shard could not be reached", "uid", review.UID, "shard", owner.ID, "error", err.Error())
	rt.fail(w, OutcomeUnavailable, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
		fmt.Sprintf("ctrlmesh webhook router: namespace %q is served by shard %q, whose pods could not be reached: %v", ns, owner.ID, err))
}

// peers are the router addresses of the shard's pods, in the order to try.
func (rt *Router) peers(snap *rules.Snapshot, owner *ctrlmeshv1alpha1.RouteShard) ([]string, error) {
	var addrs []string
	for _, p := range owner.Pods {
		if p.Address == "" || p.Name == snap.Pod {
			continue
		}
		addr, err := rt.peerAddress(p.Address)
		if err != nil {
			return nil, fmt.Errorf("pod %s: %w", p.Name, err)
		}
		addrs = append(addrs, addr)
	}
	if len(addrs) == 0 {
		return nil, errors.New("it has no pod with an address in this cluster")
	}
	start := int(rt.next.Add(1) % uint64(len(addrs)))
	return slices.Concat(addrs[start:], addrs[:start]), nil
}

// peerAddress is a RoutePod address as host:port: as it is when it carries a
// port, else with the router's ListenPort.
func (rt *Router) peerAddress(address string) (string, error) {
	if _, _, err := net.SplitHostPort(address); err == nil {
		return address, nil
	}
	if rt.listenPort == 0 {
		return "", fmt.Errorf("address %q has no port and the router's peer port is unknown", address)
	}
	return net.JoinHostPort(strings.Trim(address, "[]"), strconv.Itoa(rt.listenPort)), nil
}

// send POSTs the review to https://target with the incoming path and query.
func (rt *Router) send(in *http.Request, mat *material, target string, body []byte, forwardedBy string) (*http.Response, error) {
	u := url.URL{Scheme: "https", Host: target, Path: in.URL.Path, RawPath: in.URL.RawPath, RawQuery: in.URL.RawQuery}
	out, err := http.NewRequestWithContext(in.Context(), http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"Content-Type", "Accept"} {
		if v := in.Header.Values(h); len(v) > 0 {
			out.Header[h] = v
		}
	}
	if forwardedBy != "" {
		out.Header.Set(ForwardedHeader, forwardedBy)
	}
	return mat.transport.RoundTrip(out)
}

// relay answers with the response of whoever answered, status and body
// unchanged.
func (rt *Router) relay(w http.ResponseWriter, resp *http.Response, outcome string) {
	defer func() { _ = resp.Body.Close() }()
	rt.requests.With(outcome).Inc()
	for _, h := range []string{"Content-Type", "Content-Length"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		rt.log.V(1).Info("relaying the admission response failed", "error", err.Error())
	}
}

// fail answers with a Kubernetes Status error, never an admission response.
func (rt *Router) fail(w http.ResponseWriter, outcome string, code int32, reason metav1.StatusReason, message string) {
	rt.requests.With(outcome).Inc()
	apistatus.Write(w, code, reason, message, nil)
}

// logWriter turns the HTTP server's error log into debug logs.
type logWriter struct{ log logr.Logger }

func (l logWriter) Write(p []byte) (int, error) {
	l.log.V(1).Info(strings.TrimSpace(string(p)))
	return len(p), nil
}
