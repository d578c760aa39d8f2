package labeler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/go-logr/logr"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/webhookutil"
)

// LabelPatch returns the JSON patch that gives the object in obj (JSON) the
// labels want, touching nothing else: no operations if it has them already.
// It handles objects without metadata, or whose metadata has no labels.
func LabelPatch(obj []byte, want map[string]string) ([]jsonpatch.Operation, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	dec.UseNumber() // re-encode numbers as they were
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("labeler: decoding the object: %w", err)
	}
	if doc == nil {
		return nil, errors.New("labeler: the object is not a JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("labeler: data after the object")
	}
	meta, ok := doc["metadata"].(map[string]any)
	if !ok {
		if doc["metadata"] != nil {
			return nil, errors.New("labeler: the object's metadata is not a JSON object")
		}
		meta = map[string]any{}
		doc["metadata"] = meta
	}
	labels, ok := meta["labels"].(map[string]any)
	if !ok {
		if meta["labels"] != nil {
			return nil, errors.New("labeler: the object's labels are not a JSON object")
		}
		labels = map[string]any{}
		meta["labels"] = labels
	}
	changed := false
	for k, v := range want {
		if have, ok := labels[k].(string); !ok || have != v {
			labels[k] = v
			changed = true
		}
	}
	if !changed {
		return nil, nil
	}
	mutated, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("labeler: encoding the object: %w", err)
	}
	ops, err := jsonpatch.CreatePatch(obj, mutated)
	if err != nil {
		return nil, fmt.Errorf("labeler: diffing the object: %w", err)
	}
	return ops, nil
}

// Handler is the mutating admission webhook: it answers admission.k8s.io/v1
// AdmissionReviews for the targets' resources with a JSON patch adding the
// labels an object lacks on CREATE and UPDATE. It always allows: labeling
// must never block a write, and the Labeler's sweep mends what it misses.
type Handler struct {
	targets Targets
	log     logr.Logger
	webhook http.Handler
}

// NewHandler returns the webhook handler for targets.
func NewHandler(targets Targets, log logr.Logger) (*Handler, error) {
	if err := targets.Validate(); err != nil {
		return nil, err
	}
	h := &Handler{targets: targets, log: log}
	h.webhook = webhookutil.Handler(func(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		return h.review(req)
	}, log)
	return h, nil
}

// ServeHTTP serves AdmissionReviews (see webhookutil.Handler).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.webhook.ServeHTTP(w, r)
}

// review answers one request: allowed, with a patch if the object needs one.
func (h *Handler) review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return resp
	}
	gvr := schema.GroupVersionResource{Group: req.Resource.Group, Version: req.Resource.Version, Resource: req.Resource.Resource}
	if req.SubResource != "" || req.Namespace == "" || isSystemNamespace(req.Namespace) || !h.targets.hasResource(gvr) {
		return resp
	}
	ops, err := LabelPatch(req.Object.Raw, DesiredLabels(h.targets.Space, req.Namespace))
	if err != nil {
		// Allowed unpatched: the sweep labels the object later.
		h.log.Error(err, "Not labeling an object", "resource", resourceName(gvr), "namespace", req.Namespace, "name", req.Name)
		return resp
	}
	if len(ops) == 0 {
		return resp
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		h.log.Error(err, "Encoding a label patch failed", "resource", resourceName(gvr), "namespace", req.Namespace, "name", req.Name)
		return resp
	}
	resp.Patch = patch
	resp.PatchType = ptr.To(admissionv1.PatchTypeJSONPatch)
	return resp
}

// WebhookOptions name and locate the webhook for WebhookConfiguration.
type WebhookOptions struct {
	// ConfigurationName names the MutatingWebhookConfiguration.
	ConfigurationName string
	// WebhookName is the webhook's fully qualified name, such as
	// "labeler.ctrlmesh.io".
	WebhookName string
	// ClientConfig locates the Handler: a URL or a service, and the caBundle
	// that verifies it.
	ClientConfig admissionregistrationv1.WebhookClientConfig
}

// WebhookConfiguration is the MutatingWebhookConfiguration that sends the
// creations and updates of exactly the targets' resources, in the namespaces
// they control, to the Handler.
//
// Its object selector skips objects already labeled ctrlmesh.io/control=true,
// so most updates cost no call; an object of that label with a wrong hash or
// namespace label is therefore not fixed by the webhook but by the next sweep.
// It fails open (failurePolicy Ignore, 2 s timeout): objects created while
// the webhook is down are labeled by the sweep too.
func (r Targets) WebhookConfiguration(opts WebhookOptions) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if opts.ConfigurationName == "" || opts.WebhookName == "" {
		return nil, errors.New("labeler: the webhook configuration needs a name and a webhook name")
	}
	if (opts.ClientConfig.URL == nil) == (opts.ClientConfig.Service == nil) {
		return nil, errors.New("labeler: the webhook needs exactly one of a URL and a service")
	}
	nsSel := &metav1.LabelSelector{}
	if r.NamespaceSelector != nil {
		nsSel = r.NamespaceSelector.DeepCopy()
	}
	nsSel.MatchExpressions = append(nsSel.MatchExpressions, metav1.LabelSelectorRequirement{
		Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: ctrlmeshv1alpha1.SystemNamespaces(),
	})
	rules := make([]admissionregistrationv1.RuleWithOperations, 0, len(r.Resources))
	for _, gvr := range r.Resources {
		rules = append(rules, admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{
				APIGroups:   []string{gvr.Group},
				APIVersions: []string{gvr.Version},
				Resources:   []string{gvr.Resource},
				Scope:       ptr.To(admissionregistrationv1.NamespacedScope),
			},
		})
	}
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: opts.ConfigurationName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    opts.WebhookName,
			ClientConfig:            *opts.ClientConfig.DeepCopy(),
			Rules:                   rules,
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			NamespaceSelector:       nsSel,
			ObjectSelector:          &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: ctrlmeshv1alpha1.ControlLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{controlValue}}}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To[int32](2),
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
		}},
	}, nil
}
