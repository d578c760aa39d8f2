package inject_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

const (
	operatorLabel = "app"
	operatorApp   = "demo-operator"
	certDir       = "/tmp/k8s-webhook-server/serving-certs"
)

// route is a ShardRoute selecting the operator's pods, with one shard that
// serves every bucket on the pods named.
func route(ns, name string, webhook *ctrlmeshv1alpha1.WebhookConfig, pods ...string) *ctrlmeshv1alpha1.ShardRoute {
	shard := ctrlmeshv1alpha1.RouteShard{ID: "0", Buckets: "0-31"}
	for _, p := range pods {
		shard.Pods = append(shard.Pods, ctrlmeshv1alpha1.RoutePod{Name: p})
	}
	return &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: "member", RoutingGeneration: 1, RulesHash: "h1", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{operatorLabel: operatorApp}},
			Webhook:  webhook,
			Limits: ctrlmeshv1alpha1.Limits{{
				RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}},
			}},
			Shards: []ctrlmeshv1alpha1.RouteShard{shard},
		},
	}
}

// operatorPod is an operator pod asking for the proxy, with an init
// container of its own and two containers.
func operatorPod(ns string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "demo-operator-", Namespace: ns,
			Labels: map[string]string{operatorLabel: operatorApp, ctrlmeshv1alpha1.EnableProxyLabel: "true"},
		},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "setup", Image: "busybox"}},
			Containers: []corev1.Container{
				{Name: "manager", Image: "demo-operator", Env: []corev1.EnvVar{{Name: "MODE", Value: "sharded"}}},
				{Name: "sidekick", Image: "busybox"},
			},
		},
	}
}

// withCertVolume mounts a Secret volume at certDir in the manager container,
// as a kubebuilder operator with webhooks does.
func withCertVolume(pod *corev1.Pod) *corev1.Pod {
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
		Name: "cert", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "webhook-server-cert"}},
	})
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "cert", MountPath: certDir})
	return pod
}

