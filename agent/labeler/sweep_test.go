package labeler_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// TestSweepLabelsExistingObjects seeds 2,000 ConfigMaps in 20 namespaces —
// most without ctrlmesh labels, some with wrong ones — and checks one sweep
// labels every one of them correctly, leaving their other labels and data
// alone, and ConfigMaps of an uncontrolled namespace unlabeled.
func TestSweepLabelsExistingObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, dyn := clients(t)

	const (
		namespaces = 20
		perNS      = 100
		total      = namespaces * perNS
	)
	extra := map[string]string{"app": "seeded"}
	for i := range namespaces {
		createNamespace(t, ctx, cs, fmt.Sprintf("sweep-%02d", i), map[string]string{testSelectorKey: "sweep"})
	}
	createNamespace(t, ctx, cs, "sweep-outside", map[string]string{testSelectorKey: "other"})
	outside := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "left-alone", Namespace: "sweep-outside", Labels: extra}}
	if _, err := cs.CoreV1().ConfigMaps("sweep-outside").Create(ctx, outside, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	err := forEach(total, 32, func(i int) error {
		ns := fmt.Sprintf("sweep-%02d", i/perNS)
		labels := maps.Clone(extra)
		switch i % 20 {
		case 0: // a wrong bucket, and a control label already right
			labels[ctrlmeshv1alpha1.ShardingHashLabel] = "99"
			labels[ctrlmeshv1alpha1.ControlLabel] = "true"
		case 1: // right bucket, wrong namespace label
			labels = wantLabels(ns, extra)
			labels[ctrlmeshv1alpha1.NamespaceLabel] = "elsewhere"
		}
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%04d", i), Namespace: ns, Labels: labels, Annotations: map[string]string{"keep": "me"}},
			Data:       map[string]string{"index": fmt.Sprint(i)},
		}
		_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seeded %d ConfigMaps in %s", total, time.Since(start))

	reg := prometheus.NewRegistry()
	l, err := labeler.New(labeler.Options{
		Targets:     targetsFor("sweep"),
		Client:      dyn,
		Registerer:  reg,
		Log:         testr.New(t),
		QPS:         2000,
		Burst:       200,
		Concurrency: 16,
	})
	if err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	res, err := l.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first sweep: %+v in %s", res, time.Since(start))
	if res.Scanned != total || res.Unlabeled != total || res.Patched != total {
		t.Errorf("first sweep %+v, want %d scanned, unlabeled and patched", res, total)
	}
	if got := gauge(t, reg, "ctrlmesh_agent_unlabelled_objects"); got != total {
		t.Errorf("unlabeled gauge after the first sweep = %v, want %d", got, total)
	}
	if got := gauge(t, reg, "ctrlmesh_agent_labels_written_total"); got != total {
		t.Errorf("labels written = %v, want %d", got, total)
	}

	list, err := cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: "app=seeded"})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for i := range list.Items {
		cm := &list.Items[i]
		if cm.Namespace == "sweep-outside" {
			if !maps.Equal(cm.Labels, extra) {
				t.Errorf("uncontrolled ConfigMap labeled: %v", cm.Labels)
			}
			continue
		}
		checked++
		if err := checkLabeled(cm, extra); err != nil {
			t.Error(err)
		}
		var index int
		if _, err := fmt.Sscanf(cm.Name, "cm-%04d", &index); err != nil || cm.Data["index"] != fmt.Sprint(index) || len(cm.Data) != 1 {
			t.Errorf("%s/%s: data changed: %v", cm.Namespace, cm.Name, cm.Data)
		}
		if !maps.Equal(cm.Annotations, map[string]string{"keep": "me"}) {
			t.Errorf("%s/%s: annotations changed: %v", cm.Namespace, cm.Name, cm.Annotations)
		}
	}
	if checked != total {
		t.Errorf("checked %d ConfigMaps, want %d", checked, total)
	}

	start = time.Now()
	res, err = l.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second sweep: %+v in %s", res, time.Since(start))
	if res.Scanned != total || res.Unlabeled != 0 || res.Patched != 0 {
		t.Errorf("second sweep %+v, want %d scanned and nothing to patch", res, total)
	}
	if got := gauge(t, reg, "ctrlmesh_agent_unlabelled_objects"); got != 0 {
		t.Errorf("unlabeled gauge after the second sweep = %v, want 0", got)
	}
	if got := gauge(t, reg, "ctrlmesh_agent_labels_written_total"); got != total {
		t.Errorf("labels written after the second sweep = %v, want still %d", got, total)
	}
}
