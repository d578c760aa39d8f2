package inject

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"

	"github.com/go-logr/logr"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/webhookutil"
)

// podPatch returns the JSON patch that injects the proxy into the pod in
// podJSON, created in namespace, given the namespace's routes.
//
// The patch is the difference between the pod decoded into this module's
// Pod type and that Pod mutated, both encoded again. Diffing against
// podJSON itself would remove every field a newer API server sends that
// the Pod type does not know; diffing two encodings of the same type only
// ever touches what mutate changed, at paths that exist in podJSON too.
func podPatch(podJSON []byte, namespace string, routes []ctrlmeshv1alpha1.ShardRoute, opts Options) ([]jsonpatch.Operation, error) {
	var pod corev1.Pod
	// Case-sensitive, as the API server decodes: a key spelled otherwise
	// would be a path the patch cannot reach.
	if err := kjson.Unmarshal(podJSON, &pod); err != nil {
		return nil, fmt.Errorf("inject: decoding the pod: %w", err)
	}
	before, err := json.Marshal(&pod)
	if err != nil {
		return nil, fmt.Errorf("inject: encoding the pod: %w", err)
	}
	mutate(&pod, namespace, routes, opts)
	after, err := json.Marshal(&pod)
	if err != nil {
		return nil, fmt.Errorf("inject: encoding the injected pod: %w", err)
	}
	ops, err := jsonpatch.CreatePatch(before, after)
	if err != nil {
		return nil, fmt.Errorf("inject: diffing the pod: %w", err)
	}
	return ops, nil
}

// apiServerEndpoints are the ready IPv4 endpoints ("ip:port", sorted) of
// the kubernetes Service, from its EndpointSlice default/kubernetes, which
// kube-apiserver keeps.
func apiServerEndpoints(ctx context.Context, reader client.Reader) ([]string, error) {
	if reader == nil {
		return nil, errors.New("the agent reads no endpoints (inject.Options.APIServer is unset)")
	}
	var slice discoveryv1.EndpointSlice
	if err := reader.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceDefault, Name: "kubernetes"}, &slice); err != nil {
		return nil, fmt.Errorf("reading the EndpointSlice default/kubernetes: %w", err)
	}
	if slice.AddressType != discoveryv1.AddressTypeIPv4 {
		return nil, nil
	}
	var endpoints []string
	for _, e := range slice.Endpoints {
		if e.Conditions.Ready != nil && !*e.Conditions.Ready {
			continue
		}
		for _, a := range e.Addresses {
			for _, p := range slice.Ports {
				if p.Port != nil && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) {
					endpoints = append(endpoints, net.JoinHostPort(a, strconv.Itoa(int(*p.Port))))
				}
			}
		}
	}
	slices.Sort(endpoints)
	return slices.Compact(endpoints), nil
}

// Handler is the mutating admission webhook: it answers admission.k8s.io/v1
// AdmissionReviews of pod creations with a JSON patch injecting the proxy.
// Pods it cannot give a proxy are allowed with the skipped annotation; it
// denies only when it cannot decide (the ShardRoutes cannot be read, the
// pod cannot be decoded), so that failurePolicy Fail holds for those too.
type Handler struct {
	routes  client.Reader
	opts    Options
	log     logr.Logger
	webhook http.Handler
}

// NewHandler returns the webhook handler. routes reads ShardRoutes, usually
// from the agent's cache.
func NewHandler(routes client.Reader, opts Options, log logr.Logger) (*Handler, error) {
	if routes == nil {
		return nil, fmt.Errorf("inject: a reader of ShardRoutes is required")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	h := &Handler{routes: routes, opts: opts, log: log}
	h.webhook = webhookutil.Handler(h.review, log)
	return h, nil
}

// ServeHTTP serves AdmissionReviews (see webhookutil.Handler).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.webhook.ServeHTTP(w, r)
}

// review answers one request.
func (h *Handler) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation != admissionv1.Create || req.Resource.Group != "" || req.Resource.Resource != "pods" || req.SubResource != "" {
		return resp
	}
	deny := func(code int32, err error) *admissionv1.AdmissionResponse {
		h.log.Error(err, "Refusing a pod: cannot decide on its proxy", "namespace", req.Namespace, "name", req.Name)
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Message: err.Error()}
		return resp
	}
	var routes ctrlmeshv1alpha1.ShardRouteList
	if err := h.routes.List(ctx, &routes, client.InNamespace(req.Namespace)); err != nil {
		return deny(http.StatusInternalServerError, fmt.Errorf("ctrlmesh proxy injection: listing the ShardRoutes of namespace %s: %w", req.Namespace, err))
	}
	opts := h.opts
	if slices.ContainsFunc(routes.Items, func(r ctrlmeshv1alpha1.ShardRoute) bool {
		return r.Spec.Interception == ctrlmeshv1alpha1.InterceptIptables
	}) {
		endpoints, err := apiServerEndpoints(ctx, h.opts.APIServer)
		if err != nil {
			return deny(http.StatusInternalServerError, fmt.Errorf("ctrlmesh proxy injection: a ShardRoute of namespace %s asks for Iptables interception, which redirects the API server's endpoints: %w", req.Namespace, err))
		}
		opts.apiServerEndpoints = endpoints
	}
	ops, err := podPatch(req.Object.Raw, req.Namespace, routes.Items, opts)
	if err != nil {
		return deny(http.StatusBadRequest, fmt.Errorf("ctrlmesh proxy injection: %w", err))
	}
	h.log.V(1).Info("Pod admitted", "namespace", req.Namespace, "name", req.Name, "patchOperations", len(ops))
	if len(ops) == 0 {
		return resp
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return deny(http.StatusInternalServerError, fmt.Errorf("ctrlmesh proxy injection: encoding the patch: %w", err))
	}
	resp.Patch = patch
	resp.PatchType = ptr.To(admissionv1.PatchTypeJSONPatch)
	return resp
}