func createPod(t *testing.T, ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	got, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// proxyOf returns the pod's proxy container, failing unless there is
// exactly one, as an init container.
func proxyOf(t *testing.T, pod *corev1.Pod) corev1.Container {
	t.Helper()
	var found []corev1.Container
	for _, c := range pod.Spec.InitContainers {
		if c.Name == ctrlmeshv1alpha1.ProxyContainerName {
			found = append(found, c)
		}
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == ctrlmeshv1alpha1.ProxyContainerName {
			t.Errorf("pod %s: the proxy is a regular container", pod.Name)
		}
	}
	if len(found) != 1 {
		t.Fatalf("pod %s: %d proxy init containers, want 1", pod.Name, len(found))
	}
	return found[0]
}

// checkInjected checks the proxy of rules injected into pod, with the
// arguments beyond the common ones in extraArgs, and every container of the
// pod wired to it.
func checkInjected(t *testing.T, pod *corev1.Pod, rules string, extraArgs ...string) corev1.Container {
	t.Helper()
	if got := pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation]; got != ctrlmeshv1alpha1.ProxyInjected {
		t.Errorf("annotation %s=%q, want %q (reason %q)", ctrlmeshv1alpha1.ProxyInjectionAnnotation, got, ctrlmeshv1alpha1.ProxyInjected, pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation])
	}
	proxy := proxyOf(t, pod)
	if last := pod.Spec.InitContainers[len(pod.Spec.InitContainers)-1].Name; last != ctrlmeshv1alpha1.ProxyContainerName {
		t.Errorf("last init container %q: the proxy must start after the pod's own init containers", last)
	}
	if proxy.RestartPolicy == nil || *proxy.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("proxy restartPolicy %v, want Always (a native sidecar)", proxy.RestartPolicy)
	}
	if proxy.Image != proxyImage {
		t.Errorf("proxy image %q", proxy.Image)
	}
	wantArgs := append([]string{
		"--rules-name=" + rules,
		"--operator-kubeconfig=" + inject.KubeconfigPath,
		"--listen-address=127.0.0.1:15080",
		"--health-address=:15081",
		"--forward-proxy-address=127.0.0.1:15082",
		"--state-dir=" + inject.StateDir,
	}, extraArgs...)
	if !slices.Equal(proxy.Args, wantArgs) {
		t.Errorf("proxy args %q, want %q", proxy.Args, wantArgs)
	}
	wantFields := map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IP": "status.podIP"}
	if len(proxy.Env) != len(wantFields) {
		t.Errorf("proxy env %+v, want exactly %v from the downward API", proxy.Env, wantFields)
	}
	for _, e := range proxy.Env {
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != wantFields[e.Name] {
			t.Errorf("proxy env %s: %+v, want the field %q", e.Name, e.ValueFrom, wantFields[e.Name])
		}
	}
	checkProbe(t, "startup", proxy.StartupProbe, "/readyz")
	checkProbe(t, "readiness", proxy.ReadinessProbe, "/readyz")
	checkProbe(t, "liveness", proxy.LivenessProbe, "/healthz")
	if p := proxy.StartupProbe; p != nil && time.Duration(p.PeriodSeconds*p.FailureThreshold)*time.Second < time.Minute {
		t.Errorf("startup probe allows %ds: not generous enough for a loaded API server", p.PeriodSeconds*p.FailureThreshold)
	}
	checkSecure(t, proxy.SecurityContext)
	req, lim := proxy.Resources.Requests, proxy.Resources.Limits
	if !req.Cpu().Equal(inject.DefaultCPURequest) || !req.Memory().Equal(inject.DefaultMemoryRequest) || !lim.Memory().Equal(inject.DefaultMemoryLimit) || !lim.Cpu().IsZero() {
		t.Errorf("proxy resources %+v, want the defaults and no CPU limit", proxy.Resources)
	}
	if !slices.Contains(proxy.VolumeMounts, corev1.VolumeMount{Name: inject.KubeconfigVolume, MountPath: inject.KubeconfigDir}) {
		t.Errorf("proxy mounts %+v: no writable kubeconfig volume", proxy.VolumeMounts)
	}

	volumes := 0
	for _, v := range pod.Spec.Volumes {
		if v.Name == inject.KubeconfigVolume {
			volumes++
			if v.EmptyDir == nil {
				t.Errorf("volume %s is not an emptyDir: %+v", v.Name, v.VolumeSource)
			}
		}
	}
	if volumes != 1 {
		t.Errorf("%d volumes %s, want 1", volumes, inject.KubeconfigVolume)
	}
	for _, c := range pod.Spec.Containers {
		var kubeconfigs []string
		for _, e := range c.Env {
			if e.Name == "KUBECONFIG" {
				kubeconfigs = append(kubeconfigs, e.Value)
			}
		}
		if !slices.Equal(kubeconfigs, []string{inject.KubeconfigPath}) {
			t.Errorf("container %s: KUBECONFIG %q, want once %q", c.Name, kubeconfigs, inject.KubeconfigPath)
		}
		want := corev1.VolumeMount{Name: inject.KubeconfigVolume, MountPath: inject.KubeconfigDir, ReadOnly: true}
		if n := countMounts(c.VolumeMounts, want); n != 1 {
			t.Errorf("container %s: mounts %+v, want %+v once", c.Name, c.VolumeMounts, want)
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.Name != ctrlmeshv1alpha1.ProxyContainerName && (len(c.Env) != 0 || len(c.VolumeMounts) != 0) {
			t.Errorf("init container %s changed: env %+v, mounts %+v", c.Name, c.Env, c.VolumeMounts)
		}
	}
	return proxy
}

func countMounts(mounts []corev1.VolumeMount, want corev1.VolumeMount) int {
	n := 0
	for _, m := range mounts {
		if m == want {
			n++
		}
	}
	return n
}

