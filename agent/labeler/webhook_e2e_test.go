package labeler_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/certs"
)

// serveWebhook serves the handler of targets over TLS on 127.0.0.1 and
// registers the targets' webhook configuration, pointed at it, with the API
// server. It returns the server; the test's cleanup removes both.
func serveWebhook(t *testing.T, ctx context.Context, cs kubernetes.Interface, targets labeler.Targets, name string) *httptest.Server {
	t.Helper()
	dir := t.TempDir()
	caPEM, err := certs.WriteServing(dir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.CertFile), filepath.Join(dir, certs.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	h, err := labeler.NewHandler(targets, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	cfg, err := targets.WebhookConfiguration(labeler.WebhookOptions{
		ConfigurationName: name,
		WebhookName:       name + ".labeler.ctrlmesh.io",
		ClientConfig:      admissionregistrationv1.WebhookClientConfig{URL: ptr.To(srv.URL + "/label"), CABundle: caPEM},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !isNotFound(err) {
			t.Error(err)
		}
	})
	return srv
}

// waitForWebhook creates probe ConfigMaps in ns until one comes back
// labeled: the API server has picked up the webhook configuration.
func waitForWebhook(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns string) {
	t.Helper()
	start := time.Now()
	for i := 0; ; i++ {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("probe-%d", i), Namespace: ns}}
		got, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if checkLabeled(got, nil) == nil {
			t.Logf("webhook called after %s", time.Since(start))
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the API server never called the webhook")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestWebhookLabelsNewObjects registers the webhook with a real API server
// and checks that ConfigMaps created or stripped of their labels in
// controlled namespaces come back labeled, and those of other namespaces
// untouched.
func TestWebhookLabelsNewObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, dyn := clients(t)
	namespaces := []string{"webhook-a", "webhook-b", "webhook-c"}
	for _, ns := range namespaces {
		createNamespace(t, ctx, cs, ns, map[string]string{testSelectorKey: "webhook"})
	}
	createNamespace(t, ctx, cs, "webhook-outside", nil)
	targets := targetsFor("webhook")
	serveWebhook(t, ctx, cs, targets, "labeler-webhook-test")
	waitForWebhook(t, ctx, cs, namespaces[0])

	// Created without labels, with other labels, with a wrong bucket.
	extra := map[string]string{"app": "x"}
	for i := range 30 {
		ns := namespaces[i%len(namespaces)]
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("new-%d", i), Namespace: ns}, Data: map[string]string{"k": "v"}}
		var want map[string]string
		switch i % 3 {
		case 1:
			cm.Labels = maps.Clone(extra)
			want = extra
		case 2:
			cm.Labels = map[string]string{ctrlmeshv1alpha1.ShardingHashLabel: "99"}
		}
		got, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := checkLabeled(got, want); err != nil {
			t.Error(err)
		}
		if !maps.Equal(got.Data, map[string]string{"k": "v"}) {
			t.Errorf("%s/%s: data %v", ns, got.Name, got.Data)
		}
	}

	// An update that strips the labels is labeled again.
	cm, err := cs.CoreV1().ConfigMaps(namespaces[1]).Get(ctx, "new-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Labels = nil
	got, err := cs.CoreV1().ConfigMaps(namespaces[1]).Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkLabeled(got, nil); err != nil {
		t.Errorf("after an update stripping the labels: %v", err)
	}

	// Namespaces outside the selector are left alone.
	outside := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "outside", Namespace: "webhook-outside"}}
	if got, err := cs.CoreV1().ConfigMaps("webhook-outside").Create(ctx, outside, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	} else if len(got.Labels) != 0 {
		t.Errorf("ConfigMap of an uncontrolled namespace labeled %v", got.Labels)
	}

	// The object selector skips objects already marked control=true, so a
	// wrong bucket under that mark passes the webhook; the sweep fixes it.
	marked := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "marked", Namespace: namespaces[2], Labels: map[string]string{
		ctrlmeshv1alpha1.ControlLabel: "true", ctrlmeshv1alpha1.ShardingHashLabel: "99",
	}}}
	got, err = cs.CoreV1().ConfigMaps(namespaces[2]).Create(ctx, marked, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels[ctrlmeshv1alpha1.ShardingHashLabel] != "99" {
		t.Fatalf("the webhook was called for an object marked control=true: labels %v", got.Labels)
	}
	l, err := labeler.New(labeler.Options{Targets: targets, Client: dyn, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := l.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Unlabeled != 1 || res.Patched != 1 {
		t.Errorf("sweep after the webhook: %+v, want exactly the marked ConfigMap patched", res)
	}
	got, err = cs.CoreV1().ConfigMaps(namespaces[2]).Get(ctx, "marked", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkLabeled(got, nil); err != nil {
		t.Errorf("after the sweep: %v", err)
	}
}

// TestResyncLabelsWhatTheWebhookMissed runs the Labeler with a 1 s period and
// checks that ConfigMaps created while the webhook is down, and after its
// configuration is deleted, are labeled within about one period.
func TestResyncLabelsWhatTheWebhookMissed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, dyn := clients(t)
	const ns = "resync"
	createNamespace(t, ctx, cs, ns, map[string]string{testSelectorKey: "resync"})
	targets := targetsFor("resync")
	const configName = "labeler-resync-test"
	srv := serveWebhook(t, ctx, cs, targets, configName)
	waitForWebhook(t, ctx, cs, ns)

	const period = time.Second
	l, err := labeler.New(labeler.Options{Targets: targets, Client: dyn, Log: testr.New(t), Period: period})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	stages := []struct {
		name    string
		disable func()
	}{
		{"handler down", srv.Close},
		{"configuration deleted", func() {
			if err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, configName, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for s, stage := range stages {
		stage.disable()
		var names []string
		for i := range 10 {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("missed-%d-%d", s, i), Namespace: ns}}
			got, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("%s: creating with failurePolicy Ignore: %v", stage.name, err)
			}
			if len(got.Labels) != 0 {
				t.Fatalf("%s: the webhook still labels: %v", stage.name, got.Labels)
			}
			names = append(names, cm.Name)
		}
		created := time.Now()
		for {
			pending := 0
			for _, name := range names {
				cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if checkLabeled(cm, nil) != nil {
					pending++
				}
			}
			if pending == 0 {
				break
			}
			// The next sweep starts at most one period after the creations and
			// takes some time itself: on CI's two loaded cores under -race a
			// sweep that began before the creations ended 3.2 s after them,
			// and the next labeled them at once. Without the resync they are
			// never labeled, so the bound only needs to be far from forever.
			if elapsed := time.Since(created); elapsed > 10*period {
				t.Fatalf("%s: %d of %d ConfigMaps still unlabeled after %s", stage.name, pending, len(names), elapsed)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("%s: resync labeled %d ConfigMaps %s after their creation (period %s)", stage.name, len(names), time.Since(created), period)
	}
}
