// Package webhookutil serves ctrlmesh's admission webhooks through
// controller-runtime's admission webhook.
package webhookutil

import (
	"context"
	"errors"
	"net/http"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// ReviewFunc answers one admission request.
type ReviewFunc func(context.Context, *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse

// Handler serves review as an admission webhook: controller-runtime decodes
// the AdmissionReview (v1 or v1beta1), bounds its size, answers malformed
// ones with an errored response, sets the response's UID and recovers from
// panics; its logs go to log.
func Handler(review ReviewFunc, log logr.Logger) http.Handler {
	return &admission.Webhook{
		Handler: admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
			return admission.Response{AdmissionResponse: *review(ctx, &req.AdmissionRequest)}
		}),
		LogConstructor: func(logr.Logger, *admission.Request) logr.Logger { return log },
		RecoverPanic:   ptr.To(true),
	}
}

// SetPath points a client config at path: the URL's path, or the
// service's.
func SetPath(cc *admissionregistrationv1.WebhookClientConfig, path string) error {
	switch {
	case cc.Service != nil:
		cc.Service.Path = &path
	case cc.URL != nil:
		u := *cc.URL + path
		cc.URL = &u
	default:
		return errors.New("the webhook client config needs a URL or a service")
	}
	return nil
}
