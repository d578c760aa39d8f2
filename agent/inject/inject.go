// Package inject is the agent's proxy injection: a mutating admission webhook
// that adds the ctrlmesh proxy, as a native sidecar, to every pod labeled
// ctrlmesh.io/enable-proxy=true that a ShardRoute of its namespace selects,
// and points the pod's containers at it: through a kubeconfig the proxy
// writes, or, by the ShardRoute's interception, through the in-cluster
// environment or a netfilter redirection of the API server's addresses.
// Pods that ask for the proxy but cannot get it are admitted
// unchanged but for an annotation saying why, and EventReconciler turns that
// annotation into a Warning Event.
package inject

import (
	"errors"
	"fmt"
	"net"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// What the injected container shares with the pod. The container's name,
// ports and flags are ctrlmeshv1alpha1's Proxy* names, which ctrlmesh-proxy
// declares its flags with.
const (
	// KubeconfigVolume is the emptyDir through which the proxy hands the
	// operator containers their kubeconfig.
	KubeconfigVolume = "ctrlmesh-proxy-kubeconfig"
	// KubeconfigDir is where KubeconfigVolume is mounted in every container.
	KubeconfigDir = "/var/run/ctrlmesh"
	// KubeconfigPath is the kubeconfig the proxy writes, pointing at
	// ctrlmeshv1alpha1.ProxyListenPort; $KUBECONFIG of the operator
	// containers names it.
	KubeconfigPath = KubeconfigDir + "/kubeconfig"

	// ServiceAccountVolume is the emptyDir, in memory, through which the
	// proxy of an in-cluster interception (Environment, Iptables) hands the
	// operator containers its CA bundle, client token and namespace; the
	// proxy mounts it at ServiceAccountDir, the operator containers at
	// ServiceAccountMountPath instead of the pod's service-account token.
	ServiceAccountVolume = "ctrlmesh-proxy-serviceaccount"
	ServiceAccountDir    = "/var/run/ctrlmesh/serviceaccount"
	// ServiceAccountMountPath is where rest.InClusterConfig reads token,
	// ca.crt and namespace.
	ServiceAccountMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// StateVolume is the emptyDir, in memory and mounted in the proxy only
	// (at StateDir), where the proxy keeps across its own restarts the
	// client token, its CA's key (under interception) and the operator's
	// watched streams (--state-dir).
	StateVolume = "ctrlmesh-proxy-state"
	StateDir    = "/var/run/ctrlmesh/state"
)

// What the operator containers dial under Environment interception, which
// the proxy's serving certificate names.
var environmentServingNames = []string{"127.0.0.1", "localhost"}

// What the operator containers dial under Iptables interception: the
// kubernetes Service's ClusterIP (as the kubelet sets it, expanded by the
// kubelet in the proxy's arguments) and its DNS names, which the proxy's
// serving certificate names.
var iptablesServingNames = []string{"$(KUBERNETES_SERVICE_HOST)", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}

// Defaults of Options.
var (
	DefaultCPURequest    = resource.MustParse("50m")
	DefaultMemoryRequest = resource.MustParse("64Mi")
	// DefaultMemoryLimit leaves headroom over the request for bursts, such
	// as every informer relisting at once after a rules change.
	DefaultMemoryLimit = resource.MustParse("256Mi")
)

// Startup allowance of the proxy: the operator containers start only once
// it has loaded its rules, which needs the ShardRoute and a discovery of the
// API server; 5 minutes covers an API server under load.
const (
	startupProbePeriodSeconds    = 2
	startupProbeFailureThreshold = 150
)

// Options of the injected proxy.
type Options struct {
	// Image of the proxy, such as "ghcr.io/ctrlmesh/ctrlmesh-proxy:v0.1.0".
	Image string
	// APIServer reads the kubernetes Service's EndpointSlice
	// (default/kubernetes) at admission, for Iptables interception, which
	// redirects the API server's endpoints too: the agent's uncached API
	// reader (a get of that one object; the cache would watch every
	// EndpointSlice). Without it, pods under Iptables interception are
	// refused.
	APIServer client.Reader
	// apiServerEndpoints are the API server's endpoints ("ip:port") the
	// Handler read for one admission.
	apiServerEndpoints []string
	// CPURequest, MemoryRequest and MemoryLimit of the proxy container; zero
	// values take DefaultCPURequest, DefaultMemoryRequest and
	// DefaultMemoryLimit. No CPU limit: throttling the proxy would slow
	// every API request of the operator.
	CPURequest, MemoryRequest, MemoryLimit resource.Quantity
}

// withDefaults fills the zero resources in and checks the result.
func (o Options) withDefaults() (Options, error) {
	if o.Image == "" {
		return o, errors.New("inject: the proxy image is required")
	}
	for _, q := range []struct {
		value *resource.Quantity
		def   resource.Quantity
	}{{&o.CPURequest, DefaultCPURequest}, {&o.MemoryRequest, DefaultMemoryRequest}, {&o.MemoryLimit, DefaultMemoryLimit}} {
		if q.value.IsZero() {
			*q.value = q.def
		}
	}
	if o.MemoryLimit.Cmp(o.MemoryRequest) < 0 {
		return o, fmt.Errorf("inject: the proxy's memory limit %s is below its request %s", o.MemoryLimit.String(), o.MemoryRequest.String())
	}
	return o, nil
}

// mutate injects the proxy into pod, created in namespace, for the one of
// routes that selects it, and annotates the outcome. It leaves alone pods
// that do not ask for the proxy or already have one. opts has its defaults.
func mutate(pod *corev1.Pod, namespace string, routes []ctrlmeshv1alpha1.ShardRoute, opts Options) {
	if !MissesProxy(pod) {
		return
	}
	route, reason := injectionFor(pod, namespace, routes)
	if route == nil {
		annotate(pod, ctrlmeshv1alpha1.ProxyInjectionSkipped, reason)
		return
	}
	certMount, noRouter := webhookCertMount(pod, route)
	mode := interceptionOf(route)
	// The proxy needs the pod's service-account token, which is not mounted
	// here: kube-apiserver runs its ServiceAccount admission plugin again
	// after a webhook changed the pod, and that mounts the token into every
	// container lacking it, the proxy included (and the redirect container).
	proxy := proxyContainer(route.Name, mode, certMount, opts)
	// Appended after the pod's own init containers, which may prepare what
	// the proxy reads (such as the webhook certificate), and before the
	// operator containers, which start once the proxy's startup probe passes.
	if mode == ctrlmeshv1alpha1.InterceptIptables {
		// Before the proxy: the kubelet runs it to completion first, and
		// starts nothing after it if it fails.
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, redirectContainer(opts, opts.apiServerEndpoints))
	}
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, proxy)
	emptyDir := func(name string, medium corev1.StorageMedium) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: medium, SizeLimit: ptr.To(resource.MustParse("1Mi"))}}}
	}
	if mode == ctrlmeshv1alpha1.InterceptKubeconfig {
		pod.Spec.Volumes = append(pod.Spec.Volumes, emptyDir(KubeconfigVolume, corev1.StorageMediumDefault))
	} else {
		pod.Spec.Volumes = append(pod.Spec.Volumes, emptyDir(ServiceAccountVolume, corev1.StorageMediumMemory))
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, emptyDir(StateVolume, corev1.StorageMediumMemory))
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		switch mode {
		case ctrlmeshv1alpha1.InterceptKubeconfig:
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: KubeconfigVolume, MountPath: KubeconfigDir, ReadOnly: true})
			// client-go and controller-runtime read $KUBECONFIG before the
			// in-cluster configuration, so the operator talks to the proxy.
			c.Env = append(c.Env, corev1.EnvVar{Name: "KUBECONFIG", Value: KubeconfigPath})
		default:
			// The proxy's CA bundle, client token and namespace where
			// rest.InClusterConfig reads them, instead of the pod's token
			// and the cluster's CA (which the proxy keeps for itself).
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
				return path.Clean(m.MountPath) == ServiceAccountMountPath
			})
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: ServiceAccountVolume, MountPath: ServiceAccountMountPath, ReadOnly: true})
		}
		if mode == ctrlmeshv1alpha1.InterceptEnvironment {
			c.Env = append(c.Env,
				corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"},
				corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: fmt.Sprint(ctrlmeshv1alpha1.ProxyListenPort)})
		}
		// After KUBERNETES_SERVICE_HOST, which NO_PROXY refers to.
		c.Env = append(c.Env, proxyEnvironment(c.Env, opts.apiServerEndpoints)...)
	}
	message := fmt.Sprintf("proxy for ShardRoute %q", route.Name)
	if mode != ctrlmeshv1alpha1.InterceptKubeconfig {
		message += fmt.Sprintf(", interception %s", mode)
	}
	if noRouter != "" {
		message += "; " + noRouter
	}
	annotate(pod, ctrlmeshv1alpha1.ProxyInjected, message)
}

