package inject

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// interceptionPod is an opted-in pod as the API server hands it to the
// webhook: its own init container, and the ServiceAccount admission
// plugin's token volume mounted in every container.
func interceptionPod() *corev1.Pod {
	sa := corev1.VolumeMount{Name: "kube-api-access-abcde", MountPath: ServiceAccountMountPath, ReadOnly: true}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "op-1", Labels: map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true", "app": "op"}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "setup", Image: "op", VolumeMounts: []corev1.VolumeMount{sa}}},
			Containers: []corev1.Container{
				{Name: "manager", Image: "op", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, sa}},
				{Name: "helper", Image: "op", VolumeMounts: []corev1.VolumeMount{sa}},
			},
			Volumes: []corev1.Volume{{Name: "kube-api-access-abcde"}, {Name: "data"}},
		},
	}
}

func interceptionRoute(mode ctrlmeshv1alpha1.Interception) []ctrlmeshv1alpha1.ShardRoute {
	r := fuzzRoute("op", false)
	r.Spec.Interception = mode
	return []ctrlmeshv1alpha1.ShardRoute{r}
}

func envValue(c corev1.Container, name string) []string {
	var values []string
	for _, e := range c.Env {
		if e.Name == name {
			values = append(values, e.Value)
		}
	}
	return values
}

func argsWith(c corev1.Container, flag string) []string {
	var values []string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			values = append(values, v)
		}
	}
	return values
}