func checkProbe(t *testing.T, kind string, p *corev1.Probe, path string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s probe %+v, want an HTTP GET of %s", kind, p, path)
		return
	}
	if p.HTTPGet.Path != path || p.HTTPGet.Port.IntValue() != ctrlmeshv1alpha1.ProxyHealthPort {
		t.Errorf("%s probe gets %s on port %s, want %s on %d", kind, p.HTTPGet.Path, p.HTTPGet.Port.String(), path, ctrlmeshv1alpha1.ProxyHealthPort)
	}
}

func checkSecure(t *testing.T, sc *corev1.SecurityContext) {
	t.Helper()
	if sc == nil {
		t.Fatal("proxy has no securityContext")
	}
	isTrue := func(b *bool) bool { return b != nil && *b }
	isFalse := func(b *bool) bool { return b != nil && !*b }
	if !isTrue(sc.RunAsNonRoot) || !isFalse(sc.AllowPrivilegeEscalation) || !isTrue(sc.ReadOnlyRootFilesystem) || !isFalse(sc.Privileged) {
		t.Errorf("proxy securityContext %+v: want non-root, no privilege escalation, read-only root, unprivileged", sc)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("proxy capabilities %+v, want all dropped", sc.Capabilities)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("proxy seccomp %+v, want RuntimeDefault", sc.SeccompProfile)
	}
}

// TestInjectsSelectedPod creates an operator pod that a ShardRoute selects
// and checks the native sidecar and the containers' wiring to it.
func TestInjectsSelectedPod(t *testing.T) {
	ctx := testContext(t)
	ns := createNamespace(t, ctx, "selected")
	createRoute(t, ctx, route(ns, "demo", nil))
	pod := createPod(t, ctx, operatorPod(ns))
	checkInjected(t, pod, "demo")
	if got := pod.Spec.InitContainers[0].Name; got != "setup" {
		t.Errorf("first init container %q, want the pod's own", got)
	}
	if env := pod.Spec.Containers[0].Env; env[0] != (corev1.EnvVar{Name: "MODE", Value: "sharded"}) {
		t.Errorf("manager env %+v: its own variable is gone", env)
	}
}

// TestInjectsWebhookRouter checks that the proxy of a route with a webhook
// serves the webhook router with the operator's certificate volume, and
// that a pod without that volume gets a proxy without router, saying why.
func TestInjectsWebhookRouter(t *testing.T) {
	ctx := testContext(t)
	ns := createNamespace(t, ctx, "webhook")
	createRoute(t, ctx, route(ns, "demo", &ctrlmeshv1alpha1.WebhookConfig{CertDir: certDir, Port: 9443}))

	pod := createPod(t, ctx, withCertVolume(operatorPod(ns)))
	proxy := checkInjected(t, pod, "demo", "--webhook-listen-address=:15443", "--webhook-cert-dir="+certDir)
	if n := countMounts(proxy.VolumeMounts, corev1.VolumeMount{Name: "cert", MountPath: certDir, ReadOnly: true}); n != 1 {
		t.Errorf("proxy mounts %+v: want the certificate volume read-only at %s", proxy.VolumeMounts, certDir)
	}
	if !slices.ContainsFunc(proxy.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == ctrlmeshv1alpha1.ProxyWebhookRouterPort }) {
		t.Errorf("proxy ports %+v: the webhook router's port is not declared", proxy.Ports)
	}

	bare := createPod(t, ctx, operatorPod(ns))
	proxy = checkInjected(t, bare, "demo")
	if reason := bare.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation]; !strings.Contains(reason, "without the webhook router") || !strings.Contains(reason, certDir) {
		t.Errorf("reason %q does not say why the webhook router is missing", reason)
	}
	if len(proxy.VolumeMounts) != 2 { // the kubeconfig and the state, no certificate
		t.Errorf("proxy without router mounts %+v", proxy.VolumeMounts)
	}
}