// ForwardProxyURL is the proxy's forward proxy, where the operator
// containers' HTTP_PROXY and HTTPS_PROXY point.
var ForwardProxyURL = fmt.Sprintf("http://127.0.0.1:%d", ctrlmeshv1alpha1.ProxyForwardPort)

// noProxyAPIPath is what the operator containers' NO_PROXY excludes from
// the forward proxy: the API path, which goes to the proxy's API port and
// never through the forward proxy (which refuses the API server). That is
// loopback, where the proxy serves the API under Kubeconfig and
// Environment interception (Go never sends loopback to a proxy; other
// runtimes do); the kubernetes Service's address as the kubelet sets it
// (which the kubelet expands) and its DNS names, which the operator dials
// under Iptables interception. Nothing else: other hosts, in-cluster
// Services (.svc, .cluster.local) included, go through the forward proxy,
// so that the traffic policies can name any host the operator calls; the
// forward proxy resolves names with the pod's own DNS configuration. A
// name of the API server this list misses is refused by the forward
// proxy with a message naming the API port: the operator's request fails
// closed, never around the fencing.
var noProxyAPIPath = []string{"127.0.0.1", "localhost", "::1", "$(KUBERNETES_SERVICE_HOST)",
	"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}

// proxyEnvironment is the proxy environment an operator container with env
// gets: HTTP_PROXY and HTTPS_PROXY at the forward proxy, NO_PROXY
// excluding the API path (noProxyAPIPath and the API server's endpoints,
// "ip:port", read at admission), each in upper and lower case, as
// runtimes read either (curl only the lower-case http_proxy).
//
// It is on for every injected pod, not opt-in: traffic policies come and
// go on the hub while the pods run, and a container's environment is
// fixed at its creation, so the path must be there before a policy names
// a host. With no policy matching, the forward proxy only forwards.
//
// A variable the container sets itself, in either case, is the author's
// and stays; the injector then sets neither case of it. A container's own
// HTTP_PROXY or HTTPS_PROXY sends its external requests past the forward
// proxy, so the traffic policies do not see them; a container's own
// NO_PROXY is the author's to keep excluding the API path (the forward
// proxy refuses the API server if it does not). Values from envFrom are
// not seen here: the injector's env entries take precedence over them, so
// set the proxy variables in env to keep them.
func proxyEnvironment(env []corev1.EnvVar, endpoints []string) []corev1.EnvVar {
	noProxy := slices.Clone(noProxyAPIPath)
	for _, e := range endpoints {
		if host, _, err := net.SplitHostPort(e); err == nil && !slices.Contains(noProxy, host) {
			noProxy = append(noProxy, host)
		}
	}
	var out []corev1.EnvVar
	for _, v := range []struct{ name, value string }{
		{"HTTP_PROXY", ForwardProxyURL}, {"HTTPS_PROXY", ForwardProxyURL}, {"NO_PROXY", strings.Join(noProxy, ",")},
	} {
		lower := strings.ToLower(v.name)
		if slices.ContainsFunc(env, func(e corev1.EnvVar) bool { return e.Name == v.name || e.Name == lower }) {
			continue
		}
		out = append(out, corev1.EnvVar{Name: v.name, Value: v.value}, corev1.EnvVar{Name: lower, Value: v.value})
	}
	return out
}

// MissesProxy reports whether the pod asks for the proxy
// (ctrlmesh.io/enable-proxy=true) and runs without it: the pods the Handler
// injects into at creation, and the Replacer replaces when they were
// created without it.
func MissesProxy(pod *corev1.Pod) bool {
	return pod.Labels[ctrlmeshv1alpha1.EnableProxyLabel] == "true" && !hasProxy(pod)
}

// injectionFor returns the route the Handler injects a proxy for into the
// pod, created in namespace, or why it injects none: no route or several
// select the pod, or the pod's own settings rule the proxy out.
func injectionFor(pod *corev1.Pod, namespace string, routes []ctrlmeshv1alpha1.ShardRoute) (*ctrlmeshv1alpha1.ShardRoute, string) {
	route, reason := selectRoute(pod, namespace, routes)
	if route == nil {
		return nil, reason
	}
	if reason := conflict(pod, interceptionOf(route)); reason != "" {
		return nil, reason
	}
	return route, ""
}

// ProxiedRoute returns the name of the ShardRoute whose rules the pod's
// proxy enforces (its --rules-name argument), and false when the pod has no
// injected proxy.
func ProxiedRoute(pod *corev1.Pod) (string, bool) {
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if c.Name != ctrlmeshv1alpha1.ProxyContainerName {
			continue
		}
		prefix := ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagRulesName, "")
		for _, arg := range c.Args {
			if name, ok := strings.CutPrefix(arg, prefix); ok && name != "" {
				return name, true
			}
		}
	}
	return "", false
}

