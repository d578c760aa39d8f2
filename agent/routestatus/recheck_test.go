package routestatus

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

type scopesFunc func(schema.GroupResource) (bool, error)

func (f scopesFunc) IsNamespaced(gr schema.GroupResource) (bool, error) { return f(gr) }

// TestRecheckRulesRetriesDiscoveryErrors: a generation that discovery kept
// from being checked is neither refused nor accepted, and is checked again;
// a resource discovery does not know is the rules' fault and refused.
func TestRecheckRulesRetriesDiscoveryErrors(t *testing.T) {
	route := &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Generation: 3},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			RoutingGeneration: 2, RulesHash: "h2", Buckets: 32,
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Limits:   ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}}}},
			Shards:   []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: "0-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-0"}}}},
		},
	}
	tests := []struct {
		name      string
		scopes    scopesFunc
		wantCond  string // reason of the condition; "" for none
		wantRetry bool
	}{
		{"discovery fails", func(schema.GroupResource) (bool, error) {
			return false, errors.New("the server is currently unable to handle the request")
		},
			"", true},
		{"resource unknown", func(gr schema.GroupResource) (bool, error) {
			return false, &meta.NoResourceMatchError{PartialResource: gr.WithVersion("")}
		}, ctrlmeshv1alpha1.ReasonInvalidRules, false},
		{"discovery answers", func(schema.GroupResource) (bool, error) { return true, nil }, ctrlmeshv1alpha1.ReasonRulesValid, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Reconciler{Mode: rules.ModeRange, scopes: tt.scopes}
			cond, err := r.recheckRules(route)
			if retry := errors.Is(err, rules.ErrDiscovery); retry != tt.wantRetry {
				t.Errorf("error %v: retried %v, want %v", err, retry, tt.wantRetry)
			}
			switch {
			case tt.wantCond == "" && cond != nil:
				t.Errorf("condition %+v, want none while discovery fails", cond)
			case tt.wantCond != "" && (cond == nil || cond.Reason != tt.wantCond):
				t.Errorf("condition %+v, want reason %s", cond, tt.wantCond)
			}
		})
	}
}