// TestInterceptionMutation: the pod each interception makes of the same
// opted-in pod.
func TestInterceptionMutation(t *testing.T) {
	opts, err := Options{Image: "proxy:1"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	saMount := corev1.VolumeMount{Name: ServiceAccountVolume, MountPath: ServiceAccountMountPath, ReadOnly: true}
	for _, tt := range []struct {
		mode ctrlmeshv1alpha1.Interception
		// initContainers: names in order.
		initContainers []string
		volumes        []string
		// operator containers' KUBECONFIG, KUBERNETES_SERVICE_HOST, _PORT.
		kubeconfig, host, port []string
		servingNames           []string
		proxyUser              *int64
	}{
		{
			mode: "", initContainers: []string{"setup", ctrlmeshv1alpha1.ProxyContainerName},
			volumes: []string{"kube-api-access-abcde", "data", KubeconfigVolume, StateVolume}, kubeconfig: []string{KubeconfigPath},
		},
		{
			mode: ctrlmeshv1alpha1.InterceptKubeconfig, initContainers: []string{"setup", ctrlmeshv1alpha1.ProxyContainerName},
			volumes: []string{"kube-api-access-abcde", "data", KubeconfigVolume, StateVolume}, kubeconfig: []string{KubeconfigPath},
		},
		{
			mode: ctrlmeshv1alpha1.InterceptEnvironment, initContainers: []string{"setup", ctrlmeshv1alpha1.ProxyContainerName},
			volumes: []string{"kube-api-access-abcde", "data", ServiceAccountVolume, StateVolume},
			host:    []string{"127.0.0.1"}, port: []string{"15080"}, servingNames: []string{"127.0.0.1,localhost"},
		},
		{
			mode: ctrlmeshv1alpha1.InterceptIptables, initContainers: []string{"setup", ctrlmeshv1alpha1.RedirectContainerName, ctrlmeshv1alpha1.ProxyContainerName},
			volumes:      []string{"kube-api-access-abcde", "data", ServiceAccountVolume, StateVolume},
			servingNames: []string{"$(KUBERNETES_SERVICE_HOST),kubernetes,kubernetes.default,kubernetes.default.svc,kubernetes.default.svc.cluster.local,10.245.0.1"},
			proxyUser:    ptr.To[int64](ctrlmeshv1alpha1.ProxyUserID),
		},
	} {
		t.Run(string(tt.mode), func(t *testing.T) {
			pod := interceptionPod()
			opts := opts
			// What the Handler read for this admission.
			opts.apiServerEndpoints = []string{"10.245.0.1:6443"}
			mutate(pod, "ns", interceptionRoute(tt.mode), opts)
			if got := pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation]; got != ctrlmeshv1alpha1.ProxyInjected {
				t.Fatalf("not injected: %s", pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation])
			}
			var inits, volumes []string
			for _, c := range pod.Spec.InitContainers {
				inits = append(inits, c.Name)
			}
			for _, v := range pod.Spec.Volumes {
				volumes = append(volumes, v.Name)
				if (v.Name == ServiceAccountVolume || v.Name == StateVolume) && (v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory) {
					t.Errorf("volume %s: %+v, want an emptyDir in memory", v.Name, v.VolumeSource)
				}
			}
			if !slices.Equal(inits, tt.initContainers) || !slices.Equal(volumes, tt.volumes) {
				t.Errorf("init containers %v, volumes %v; want %v, %v", inits, volumes, tt.initContainers, tt.volumes)
			}
			proxy := pod.Spec.InitContainers[len(pod.Spec.InitContainers)-1]
			inCluster := tt.mode == ctrlmeshv1alpha1.InterceptEnvironment || tt.mode == ctrlmeshv1alpha1.InterceptIptables
			for _, c := range pod.Spec.Containers {
				if got := envValue(c, "KUBECONFIG"); !slices.Equal(got, tt.kubeconfig) {
					t.Errorf("%s: KUBECONFIG %v, want %v", c.Name, got, tt.kubeconfig)
				}
				if got := envValue(c, "KUBERNETES_SERVICE_HOST"); !slices.Equal(got, tt.host) {
					t.Errorf("%s: KUBERNETES_SERVICE_HOST %v, want %v", c.Name, got, tt.host)
				}
				if got := envValue(c, "KUBERNETES_SERVICE_PORT"); !slices.Equal(got, tt.port) {
					t.Errorf("%s: KUBERNETES_SERVICE_PORT %v, want %v", c.Name, got, tt.port)
				}
				// Every mode: the forward proxy, the API path excluded.
				for name, want := range map[string]string{"HTTP_PROXY": "http://127.0.0.1:15082", "HTTPS_PROXY": "http://127.0.0.1:15082",
					"NO_PROXY": "127.0.0.1,localhost,::1,$(KUBERNETES_SERVICE_HOST),kubernetes,kubernetes.default,kubernetes.default.svc,kubernetes.default.svc.cluster.local,10.245.0.1"} {
					for _, n := range []string{name, strings.ToLower(name)} {
						if got := envValue(c, n); !slices.Equal(got, []string{want}) {
							t.Errorf("%s: %s %v, want %s", c.Name, n, got, want)
						}
					}
				}
				// In-cluster: the proxy's directory replaces the token
				// volume; otherwise the token stays.
				var sa []corev1.VolumeMount
				for _, m := range c.VolumeMounts {
					if m.MountPath == ServiceAccountMountPath {
						sa = append(sa, m)
					}
				}
				want := []corev1.VolumeMount{{Name: "kube-api-access-abcde", MountPath: ServiceAccountMountPath, ReadOnly: true}}
				if inCluster {
					want = []corev1.VolumeMount{saMount}
				}
				if !slices.Equal(sa, want) {
					t.Errorf("%s: service-account mounts %+v, want %+v", c.Name, sa, want)
				}
			}
			// The pod's own init container keeps the real token, and runs
			// before the forward proxy.
			if got := envValue(pod.Spec.InitContainers[0], "HTTP_PROXY"); got != nil {
				t.Errorf("the pod's init container got HTTP_PROXY %v", got)
			}
			if got := pod.Spec.InitContainers[0].VolumeMounts; len(got) != 1 || got[0].Name != "kube-api-access-abcde" {
				t.Errorf("the pod's init container's mounts %+v changed", got)
			}
			if got := argsWith(proxy, ctrlmeshv1alpha1.ProxyFlagServingNames); !slices.Equal(got, tt.servingNames) {
				t.Errorf("serving names %v, want %v", got, tt.servingNames)
			}
			if inCluster {
				if got := argsWith(proxy, ctrlmeshv1alpha1.ProxyFlagOperatorKubeconfig); got != nil {
					t.Errorf("operator kubeconfig %v under %s", got, tt.mode)
				}
				if !slices.Equal(argsWith(proxy, ctrlmeshv1alpha1.ProxyFlagOperatorServiceAccountDir), []string{ServiceAccountDir}) {
					t.Errorf("proxy args %v", proxy.Args)
				}
				want := []corev1.VolumeMount{{Name: ServiceAccountVolume, MountPath: ServiceAccountDir}, {Name: StateVolume, MountPath: StateDir}}
				if !slices.Equal(proxy.VolumeMounts, want) {
					t.Errorf("proxy mounts %+v, want %+v (the state in the proxy only)", proxy.VolumeMounts, want)
				}
			} else {
				if got := argsWith(proxy, ctrlmeshv1alpha1.ProxyFlagOperatorKubeconfig); !slices.Equal(got, []string{KubeconfigPath}) {
					t.Errorf("operator kubeconfig %v", got)
				}
				want := []corev1.VolumeMount{{Name: KubeconfigVolume, MountPath: KubeconfigDir}, {Name: StateVolume, MountPath: StateDir}}
				if !slices.Equal(proxy.VolumeMounts, want) {
					t.Errorf("proxy mounts %+v, want %+v (the state in the proxy only)", proxy.VolumeMounts, want)
				}
			}
			// Every mode: the state directory, in the proxy only, which
			// keeps the client token and the operator's streams across the
			// proxy's restarts.
			if !slices.Equal(argsWith(proxy, ctrlmeshv1alpha1.ProxyFlagStateDir), []string{StateDir}) {
				t.Errorf("proxy state directory %v, want %s", argsWith(proxy, ctrlmeshv1alpha1.ProxyFlagStateDir), StateDir)
			}
			for _, c := range pod.Spec.Containers {
				for _, m := range c.VolumeMounts {
					if m.Name == StateVolume {
						t.Errorf("%s mounts the proxy's state", c.Name)
					}
				}
			}
			if !equalPtr(proxy.SecurityContext.RunAsUser, tt.proxyUser) || !equalPtr(proxy.SecurityContext.RunAsGroup, tt.proxyUser) {
				t.Errorf("proxy user %v/%v, want %v", proxy.SecurityContext.RunAsUser, proxy.SecurityContext.RunAsGroup, tt.proxyUser)
			}
			checkProxyUnprivileged(t, proxy)
			if tt.mode == ctrlmeshv1alpha1.InterceptIptables {
				checkRedirect(t, pod.Spec.InitContainers[1])
			}
		})
	}
}

