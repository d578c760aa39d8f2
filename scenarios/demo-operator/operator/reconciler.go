package operator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// DataHash is the first 16 hex digits of the SHA-256 of the ConfigMap's data
// and binary data, keys sorted. Each entry is written as its kind ("d" or
// "b"), key and value, each followed by a zero byte, so that no two distinct
// contents hash the same input.
func DataHash(cm *corev1.ConfigMap) string {
	h := sha256.New()
	write := func(kind, key string, value []byte) {
		h.Write([]byte(kind))
		h.Write([]byte{0})
		h.Write([]byte(key))
		h.Write([]byte{0})
		h.Write(value)
		h.Write([]byte{0})
	}
	for _, k := range sortedKeys(cm.Data) {
		write("d", k, []byte(cm.Data[k]))
	}
	for _, k := range sortedKeys(cm.BinaryData) {
		write("b", k, cm.BinaryData[k])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// reconciler stamps managed ConfigMaps with the pod that reconciled them and
// the hash of their data.
type reconciler struct {
	client   client.Client
	pod      string
	delay    time.Duration
	recorder Recorder
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	start := time.Now()
	outcome := OutcomeFailed
	defer func() {
		r.recorder.Record(Reconcile{Namespace: req.Namespace, Name: req.Name, Pod: r.pod, Start: start, End: time.Now(), Outcome: outcome})
	}()
	log := logf.FromContext(ctx)

	var cm corev1.ConfigMap
	if err := r.client.Get(ctx, req.NamespacedName, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			outcome = OutcomeAbsent
			log.V(1).Info("ConfigMap is gone")
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("getting ConfigMap %s: %w", req.NamespacedName, err)
	}
	outcome = OutcomeUnchanged

	hash := DataHash(&cm)
	if cm.Annotations[ReconciledByAnnotation] != r.pod || cm.Annotations[DataHashAnnotation] != hash {
		patch := client.MergeFrom(cm.DeepCopy())
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[ReconciledByAnnotation] = r.pod
		cm.Annotations[DataHashAnnotation] = hash
		if err := r.client.Patch(ctx, &cm, patch); err != nil {
			if apierrors.IsNotFound(err) {
				outcome = OutcomeAbsent
				log.V(1).Info("ConfigMap is gone")
				return ctrl.Result{}, nil
			}
			outcome = OutcomeFailed
			return ctrl.Result{}, fmt.Errorf("annotating ConfigMap %s: %w", req.NamespacedName, err)
		}
		outcome = OutcomeWritten
		log.V(1).Info("annotated ConfigMap", "dataHash", hash)
	}

	if r.delay > 0 {
		t := time.NewTimer(r.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return ctrl.Result{}, nil
}
