// Package apistatus writes Kubernetes Status errors, the error shape every
// Kubernetes client decodes, for the proxy and its webhook router.
package apistatus

import (
	"encoding/json"
	"net/http"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Write answers with a Kubernetes Status error.
func Write(w http.ResponseWriter, code int32, reason metav1.StatusReason, message string, details *metav1.StatusDetails) {
	status := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  message,
		Reason:   reason,
		Details:  details,
		Code:     code,
	}
	body, err := json.Marshal(status)
	if err != nil {
		http.Error(w, message, int(code))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if (code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests) && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(int(code))
	_, _ = w.Write(body)
}
