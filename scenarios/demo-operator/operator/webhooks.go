package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// isConfigMap tells whether req is about a core/v1 ConfigMap.
func isConfigMap(req admission.Request) bool {
	return req.Kind.Group == "" && req.Kind.Kind == "ConfigMap"
}

// decodeManaged decodes the object of req when it is a ConfigMap that
// carries the managed label. It returns nil and no error for anything else.
func decodeManaged(decoder admission.Decoder, req admission.Request) (*corev1.ConfigMap, error) {
	if !isConfigMap(req) || len(req.Object.Raw) == 0 {
		return nil, nil
	}
	var cm corev1.ConfigMap
	if err := decoder.Decode(req, &cm); err != nil {
		return nil, fmt.Errorf("decoding ConfigMap %s/%s: %w", req.Namespace, req.Name, err)
	}
	if cm.Labels[ManagedLabel] != ManagedValue {
		return nil, nil
	}
	return &cm, nil
}

// mutator stamps managed ConfigMaps with the pod that admitted them.
type mutator struct {
	pod     string
	decoder admission.Decoder
}

func (m *mutator) Handle(_ context.Context, req admission.Request) admission.Response {
	cm, err := decodeManaged(m.decoder, req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if cm == nil {
		return admission.Allowed("not a managed ConfigMap")
	}
	if cm.Annotations[AdmittedByAnnotation] == m.pod {
		return admission.Allowed("already admitted by " + m.pod)
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[AdmittedByAnnotation] = m.pod
	mutated, err := json.Marshal(cm)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encoding ConfigMap %s/%s: %w", req.Namespace, req.Name, err))
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, mutated)
}

// validator refuses managed ConfigMaps whose data has the key ForbiddenKey.
type validator struct {
	pod     string
	decoder admission.Decoder
}

func (v *validator) Handle(_ context.Context, req admission.Request) admission.Response {
	cm, err := decodeManaged(v.decoder, req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if cm == nil {
		return admission.Allowed("not a managed ConfigMap")
	}
	if _, ok := cm.Data[ForbiddenKey]; ok {
		return admission.Denied(RefusalMessage(v.pod))
	}
	return admission.Allowed("")
}

// RefusalMessage is the validating webhook's message for a managed
// ConfigMap with the data key ForbiddenKey, as refused by pod.
func RefusalMessage(pod string) string {
	return fmt.Sprintf("demo operator pod %q refused the ConfigMap: data key %q is not allowed in a ConfigMap labeled %s=%s",
		pod, ForbiddenKey, ManagedLabel, ManagedValue)
}