// TestProxyEnvironment: the proxy variables a container sets itself, in
// either case, stay as they are, and the injector sets neither case of
// them; the others point at the forward proxy, with the API path excluded.
func TestProxyEnvironment(t *testing.T) {
	const noProxy = "127.0.0.1,localhost,::1,$(KUBERNETES_SERVICE_HOST),kubernetes,kubernetes.default,kubernetes.default.svc,kubernetes.default.svc.cluster.local,10.245.0.1"
	for _, tt := range []struct {
		name string
		own  []corev1.EnvVar
		want []corev1.EnvVar
	}{
		{"none", nil, []corev1.EnvVar{{Name: "HTTP_PROXY", Value: ForwardProxyURL}, {Name: "http_proxy", Value: ForwardProxyURL},
			{Name: "HTTPS_PROXY", Value: ForwardProxyURL}, {Name: "https_proxy", Value: ForwardProxyURL},
			{Name: "NO_PROXY", Value: noProxy}, {Name: "no_proxy", Value: noProxy}}},
		{"own http_proxy", []corev1.EnvVar{{Name: "http_proxy", Value: "http://corp:3128"}}, []corev1.EnvVar{{Name: "http_proxy", Value: "http://corp:3128"},
			{Name: "HTTPS_PROXY", Value: ForwardProxyURL}, {Name: "https_proxy", Value: ForwardProxyURL},
			{Name: "NO_PROXY", Value: noProxy}, {Name: "no_proxy", Value: noProxy}}},
		{"own HTTPS_PROXY from a secret", []corev1.EnvVar{{Name: "HTTPS_PROXY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "p"}}}},
			[]corev1.EnvVar{{Name: "HTTPS_PROXY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "p"}}},
				{Name: "HTTP_PROXY", Value: ForwardProxyURL}, {Name: "http_proxy", Value: ForwardProxyURL},
				{Name: "NO_PROXY", Value: noProxy}, {Name: "no_proxy", Value: noProxy}}},
		{"own NO_PROXY", []corev1.EnvVar{{Name: "NO_PROXY", Value: ".corp"}}, []corev1.EnvVar{{Name: "NO_PROXY", Value: ".corp"},
			{Name: "HTTP_PROXY", Value: ForwardProxyURL}, {Name: "http_proxy", Value: ForwardProxyURL},
			{Name: "HTTPS_PROXY", Value: ForwardProxyURL}, {Name: "https_proxy", Value: ForwardProxyURL}}},
		{"all own", []corev1.EnvVar{{Name: "HTTP_PROXY", Value: "a"}, {Name: "https_proxy", Value: "b"}, {Name: "no_proxy", Value: "c"}},
			[]corev1.EnvVar{{Name: "HTTP_PROXY", Value: "a"}, {Name: "https_proxy", Value: "b"}, {Name: "no_proxy", Value: "c"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := Options{Image: "proxy:1"}.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			opts.apiServerEndpoints = []string{"10.245.0.1:6443"}
			pod := interceptionPod()
			pod.Spec.Containers[0].Env = tt.own
			mutate(pod, "ns", interceptionRoute(ctrlmeshv1alpha1.InterceptKubeconfig), opts)
			var got []corev1.EnvVar
			for _, e := range pod.Spec.Containers[0].Env {
				if e.Name != "KUBECONFIG" {
					got = append(got, e)
				}
			}
			if !equality.Semantic.DeepEqual(got, tt.want) {
				t.Errorf("environment %+v, want %+v", got, tt.want)
			}
		})
	}
}

func equalPtr(a, b *int64) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

func checkProxyUnprivileged(t *testing.T, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if !ptr.Deref(sc.RunAsNonRoot, false) || ptr.Deref(sc.Privileged, true) || ptr.Deref(sc.AllowPrivilegeEscalation, true) ||
		len(sc.Capabilities.Add) != 0 || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("proxy security context %+v, want non-root without capabilities", sc)
	}
}

// checkRedirect: the redirect container has NET_ADMIN and nothing else.
func checkRedirect(t *testing.T, c corev1.Container) {
	t.Helper()
	want := []string{"redirect", "--destination=$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)", "--destination=10.245.0.1:6443", "--to-port=15080", "--exclude-uid=15080"}
	if c.Image != "proxy:1" || !slices.Equal(c.Args, want) || c.RestartPolicy != nil {
		t.Errorf("redirect container %s %v (restart %v), want proxy:1 %v, run to completion", c.Image, c.Args, c.RestartPolicy, want)
	}
	sc := c.SecurityContext
	if !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		ptr.Deref(sc.Privileged, true) || ptr.Deref(sc.AllowPrivilegeEscalation, true) || !ptr.Deref(sc.ReadOnlyRootFilesystem, false) {
		t.Errorf("redirect security context %+v, want NET_ADMIN only, unprivileged, read-only", sc)
	}
	if len(c.VolumeMounts) != 0 {
		t.Errorf("redirect mounts %+v", c.VolumeMounts)
	}
}

// TestInterceptionConflicts: pods an interception cannot serve are left
// unchanged but for the skipped annotation, which says why.
func TestInterceptionConflicts(t *testing.T) {
	opts, err := Options{Image: "proxy:1"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		mode   ctrlmeshv1alpha1.Interception
		edit   func(*corev1.Pod)
		reason string
	}{
		{"unknown mode", "Ebpf", func(*corev1.Pod) {}, `interception "Ebpf", which this agent does not know`},
		{"forward proxy port", ctrlmeshv1alpha1.InterceptKubeconfig, func(p *corev1.Pod) {
			p.Spec.Containers[1].Ports = []corev1.ContainerPort{{ContainerPort: ctrlmeshv1alpha1.ProxyForwardPort}}
		}, `container "helper" declares port 15082, which the proxy listens on`},
		{"own service host", ctrlmeshv1alpha1.InterceptEnvironment, func(p *corev1.Pod) {
			p.Spec.Containers[1].Env = []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: "10.0.0.1"}}
		}, `container "helper" sets KUBERNETES_SERVICE_HOST itself`},
		{"own service port", ctrlmeshv1alpha1.InterceptEnvironment, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_PORT", Value: "6443"}}
		}, `container "manager" sets KUBERNETES_SERVICE_PORT itself`},
		{"own kubeconfig, environment", ctrlmeshv1alpha1.InterceptEnvironment, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "KUBECONFIG", Value: "/k"}}
		}, `container "manager" sets KUBECONFIG, so it may reach the API server around the proxy of interception Environment`},
		{"own kubeconfig, iptables", ctrlmeshv1alpha1.InterceptIptables, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "KUBECONFIG", Value: "/k"}}
		}, `container "manager" sets KUBECONFIG, so it may reach the API server around the proxy of interception Iptables`},
		{"own credentials at the service-account path", ctrlmeshv1alpha1.InterceptIptables, func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts[1] = corev1.VolumeMount{Name: "my-token", MountPath: ServiceAccountMountPath + "/"}
		}, `container "manager" mounts volume "my-token" at /var/run/secrets/kubernetes.io/serviceaccount`},
		{"pod runs as the proxy's user", ctrlmeshv1alpha1.InterceptIptables, func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](ctrlmeshv1alpha1.ProxyUserID)}
		}, `container "manager" runs as user 15080, the proxy's`},
		{"container runs as the proxy's user", ctrlmeshv1alpha1.InterceptIptables, func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000)}
			p.Spec.Containers[1].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](ctrlmeshv1alpha1.ProxyUserID)}
		}, `container "helper" runs as user 15080`},
		{"state volume taken", ctrlmeshv1alpha1.InterceptEnvironment, func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: StateVolume})
		}, `already has a volume named "ctrlmesh-proxy-state"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := interceptionPod()
			tt.edit(pod)
			before := pod.DeepCopy()
			mutate(pod, "ns", interceptionRoute(tt.mode), opts)
			reason := pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation]
			if pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation] != ctrlmeshv1alpha1.ProxyInjectionSkipped || !strings.Contains(reason, tt.reason) {
				t.Fatalf("annotations %v, want skipped because %q", pod.Annotations, tt.reason)
			}
			pod.Annotations = nil
			if !slices.EqualFunc(pod.Spec.Containers, before.Spec.Containers, func(a, b corev1.Container) bool {
				return a.Name == b.Name && len(a.Env) == len(b.Env) && len(a.VolumeMounts) == len(b.VolumeMounts)
			}) ||
				len(pod.Spec.InitContainers) != len(before.Spec.InitContainers) || len(pod.Spec.Volumes) != len(before.Spec.Volumes) {
				t.Errorf("the skipped pod changed: %+v", pod.Spec)
			}
		})
	}
	// The same pods under another interception are injected: the
	// conflicts are the interception's own.
	pod := interceptionPod()
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](ctrlmeshv1alpha1.ProxyUserID)}
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: "10.0.0.1"}}
	mutate(pod, "ns", interceptionRoute(""), opts)
	if got := pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation]; got != ctrlmeshv1alpha1.ProxyInjected {
		t.Errorf("Kubeconfig interception: %s (%s)", got, pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation])
	}
}

// TestAPIServerEndpoints: the ready IPv4 endpoints of default/kubernetes,
// each address with each TCP port, sorted; an IPv6 slice gives none (the
// Service's address is redirected all the same); no slice, or no reader,
// is an error, on which the Handler refuses the pod.
func TestAPIServerEndpoints(t *testing.T) {
	slice := func(name string, addressType discoveryv1.AddressType, endpoints ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name},
			AddressType: addressType, Endpoints: endpoints,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](6443), Protocol: ptr.To(corev1.ProtocolTCP)}},
		}
	}
	ready := func(ok *bool, addrs ...string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ok}}
	}
	for _, tt := range []struct {
		name    string
		objects []client.Object
		want    []string
		err     string
	}{
		{"two servers, one not ready", []client.Object{slice("kubernetes", discoveryv1.AddressTypeIPv4,
			ready(nil, "10.0.0.2", "10.0.0.1"), ready(ptr.To(true), "10.0.0.1"), ready(ptr.To(false), "10.0.0.3"))},
			[]string{"10.0.0.1:6443", "10.0.0.2:6443"}, ""},
		{"IPv6", []client.Object{slice("kubernetes", discoveryv1.AddressTypeIPv6, ready(nil, "fd00::1"))}, nil, ""},
		{"no slice", []client.Object{slice("other", discoveryv1.AddressTypeIPv4, ready(nil, "10.0.0.9"))}, nil, "reading the EndpointSlice default/kubernetes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reader := fake.NewClientBuilder().WithObjects(tt.objects...).Build()
			got, err := apiServerEndpoints(context.Background(), reader)
			if (tt.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.err)) || !slices.Equal(got, tt.want) {
				t.Errorf("%v, %v; want %v, %q", got, err, tt.want, tt.err)
			}
		})
	}
	if _, err := apiServerEndpoints(context.Background(), nil); err == nil {
		t.Error("no reader: no error")
	}
}