// hasProxy reports whether the pod already runs a container named
// ctrlmeshv1alpha1.ProxyContainerName: injected before (a spec copied from an injected pod) or
// added by hand.
func hasProxy(pod *corev1.Pod) bool {
	return slices.ContainsFunc(slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers), func(c corev1.Container) bool {
		return c.Name == ctrlmeshv1alpha1.ProxyContainerName
	})
}

// selectRoute returns the one route that selects the pod, or why there is
// none to inject for.
func selectRoute(pod *corev1.Pod, namespace string, routes []ctrlmeshv1alpha1.ShardRoute) (*ctrlmeshv1alpha1.ShardRoute, string) {
	var selecting []*ctrlmeshv1alpha1.ShardRoute
	var names []string
	for i := range routes {
		sel, err := metav1.LabelSelectorAsSelector(&routes[i].Spec.Selector)
		// A selector the API server let through but that does not parse
		// selects nothing.
		if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		selecting = append(selecting, &routes[i])
		names = append(names, routes[i].Name)
	}
	switch len(selecting) {
	case 0:
		return nil, fmt.Sprintf("no ShardRoute in namespace %q selects the pod's labels: the operator runs without a proxy and sees every object; check the ShardingConfig's selector; once a ShardRoute selects the pod, the agent evicts it for its controller to recreate it with the proxy (a pod no controller owns, recreate yourself)", namespace)
	case 1:
		return selecting[0], ""
	default:
		slices.Sort(names) // the cache lists in no particular order
		return nil, fmt.Sprintf("ShardRoutes %s all select the pod, and a proxy enforces one: narrow their ShardingConfigs' selectors so that one selects it", strings.Join(names, ", "))
	}
}

