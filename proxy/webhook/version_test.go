package webhook

import (
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// TestAdmissionVersion: the AdmissionReview version the router reads,
// spelled out so that the sidecar does not link k8s.io/api/admission/v1, is
// that package's.
func TestAdmissionVersion(t *testing.T) {
	if admissionGroup != admissionv1.SchemeGroupVersion.Group || admissionVersion != admissionv1.SchemeGroupVersion.Version {
		t.Errorf("the router reads %s/%s AdmissionReviews, k8s.io/api/admission/v1 is %s", admissionGroup, admissionVersion, admissionv1.SchemeGroupVersion)
	}
}