// TestLeavesUnlabeledPodAlone creates a pod a ShardRoute selects but that
// does not ask for the proxy.
func TestLeavesUnlabeledPodAlone(t *testing.T) {
	ctx := testContext(t)
	ns := createNamespace(t, ctx, "unlabeled")
	createRoute(t, ctx, route(ns, "demo", nil))
	want := operatorPod(ns)
	delete(want.Labels, ctrlmeshv1alpha1.EnableProxyLabel)
	pod := createPod(t, ctx, want.DeepCopy())
	if len(pod.Annotations) != 0 || len(pod.Spec.InitContainers) != 1 || len(pod.Spec.Volumes) != 0 {
		t.Errorf("unlabeled pod changed: annotations %v, init containers %d, volumes %+v", pod.Annotations, len(pod.Spec.InitContainers), pod.Spec.Volumes)
	}
	for i, c := range pod.Spec.Containers {
		if !equality.Semantic.DeepEqual(c.Env, want.Spec.Containers[i].Env) || len(c.VolumeMounts) != 0 {
			t.Errorf("container %s changed: env %+v, mounts %+v", c.Name, c.Env, c.VolumeMounts)
		}
	}
}

// TestLeavesSystemNamespacesAlone creates a pod asking for the proxy in
// kube-system, which the webhook's namespace selector excludes.
func TestLeavesSystemNamespacesAlone(t *testing.T) {
	ctx := testContext(t)
	pod := createPod(t, ctx, operatorPod(metav1.NamespaceSystem))
	if len(pod.Annotations) != 0 || len(pod.Spec.InitContainers) != 1 {
		t.Errorf("pod in kube-system changed: annotations %v, init containers %d", pod.Annotations, len(pod.Spec.InitContainers))
	}
}

// TestSkipsConflictingPods creates pods the proxy cannot be added to: they
// are admitted without it, their annotation saying why.
func TestSkipsConflictingPods(t *testing.T) {
	ctx := testContext(t)
	ns := createNamespace(t, ctx, "conflicts")
	createRoute(t, ctx, route(ns, "demo", nil))
	second := route(ns, "second", nil)
	second.Spec.Selector.MatchLabels = map[string]string{"second": "true"}
	createRoute(t, ctx, second)
	for name, tc := range map[string]struct {
		change func(*corev1.Pod)
		reason string
	}{
		"own KUBECONFIG": {func(p *corev1.Pod) {
			p.Spec.Containers[1].Env = []corev1.EnvVar{{Name: "KUBECONFIG", Value: "/etc/hub"}}
		}, `container "sidekick" sets KUBECONFIG`},
		"proxy port": {func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: ctrlmeshv1alpha1.ProxyHealthPort}}
		}, "port 15081"},
		"second route": {func(p *corev1.Pod) { p.Labels["second"] = "true" }, "demo, second"},
	} {
		t.Run(name, func(t *testing.T) {
			want := operatorPod(ns)
			tc.change(want)
			pod := createPod(t, ctx, want)
			if got := pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation]; got != ctrlmeshv1alpha1.ProxyInjectionSkipped {
				t.Errorf("annotation %s=%q, want %q", ctrlmeshv1alpha1.ProxyInjectionAnnotation, got, ctrlmeshv1alpha1.ProxyInjectionSkipped)
			}
			if reason := pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation]; !strings.Contains(reason, tc.reason) {
				t.Errorf("reason %q, want it to name %q", reason, tc.reason)
			}
			if len(pod.Spec.InitContainers) != 1 || len(pod.Spec.Volumes) != 0 {
				t.Errorf("skipped pod changed: init containers %d, volumes %+v", len(pod.Spec.InitContainers), pod.Spec.Volumes)
			}
		})
	}
}

