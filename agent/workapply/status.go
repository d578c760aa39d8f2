package workapply

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// writeStatus sets the Work's Applied condition and, when manifest is not
// nil, its manifest status, writing only when that changes something. A
// failure leaves the manifest status as it was, as Karmada does.
func (a *Applier) writeStatus(ctx context.Context, work *workv1alpha1.Work, applied metav1.Condition, manifest *workv1alpha1.ManifestStatus) error {
	generation := work.Generation
	fresh := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if fresh {
			if err := a.hubReader.Get(ctx, client.ObjectKeyFromObject(work), work); err != nil {
				return err
			}
			if work.Generation != generation {
				// The spec changed since it was applied; its event
				// brings the new generation.
				return nil
			}
		}
		fresh = true
		status := work.Status.DeepCopy()
		meta.SetStatusCondition(&status.Conditions, applied)
		if manifest != nil {
			status.ManifestStatuses = []workv1alpha1.ManifestStatus{*manifest}
		}
		if sameStatus(&work.Status, status) {
			return nil
		}
		work.Status = *status
		return a.hub.Status().Update(ctx, work)
	})
	if err != nil {
		return fmt.Errorf("writing the status of Work %s/%s: %w", work.Namespace, work.Name, err)
	}
	return nil
}

// sameStatus compares Work statuses, their raw manifest statuses as JSON
// values: the API server's serialization orders keys unlike ours.
func sameStatus(a, b *workv1alpha1.WorkStatus) bool {
	if !equality.Semantic.DeepEqual(a.Conditions, b.Conditions) || len(a.ManifestStatuses) != len(b.ManifestStatuses) {
		return false
	}
	for i := range a.ManifestStatuses {
		x, y := a.ManifestStatuses[i], b.ManifestStatuses[i]
		if x.Identifier != y.Identifier || x.Health != y.Health || !sameJSON(x.Status, y.Status) {
			return false
		}
	}
	return true
}

func sameJSON(a, b *runtime.RawExtension) bool {
	if a == nil || b == nil {
		return a == b
	}
	var x, y any
	if json.Unmarshal(a.Raw, &x) != nil || json.Unmarshal(b.Raw, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
