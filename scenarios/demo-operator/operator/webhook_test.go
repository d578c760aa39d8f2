package operator_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
	"github.com/ctrlmesh/ctrlmesh/test/certs"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestWebhooks registers the operator's webhooks with the API server and
// checks what the API server then admits, mutates and refuses.
func TestWebhooks(t *testing.T) {
	c := member(t)
	ns := newNamespace(t, c, "webhook-")
	const pod = "pod-w"

	certDir := t.TempDir()
	caPEM, err := certs.WriteServing(certDir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	port, healthPort := env.FreePort(t), env.FreePort(t)
	op := startOperator(t, c, operator.Options{
		PodName:                 pod,
		LeaderElectionNamespace: ns,
		WebhookPort:             port,
		WebhookCertDir:          certDir,
		HealthAddr:              fmt.Sprintf("127.0.0.1:%d", healthPort),
	})
	// /readyz includes the webhook server's own check (a TLS dial).
	waitReady(t, op, healthPort)
	installWebhooks(t, c, ns, port, caPEM)
	waitForWebhooks(t, c, ns, pod)

	tests := []struct {
		name           string
		labels         map[string]string
		data           map[string]string
		wantDenied     bool
		wantAdmittedBy string // "" for no annotation
	}{
		{name: "managed", labels: managedLabels(), data: map[string]string{"k": "v"}, wantAdmittedBy: pod},
		{name: "managed-forbidden", labels: managedLabels(), data: map[string]string{operator.ForbiddenKey: "x"}, wantDenied: true},
		{name: "unmanaged", data: map[string]string{"k": "v"}},
		{name: "unmanaged-forbidden", data: map[string]string{operator.ForbiddenKey: "x"}},
		{name: "managed-false-forbidden", labels: map[string]string{operator.ManagedLabel: "false"}, data: map[string]string{operator.ForbiddenKey: "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cm := newConfigMap(ns, tt.name, tt.labels, tt.data)
			err := createRetrying(t, c, cm)
			if tt.wantDenied {
				assertRefused(t, err, pod)
				if _, err := getConfigMap(c, ns, tt.name); !apierrors.IsNotFound(err) {
					t.Fatalf("the refused ConfigMap exists: Get = %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("creating: %v", err)
			}
			got, err := getConfigMap(c, ns, tt.name)
			if err != nil {
				t.Fatal(err)
			}
			if v := got.Annotations[operator.AdmittedByAnnotation]; v != tt.wantAdmittedBy {
				t.Fatalf("%s = %q, want %q", operator.AdmittedByAnnotation, v, tt.wantAdmittedBy)
			}
		})
	}

	t.Run("update-to-forbidden", func(t *testing.T) {
		cm, err := getConfigMap(c, ns, "managed")
		if err != nil {
			t.Fatal(err)
		}
		cm.Data[operator.ForbiddenKey] = "sneaked in"
		err = c.Client.Update(context.Background(), cm)
		if apierrors.IsConflict(err) { // the operator annotated it meanwhile: once more
			if cm, err = getConfigMap(c, ns, "managed"); err != nil {
				t.Fatal(err)
			}
			cm.Data[operator.ForbiddenKey] = "sneaked in"
			err = c.Client.Update(context.Background(), cm)
		}
		assertRefused(t, err, pod)
		got, err := getConfigMap(c, ns, "managed")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := got.Data[operator.ForbiddenKey]; ok {
			t.Fatal("the refused update was stored")
		}
	})
}

func assertRefused(t *testing.T, err error, pod string) {
	t.Helper()
	if err == nil {
		t.Fatal("admitted, want refused")
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), operator.RefusalMessage(pod)) {
		t.Fatalf("error = %v (reason %s), want Forbidden containing %q", err, apierrors.ReasonForError(err), operator.RefusalMessage(pod))
	}
}

// waitReady waits for the operator's /readyz to answer 200.
func waitReady(t *testing.T, op *instance, healthPort int) {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)
	httpClient := &http.Client{Timeout: time.Second}
	eventually(t, 30*time.Second, func() (bool, string) {
		if ok, err := op.running(); !ok {
			t.Fatalf("operator %s stopped: %v", op.pod, err)
		}
		resp, err := httpClient.Get(url)
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("GET %s: %s", url, resp.Status)
	})
}

// installWebhooks registers both webhooks for managed ConfigMaps in ns only,
// so that they touch no other test's objects, and removes them at the end.
func installWebhooks(t *testing.T, c *env.Cluster, ns string, port int, caPEM []byte) {
	t.Helper()
	clientConfig := func(path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{
			URL:      ptr.To(fmt.Sprintf("https://127.0.0.1:%d%s", port, path)),
			CABundle: caPEM,
		}
	}
	rules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"},
			Scope: ptr.To(admissionregistrationv1.NamespacedScope),
		},
	}}
	objectSelector := &metav1.LabelSelector{MatchLabels: managedLabels()}
	namespaceSelector := &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}

	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "demo-operator-" + ns},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "mutate.demo.ctrlmesh.io",
			ClientConfig:            clientConfig(operator.MutatePath),
			Rules:                   rules,
			ObjectSelector:          objectSelector,
			NamespaceSelector:       namespaceSelector,
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "demo-operator-" + ns},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "validate.demo.ctrlmesh.io",
			ClientConfig:            clientConfig(operator.ValidatePath),
			Rules:                   rules,
			ObjectSelector:          objectSelector,
			NamespaceSelector:       namespaceSelector,
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
	for _, obj := range []client.Object{mutating, validating} {
		if err := c.Client.Create(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
		// Cleanups run last-in first-out: the configurations go before the
		// operator that serves them stops.
		t.Cleanup(func() {
			if err := c.Client.Delete(context.Background(), obj); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %T %s: %v", obj, obj.GetName(), err)
			}
		})
	}
}