// interceptionOf is the route's interception; unset is Kubeconfig.
func interceptionOf(route *ctrlmeshv1alpha1.ShardRoute) ctrlmeshv1alpha1.Interception {
	if route.Spec.Interception == "" {
		return ctrlmeshv1alpha1.InterceptKubeconfig
	}
	return route.Spec.Interception
}

// conflict returns why the pod's own settings rule the injection with
// interception mode out, or "".
func conflict(pod *corev1.Pod, mode ctrlmeshv1alpha1.Interception) string {
	switch mode {
	case ctrlmeshv1alpha1.InterceptKubeconfig, ctrlmeshv1alpha1.InterceptEnvironment, ctrlmeshv1alpha1.InterceptIptables:
	default:
		// A newer hub's mode: injecting another one would leave the
		// operator around the proxy.
		return fmt.Sprintf("the ShardRoute asks for interception %q, which this agent does not know: upgrade the agent", mode)
	}
	if pod.Spec.HostNetwork {
		return "the pod uses the node's network, where the proxy's fixed ports would clash with other pods' proxies"
	}
	proxyPorts := []int32{ctrlmeshv1alpha1.ProxyListenPort, ctrlmeshv1alpha1.ProxyHealthPort, ctrlmeshv1alpha1.ProxyWebhookRouterPort, ctrlmeshv1alpha1.ProxyForwardPort}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, p := range c.Ports {
			if slices.Contains(proxyPorts, p.ContainerPort) {
				return fmt.Sprintf("container %q declares port %d, which the proxy listens on", c.Name, p.ContainerPort)
			}
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == KubeconfigVolume || v.Name == ServiceAccountVolume || v.Name == StateVolume {
			return fmt.Sprintf("the pod already has a volume named %q, which the proxy needs", v.Name)
		}
	}
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			switch {
			// Overriding it would point the container at another cluster
			// than the one its author chose; not overriding it would let
			// the container reach the API server around the proxy.
			case e.Name == "KUBECONFIG" && mode == ctrlmeshv1alpha1.InterceptKubeconfig:
				return fmt.Sprintf("container %q sets KUBECONFIG itself, and the proxy works by setting it", c.Name)
			case e.Name == "KUBECONFIG":
				return fmt.Sprintf("container %q sets KUBECONFIG, so it may reach the API server around the proxy of interception %s", c.Name, mode)
			case (e.Name == "KUBERNETES_SERVICE_HOST" || e.Name == "KUBERNETES_SERVICE_PORT") && mode == ctrlmeshv1alpha1.InterceptEnvironment:
				return fmt.Sprintf("container %q sets %s itself, and the proxy works by setting it", c.Name, e.Name)
			}
		}
		if mode == ctrlmeshv1alpha1.InterceptKubeconfig {
			continue
		}
		for _, m := range c.VolumeMounts {
			// The ServiceAccount admission plugin's volume is the one to
			// replace; another is the author's choice of credentials.
			if path.Clean(m.MountPath) == ServiceAccountMountPath && !strings.HasPrefix(m.Name, serviceAccountPluginVolumePrefix) {
				return fmt.Sprintf("container %q mounts volume %q at %s, where the proxy's CA bundle goes under interception %s", c.Name, m.Name, ServiceAccountMountPath, mode)
			}
		}
		if mode == ctrlmeshv1alpha1.InterceptIptables && runsAs(pod, c) == ctrlmeshv1alpha1.ProxyUserID {
			return fmt.Sprintf("container %q runs as user %d, the proxy's under interception Iptables, whose connections are not redirected: run it as another user", c.Name, ctrlmeshv1alpha1.ProxyUserID)
		}
	}
	return ""
}

