package routework

import (
	"testing"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// FuzzReadStatus: whatever an applier (Karmada's work-status controller, an
// agent of another version, or someone with status rights) wrote into a
// Work's status, the hub's reader returns an error or a report, never
// panics, and names the Work's cluster.
func FuzzReadStatus(f *testing.F) {
	f.Add(`{"observedGeneration":3,"pods":[{"name":"op-0","ready":true,"appliedRulesHash":"h"}],"leaders":[{"shard":"0","pod":"op-0"}]}`, "Healthy")
	f.Add(`{"pods":[{"name":"op-0"},{"name":"op-0"}]}`, "Unknown")
	f.Add(`{"pods":"not a list","extra":{"x":1}}`, "Unhealthy")
	f.Add(`null`, "")
	f.Fuzz(func(t *testing.T, status, health string) {
		work := &workv1alpha1.Work{
			ObjectMeta: metav1.ObjectMeta{Namespace: "karmada-es-member1", Name: "w", Generation: 1},
			Status: workv1alpha1.WorkStatus{ManifestStatuses: []workv1alpha1.ManifestStatus{{
				Identifier: workv1alpha1.ResourceIdentifier{Ordinal: 0, Group: "ctrlmesh.io", Version: "v1alpha1", Kind: "ShardRoute", Namespace: "ops", Name: "op"},
				Status:     &runtime.RawExtension{Raw: []byte(status)},
				Health:     workv1alpha1.ResourceHealth(health),
			}}},
		}
		report, err := ReadStatus(work)
		if err != nil {
			return
		}
		if report.Cluster != "member1" {
			t.Fatalf("cluster %q, want member1", report.Cluster)
		}
	})
}
