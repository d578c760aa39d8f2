package labeler

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// TestLabeledCondition: a route is Labeled only when every resource its
// limits name was swept without error; the API server's refusal, even
// wrapped and joined as the sweep returns it, is told apart.
func TestLabeledCondition(t *testing.T) {
	cms := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	forbidden := fmt.Errorf("labeler: listing v1/secrets: %w",
		apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "", errors.New("no rights")))
	for _, tc := range []struct {
		name      string
		resources []schema.GroupVersionResource
		res       SweepResult
		status    metav1.ConditionStatus
		reason    string
		mentions  string
	}{
		{"all swept", []schema.GroupVersionResource{cms, secrets},
			SweepResult{Swept: []schema.GroupVersionResource{cms, secrets}}, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonObjectsLabeled, ""},
		{"another route's resource failed", []schema.GroupVersionResource{cms},
			SweepResult{Swept: []schema.GroupVersionResource{cms, secrets}, Failed: map[schema.GroupVersionResource]error{secrets: forbidden}},
			metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonObjectsLabeled, ""},
		{"forbidden, joined with a patch error", []schema.GroupVersionResource{cms, secrets},
			SweepResult{Swept: []schema.GroupVersionResource{cms, secrets}, Failed: map[schema.GroupVersionResource]error{secrets: errors.Join(forbidden, errors.New("x"))}},
			metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonLabelerForbidden, "v1/secrets"},
		{"another error", []schema.GroupVersionResource{cms},
			SweepResult{Swept: []schema.GroupVersionResource{cms}, Failed: map[schema.GroupVersionResource]error{cms: errors.New("timeout")}},
			metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonLabelingFailed, "timeout"},
		{"not swept", []schema.GroupVersionResource{secrets},
			SweepResult{Swept: []schema.GroupVersionResource{cms}}, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonLabelingFailed, "not swept"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := labeledCondition(tc.resources, tc.res)
			if c.Type != ctrlmeshv1alpha1.ConditionLabeled || c.Status != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.mentions) {
				t.Errorf("condition %+v, want %s %s mentioning %q", c, tc.status, tc.reason, tc.mentions)
			}
		})
	}
}