// serviceAccountPluginVolumePrefix begins the name of the projected volume
// the ServiceAccount admission plugin mounts at ServiceAccountMountPath.
const serviceAccountPluginVolumePrefix = "kube-api-access-"

// runsAs is the user the pod's spec sets for container c, or -1 when the
// image decides.
func runsAs(pod *corev1.Pod, c corev1.Container) int64 {
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		return *c.SecurityContext.RunAsUser
	}
	if pod.Spec.SecurityContext != nil && pod.Spec.SecurityContext.RunAsUser != nil {
		return *pod.Spec.SecurityContext.RunAsUser
	}
	return -1
}

// webhookCertMount returns the mount, made read-only, of the operator's
// webhook certificate for the proxy's webhook router, or nil and why there
// is no router ("" when the route has no webhook).
func webhookCertMount(pod *corev1.Pod, route *ctrlmeshv1alpha1.ShardRoute) (*corev1.VolumeMount, string) {
	wh := route.Spec.Webhook
	if wh == nil {
		return nil, ""
	}
	if wh.Port == ctrlmeshv1alpha1.ProxyWebhookRouterPort {
		return nil, fmt.Sprintf("without the webhook router: the operator's webhook port %d is the router's own", wh.Port)
	}
	certDir := path.Clean(wh.CertDir)
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if path.Clean(m.MountPath) == certDir {
				mount := m
				mount.ReadOnly = true
				// Propagation needs a privileged container; the proxy only reads.
				mount.MountPropagation = nil
				return &mount, ""
			}
		}
	}
	return nil, fmt.Sprintf("without the webhook router: no container mounts a volume at the ShardRoute's webhook.certDir %s", wh.CertDir)
}