// waitForWebhooks waits until the API server calls both webhooks: the API
// server loads webhook configurations asynchronously, so for a moment after
// creation objects are admitted without them.
func waitForWebhooks(t *testing.T, c *env.Cluster, ns, pod string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 30*time.Second, func() (bool, string) {
		probe := newConfigMap(ns, "", managedLabels(), map[string]string{"k": "v"})
		probe.GenerateName = "probe-"
		if err := c.Client.Create(ctx, probe); err != nil {
			return false, "creating a probe: " + err.Error()
		}
		_ = c.Client.Delete(ctx, probe)
		if probe.Annotations[operator.AdmittedByAnnotation] != pod {
			return false, "the mutating webhook is not called yet"
		}
		bad := newConfigMap(ns, "", managedLabels(), map[string]string{operator.ForbiddenKey: "x"})
		bad.GenerateName = "probe-forbidden-"
		err := c.Client.Create(ctx, bad)
		if err == nil {
			_ = c.Client.Delete(ctx, bad)
			return false, "the validating webhook is not called yet"
		}
		if !strings.Contains(err.Error(), operator.RefusalMessage(pod)) {
			return false, "creating a forbidden probe: " + err.Error()
		}
		return true, ""
	})
}

// createRetrying creates obj, retrying for a few seconds while the API
// server fails to reach the webhook server (a transient state), and returns
// the final result.
func createRetrying(t *testing.T, c *env.Cluster, obj client.Object) error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Client.Create(context.Background(), obj)
		if err == nil || !transientWebhookError(err) || time.Now().After(deadline) {
			return err
		}
		t.Logf("retrying after a transient webhook error: %v", err)
		time.Sleep(200 * time.Millisecond)
	}
}

func transientWebhookError(err error) bool {
	msg := err.Error()
	if !strings.Contains(msg, "failed calling webhook") {
		return false
	}
	for _, s := range []string{"connection refused", "no endpoints", "connection reset", "EOF", "i/o timeout"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