// TestSkipsUnselectedPodWithEvent creates a pod that asks for the proxy but
// that no ShardRoute selects: it is admitted unchanged but for the skipped
// annotation, and gets one Warning Event, however often it changes.
func TestSkipsUnselectedPodWithEvent(t *testing.T) {
	ctx := testContext(t)
	ns := createNamespace(t, ctx, "unselected")
	other := route(ns, "other", nil)
	other.Spec.Selector.MatchLabels[operatorLabel] = "other-operator"
	createRoute(t, ctx, other)

	want := operatorPod(ns)
	pod := createPod(t, ctx, want.DeepCopy())
	if got := pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation]; got != ctrlmeshv1alpha1.ProxyInjectionSkipped {
		t.Fatalf("annotation %s=%q, want %q", ctrlmeshv1alpha1.ProxyInjectionAnnotation, got, ctrlmeshv1alpha1.ProxyInjectionSkipped)
	}
	reason := pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation]
	if !strings.Contains(reason, "no ShardRoute") {
		t.Errorf("reason %q does not say that no ShardRoute selects the pod", reason)
	}
	if len(pod.Spec.InitContainers) != 1 || len(pod.Spec.Volumes) != 0 || !equality.Semantic.DeepEqual(pod.Spec.Containers[0].Env, want.Spec.Containers[0].Env) {
		t.Errorf("skipped pod changed: init containers %d, volumes %+v, manager env %+v", len(pod.Spec.InitContainers), pod.Spec.Volumes, pod.Spec.Containers[0].Env)
	}

	events := waitForEvents(t, ctx, pod)
	if e := events[0]; e.Type != corev1.EventTypeWarning || e.Reason != ctrlmeshv1alpha1.ReasonProxyNotInjected || !strings.Contains(e.Message, reason) {
		t.Errorf("event %s %s %q, want a Warning %s with the reason %q", e.Type, e.Reason, e.Message, ctrlmeshv1alpha1.ReasonProxyNotInjected, reason)
	}

	// A change of the pod is reconciled again, without a second Event.
	pod.Labels["touched"] = "true"
	if _, err := cs.CoreV1().Pods(ns).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Long enough for the reconcile of the update, and for the recorder,
	// which writes asynchronously, to write what it would.
	time.Sleep(2 * time.Second)
	events = waitForEvents(t, ctx, pod)
	if len(events) != 1 || events[0].Count > 1 {
		t.Errorf("%d events, first counted %d: want exactly one Event per pod", len(events), events[0].Count)
	}
}

// waitForEvents returns the pod's Events once there are any.
func waitForEvents(t *testing.T, ctx context.Context, pod *corev1.Pod) []corev1.Event {
	t.Helper()
	sel := fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)).String()
	for {
		list, err := cs.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) > 0 {
			return list.Items
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no Event on pod %s/%s", pod.Namespace, pod.Name)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestSameSpecTwiceHasOneProxy creates a pod from the spec of an injected
// pod, as copying a running pod's manifest does, and checks that it gets no
// second proxy, volume or KUBECONFIG.
func TestSameSpecTwiceHasOneProxy(t *testing.T) {
	ctx := testContext(t)
	ns := createNamespace(t, ctx, "twice")
	createRoute(t, ctx, route(ns, "demo", &ctrlmeshv1alpha1.WebhookConfig{CertDir: certDir, Port: 9443}))
	first := createPod(t, ctx, withCertVolume(operatorPod(ns)))
	checkInjected(t, first, "demo", "--webhook-listen-address=:15443", "--webhook-cert-dir="+certDir)

	again := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: first.GenerateName, Namespace: ns, Labels: first.Labels, Annotations: first.Annotations},
		Spec:       *first.Spec.DeepCopy(),
	}
	second := createPod(t, ctx, again)
	checkInjected(t, second, "demo", "--webhook-listen-address=:15443", "--webhook-cert-dir="+certDir)
	if !equality.Semantic.DeepEqual(first.Spec, second.Spec) {
		t.Errorf("the second pod's spec differs from the first's:\nfirst  %+v\nsecond %+v", first.Spec, second.Spec)
	}
}

// TestNewHandlerRefusesBadOptions checks that NewHandler refuses options
// that would make every injected pod invalid.
func TestNewHandlerRefusesBadOptions(t *testing.T) {
	for name, opts := range map[string]inject.Options{
		"no image":                   {},
		"memory limit below request": {Image: proxyImage, MemoryLimit: resource.MustParse("32Mi")},
	} {
		if _, err := inject.NewHandler(agentCache, opts, logr.Discard()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