// proxyContainer is the proxy as a native sidecar (an init container that
// keeps running) for the ShardRoute named rules, with the webhook router
// when certMount is set.
func proxyContainer(rules string, mode ctrlmeshv1alpha1.Interception, certMount *corev1.VolumeMount, opts Options) corev1.Container {
	health := func(path string) corev1.ProbeHandler {
		return corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(ctrlmeshv1alpha1.ProxyHealthPort)}}
	}
	fieldEnv := func(name, field string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: field}}}
	}
	var kubeconfigArg []string
	if mode == ctrlmeshv1alpha1.InterceptKubeconfig {
		kubeconfigArg = []string{ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagOperatorKubeconfig, KubeconfigPath)}
	}
	c := corev1.Container{
		Name:  ctrlmeshv1alpha1.ProxyContainerName,
		Image: opts.Image,
		// No --upstream-kubeconfig: the proxy reaches the API server with
		// the pod's own service account, in-cluster, so it never has rights
		// the operator lacks.
		Args: slices.Concat([]string{ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagRulesName, rules)}, kubeconfigArg, []string{
			ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagListenAddress, fmt.Sprintf("127.0.0.1:%d", ctrlmeshv1alpha1.ProxyListenPort)),
			ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagHealthAddress, fmt.Sprintf(":%d", ctrlmeshv1alpha1.ProxyHealthPort)),
			ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagForwardProxyAddress, fmt.Sprintf("127.0.0.1:%d", ctrlmeshv1alpha1.ProxyForwardPort)),
			ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagStateDir, StateDir),
		}),
		Env: []corev1.EnvVar{
			fieldEnv(ctrlmeshv1alpha1.ProxyEnvPodName, "metadata.name"),
			fieldEnv(ctrlmeshv1alpha1.ProxyEnvPodNamespace, "metadata.namespace"),
			fieldEnv(ctrlmeshv1alpha1.ProxyEnvPodIP, "status.podIP"),
		},
		Ports: []corev1.ContainerPort{{Name: "proxy-health", ContainerPort: ctrlmeshv1alpha1.ProxyHealthPort, Protocol: corev1.ProtocolTCP}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: opts.CPURequest, corev1.ResourceMemory: opts.MemoryRequest},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: opts.MemoryLimit},
		},
		VolumeMounts: []corev1.VolumeMount{{Name: KubeconfigVolume, MountPath: KubeconfigDir}, {Name: StateVolume, MountPath: StateDir}},
		// Ready means the rules are loaded and the kubeconfig written, so
		// the operator containers, started after this probe passes, never
		// run a moment unsharded.
		StartupProbe:   &corev1.Probe{ProbeHandler: health("/readyz"), PeriodSeconds: startupProbePeriodSeconds, FailureThreshold: startupProbeFailureThreshold},
		ReadinessProbe: &corev1.Probe{ProbeHandler: health("/readyz"), PeriodSeconds: 5, FailureThreshold: 3},
		LivenessProbe:  &corev1.Probe{ProbeHandler: health("/healthz"), PeriodSeconds: 10, FailureThreshold: 3},
		RestartPolicy:  ptr.To(corev1.ContainerRestartPolicyAlways),
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			Privileged:               ptr.To(false),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
	if mode != ctrlmeshv1alpha1.InterceptKubeconfig {
		names := environmentServingNames
		if mode == ctrlmeshv1alpha1.InterceptIptables {
			// And the endpoints' addresses, which the operator may dial too.
			names = slices.Clone(iptablesServingNames)
			for _, e := range opts.apiServerEndpoints {
				if host, _, err := net.SplitHostPort(e); err == nil {
					names = append(names, host)
				}
			}
			// The redirection leaves this user's connections alone.
			c.SecurityContext.RunAsUser = ptr.To[int64](ctrlmeshv1alpha1.ProxyUserID)
			c.SecurityContext.RunAsGroup = ptr.To[int64](ctrlmeshv1alpha1.ProxyUserID)
		}
		c.Args = append(c.Args,
			ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagOperatorServiceAccountDir, ServiceAccountDir),
			ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagServingNames, strings.Join(names, ",")))
		c.VolumeMounts = []corev1.VolumeMount{{Name: ServiceAccountVolume, MountPath: ServiceAccountDir}, {Name: StateVolume, MountPath: StateDir}}
	}
	if certMount != nil {
		c.Args = append(c.Args,
			ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagWebhookListenAddress, fmt.Sprintf(":%d", ctrlmeshv1alpha1.ProxyWebhookRouterPort)),
			ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.ProxyFlagWebhookCertDir, certMount.MountPath))
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: "proxy-webhook", ContainerPort: ctrlmeshv1alpha1.ProxyWebhookRouterPort, Protocol: corev1.ProtocolTCP})
		c.VolumeMounts = append(c.VolumeMounts, *certMount)
	}
	return c
}

