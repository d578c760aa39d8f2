// Package webhookutil serves ctrlmesh's admission webhooks through
// controller-runtime's admission webhook.
package webhookutil

import (
	"context"
	"net/http"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
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