// redirectContainer is the init container of Iptables interception: the
// proxy's image running "ctrlmesh-proxy redirect" as root with the
// NET_ADMIN capability and no other (netfilter rules of the pod's network
// namespace need both; a non-root user keeps no capabilities across exec).
// It sends the pod's connections to the kubernetes Service's address, as
// the kubelet sets it in the container's environment (and expands in its
// arguments), and to the API server's endpoints as read at admission, to
// the proxy's port, except the proxy's user's.
func redirectContainer(opts Options, endpoints []string) corev1.Container {
	args := []string{
		ctrlmeshv1alpha1.RedirectCommand,
		ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.RedirectFlagDestination, "$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"),
	}
	for _, e := range endpoints {
		args = append(args, ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.RedirectFlagDestination, e))
	}
	args = append(args,
		ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.RedirectFlagToPort, ctrlmeshv1alpha1.ProxyListenPort),
		ctrlmeshv1alpha1.ProxyFlag(ctrlmeshv1alpha1.RedirectFlagExcludeUserID, ctrlmeshv1alpha1.ProxyUserID))
	return corev1.Container{
		Name:  ctrlmeshv1alpha1.RedirectContainerName,
		Image: opts.Image,
		Args:  args,
		// Its error, in the pod's status, says what failed.
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser:                ptr.To[int64](0),
			RunAsNonRoot:             ptr.To(false),
			Privileged:               ptr.To(false),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

// annotate records the outcome of the injection on the pod.
func annotate(pod *corev1.Pod, outcome, reason string) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation] = outcome
	pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation] = reason
}
