package realpods_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/certs"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/images"
)

// Images of the interception test.
const (
	// kcmImage is kube-controller-manager of 'make tools' (linked against
	// the C library, which the image carries).
	kcmImage = "ctrlmesh.test/kube-controller-manager:test"
	// inClusterImage is test/images/incluster.
	inClusterImage = "ctrlmesh.test/incluster:test"
)

// stripLabel marks the pods whose redirect container a second webhook,
// called after the injector's, takes NET_ADMIN from: a cluster policy
// that strips capabilities, under which the redirection cannot be set up.
const stripLabel = "ctrlmesh.test/strip-net-admin"

// TestInterceptionOnRealNode runs a real operator that uses in-cluster
// configuration only — kube-controller-manager without --kubeconfig, its
// disruption controller alone (PodDisruptionBudget status), which this
// cluster's own controller manager does not run — under each in-cluster
// interception, injected by the agent's injection webhook (served by this
// test) into pods the kubelet runs:
//
//   - Environment (namespace kcm-env, buckets 0-7) and Iptables
//     (kcm-iptables, buckets 16-23): the operator leads through its
//     renamed lock and writes the status of the PodDisruptionBudgets of its
//     buckets only, never of one in nobody's buckets, created before it
//     started; its proxy counts the narrowed reads. In Iptables mode the
//     operator keeps the kubelet's KUBERNETES_SERVICE_HOST (the Service's
//     ClusterIP), whose connections the redirect container sends to the
//     proxy.
//   - TLS verified both ways: test/images/incluster in such a pod reaches
//     the API server through the proxy with the injected CA bundle, and
//     fails with the cluster's CA (the proxy is not the API server, and the
//     client verifies); the proxy itself reads the cluster's CA from the
//     pod's token volume.
//   - Fail closed: a pod whose redirect container lost NET_ADMIN never
//     starts its proxy or its operator.
func TestInterceptionOnRealNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	assets := filepath.Join(root, "bin")
	if dir := os.Getenv(env.AssetsEnv); dir != "" {
		assets = dir
	}
	start := time.Now()
	// Range mode (the gate), so that no labeler is needed.
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "member1", Node: true, FeatureGates: []string{env.FeatureShardedListAndWatch}}}})
	if err != nil {
		t.Fatal(err)
	}
	member := fleet.Cluster("member1")
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	t.Logf("member1 with node %s started in %s", member.Node.Name, time.Since(start).Round(time.Millisecond))

	built := time.Now()
	var imgs []images.Image
	for _, img := range []struct{ name, pkg, user string }{
		{proxyImage, "./cmd/ctrlmesh-proxy", "65532"}, {inClusterImage, "./test/images/incluster", ""},
	} {
		file := "/" + filepath.Base(img.pkg)
		bin := filepath.Join(t.TempDir(), filepath.Base(img.pkg))
		if err := images.BuildStatic(ctx, root, img.pkg, bin); err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, images.Image{Name: img.name, Files: map[string]string{file: bin}, Entrypoint: []string{file}, User: img.user})
	}
	imgs = append(imgs, images.Image{Name: kcmImage, Entrypoint: []string{"/kube-controller-manager"}, Files: map[string]string{
		"/kube-controller-manager":        filepath.Join(assets, controlplane.KubeControllerManagerBinary),
		"/lib/x86_64-linux-gnu/libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6",
		"/lib64/ld-linux-x86-64.so.2":     "/lib64/ld-linux-x86-64.so.2",
	}})
	if err := member.Node.ImportImages(ctx, imgs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("images built and imported in %s", time.Since(built).Round(time.Millisecond))

	serveInjection(t, ctx, member)
	rbac := kcmRBAC(t, root)
	for _, o := range rbac {
		env.Create(t, ctx, member.Client, o)
	}

	space, err := sharding.NewSpace(32)
	if err != nil {
		t.Fatal(err)
	}
	// A PodDisruptionBudget in nobody's buckets (8-15), there before any
	// operator starts: an operator seeing more than its shard would
	// write its status.
	nobody := namespaceInBuckets(space, "nobody", 8, 15)
	env.Create(t, ctx, member.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nobody}})
	nobodyPDB := pdb(nobody)
	env.Create(t, ctx, member.Client, nobodyPDB)

	for _, m := range []struct {
		mode      ctrlmeshv1alpha1.Interception
		namespace string
		low, high int
		wantHost  string
	}{
		{ctrlmeshv1alpha1.InterceptEnvironment, "kcm-env", 0, 7, "https://127.0.0.1:" + strconv.Itoa(ctrlmeshv1alpha1.ProxyListenPort)},
		{ctrlmeshv1alpha1.InterceptIptables, "kcm-iptables", 16, 23, "https://" + net.JoinHostPort(member.Node.KubernetesServiceIP, "443")},
	} {
		t.Run(string(m.mode), func(t *testing.T) {
			checkInterception(t, ctx, member, space, m.mode, m.namespace, m.low, m.high, m.wantHost)
		})
	}
	t.Run("RedirectFailsClosed", func(t *testing.T) { checkRedirectFailsClosed(t, ctx, member, "kcm-iptables") })

	// Nobody's PodDisruptionBudget: untouched by either operator.
	if err := member.Client.Get(ctx, client.ObjectKeyFromObject(nobodyPDB), nobodyPDB); err != nil {
		t.Fatal(err)
	}
	if nobodyPDB.Status.ObservedGeneration != 0 {
		t.Errorf("the PodDisruptionBudget of %s (bucket %d, nobody's) has a status: %+v", nobody, space.Bucket(nobody), nobodyPDB.Status)
	}
}

// checkInterception runs kube-controller-manager in namespace under mode,
// its ShardRoute giving it buckets low-high, and a pod of incluster.
func checkInterception(t *testing.T, ctx context.Context, member *env.Cluster, space sharding.Space, mode ctrlmeshv1alpha1.Interception, namespace string, low, high int, wantHost string) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the pods of %s:\n%s", namespace, podLogs(member.Node, namespace))
		}
	})
	env.Create(t, ctx, member.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	env.Create(t, ctx, member.Client, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "kcm"}})
	env.Create(t, ctx, member.Client, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "ctrlmesh-proxy"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: "kcm"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: proxyClusterRole},
	})
	env.Create(t, ctx, member.Client, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kcm-" + namespace},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: "kcm"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: kcmClusterRole},
	})
	route := &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "kcm"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: "member1", RoutingGeneration: 1, RulesHash: "h1", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector:     metav1.LabelSelector{MatchLabels: map[string]string{"app": "kcm"}},
			Controller:   &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "kcm"},
			Interception: mode,
			Limits: ctrlmeshv1alpha1.Limits{{
				RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}}},
			}},
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: fmt.Sprintf("%d-%d", low, high), Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "kcm"}}}},
		},
	}
	env.Create(t, ctx, member.Client, route)
	// The shard's PodDisruptionBudget.
	mine := namespaceInBuckets(space, namespace+"-shard", low, high)
	env.Create(t, ctx, member.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mine}})
	minePDB := pdb(mine)
	env.Create(t, ctx, member.Client, minePDB)

	operator := interceptedPod(namespace, "kcm", corev1.Container{
		Name: "kcm", Image: kcmImage, ImagePullPolicy: corev1.PullNever,
		// No --kubeconfig: in-cluster configuration.
		Args: []string{"--controllers=disruption-controller", "--leader-elect=true", "--leader-elect-resource-name=kcm",
			"--leader-elect-resource-namespace=" + namespace, "--secure-port=0", "--use-service-account-credentials=false", "--v=2"},
	})
	created := time.Now()
	env.Create(t, ctx, member.Client, operator)
	waitRunning(t, ctx, member, operator)
	t.Logf("%s: pod %s Running %s after its creation: %s", mode, operator.Name, time.Since(created).Round(time.Second), podState(operator))
	checkInjectedFor(t, operator, mode, member.Node.KubernetesServiceIP)

	env.Eventually(t, 3*time.Minute, "the PodDisruptionBudget of "+mine+" reconciled", func() error {
		if err := member.Client.Get(ctx, client.ObjectKeyFromObject(minePDB), minePDB); err != nil {
			return err
		}
		if minePDB.Status.ObservedGeneration != minePDB.Generation {
			return fmt.Errorf("status %+v", minePDB.Status)
		}
		return nil
	})
	t.Logf("%s: PodDisruptionBudget %s/%s (bucket %d) reconciled %s after the pod's creation", mode, mine, minePDB.Name, space.Bucket(mine), time.Since(created).Round(time.Second))
	// The operator leads through the renamed lock.
	leaseKey := client.ObjectKey{Namespace: namespace, Name: "kcm---0"}
	env.Eventually(t, time.Minute, "the operator's Lease "+leaseKey.String(), func() error {
		var lease coordinationv1.Lease
		if err := member.Client.Get(ctx, leaseKey, &lease); err != nil {
			return err
		}
		if !strings.HasPrefix(ptr.Deref(lease.Spec.HolderIdentity, ""), operator.Name+"_") {
			return fmt.Errorf("held by %q", ptr.Deref(lease.Spec.HolderIdentity, ""))
		}
		return nil
	})
	// Its proxy narrowed its reads and renamed its lock.
	metrics := proxyMetrics(t, ctx, operator)
	for _, series := range []string{`ctrlmesh_proxy_injected_selectors_total{mode="range"}`, `ctrlmesh_proxy_lock_renames_total`} {
		if v := metricValue(metrics, series); v <= 0 {
			t.Errorf("%s: proxy metric %s = %v, want > 0", mode, series, v)
		} else {
			t.Logf("%s: proxy metric %s = %v", mode, series, v)
		}
	}

	// incluster: through the proxy with the injected CA bundle, and
	// refused with the cluster's CA.
	caVolume := corev1.Volume{Name: "cluster-ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}}}
	path := "/api/v1/namespaces/" + namespace
	probe := interceptedPod(namespace, "incluster",
		corev1.Container{Name: "injected-ca", Image: inClusterImage, ImagePullPolicy: corev1.PullNever, Args: []string{path}},
		corev1.Container{Name: "cluster-ca", Image: inClusterImage, ImagePullPolicy: corev1.PullNever, Args: []string{path},
			Env:          []corev1.EnvVar{{Name: "INCLUSTER_CA_FILE", Value: "/cluster-ca/ca.crt"}},
			VolumeMounts: []corev1.VolumeMount{{Name: caVolume.Name, MountPath: "/cluster-ca", ReadOnly: true}}},
	)
	probe.Spec.RestartPolicy = corev1.RestartPolicyNever
	probe.Spec.Volumes = []corev1.Volume{caVolume}
	endpoint, err := url.Parse(member.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	if mode == ctrlmeshv1alpha1.InterceptIptables {
		// Dialling the API server's endpoint, not its Service, reaches the
		// proxy too: with the proxy's CA bundle and token, only the proxy
		// can answer 200.
		probe.Spec.Containers = append(probe.Spec.Containers, corev1.Container{Name: "endpoint", Image: inClusterImage, ImagePullPolicy: corev1.PullNever, Args: []string{path},
			Env: []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: endpoint.Hostname()}, {Name: "KUBERNETES_SERVICE_PORT", Value: endpoint.Port()}}})
	}
	env.Create(t, ctx, member.Client, probe)
	messages := map[string]string{}
	env.Eventually(t, 3*time.Minute, "incluster's containers terminated", func() error {
		if err := member.Client.Get(ctx, client.ObjectKeyFromObject(probe), probe); err != nil {
			return err
		}
		for _, s := range probe.Status.ContainerStatuses {
			if s.State.Terminated == nil {
				return fmt.Errorf("%s: %s", s.Name, podState(probe))
			}
			messages[s.Name] = s.State.Terminated.Message
		}
		if len(messages) != len(probe.Spec.Containers) {
			return fmt.Errorf("%s", podState(probe))
		}
		return nil
	})
	var ns corev1.Namespace
	if err := member.Client.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("host %s\nGET %s 200 %s\n", wantHost, path, ns.UID); messages["injected-ca"] != want {
		t.Errorf("%s: with the injected CA bundle incluster reported\n%s\nwant\n%s", mode, messages["injected-ca"], want)
	}
	if got := messages["cluster-ca"]; !strings.Contains(got, "host "+wantHost+"\n") || !strings.Contains(got, "x509: certificate signed by unknown authority") {
		t.Errorf("%s: with the cluster's CA incluster reported\n%s\nwant a refusal of the proxy's certificate (x509: certificate signed by unknown authority) at %s", mode, got, wantHost)
	}
	if mode == ctrlmeshv1alpha1.InterceptIptables {
		if want := fmt.Sprintf("host https://%s\nGET %s 200 %s\n", endpoint.Host, path, ns.UID); messages["endpoint"] != want {
			t.Errorf("dialling the endpoint %s, incluster reported\n%s\nwant\n%s", endpoint.Host, messages["endpoint"], want)
		}
		redirect := probe.Spec.InitContainers[0]
		if !slices.Contains(redirect.Args, "--destination="+endpoint.Host) {
			t.Errorf("the redirect container's arguments %v lack the endpoint %s", redirect.Args, endpoint.Host)
		}
		t.Logf("%s: incluster dialling the endpoint %s: %q", mode, endpoint.Host, messages["endpoint"])
	}
	t.Logf("%s: incluster with the injected CA: %q; with the cluster's CA: %q", mode, messages["injected-ca"], strings.TrimSpace(messages["cluster-ca"]))
}

// checkInjectedFor checks the pod the webhook wrote for mode: the
// operator reads the proxy's service-account directory, the proxy the
// pod's token volume (the cluster's CA, kube-root-ca.crt), and under
// Iptables the operator keeps the kubelet's address of the API server.
func checkInjectedFor(t *testing.T, pod *corev1.Pod, mode ctrlmeshv1alpha1.Interception, serviceIP string) {
	t.Helper()
	if got := pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation]; !strings.Contains(got, "interception "+string(mode)) {
		t.Errorf("injection %q", got)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	saMount := func(c corev1.Container) corev1.Volume {
		for _, m := range c.VolumeMounts {
			if m.MountPath == inject.ServiceAccountMountPath {
				return volumes[m.Name]
			}
		}
		return corev1.Volume{}
	}
	operator := pod.Spec.Containers[0]
	if got := saMount(operator); got.Name != inject.ServiceAccountVolume {
		t.Errorf("the operator reads %+v at %s, want the proxy's %s", got, inject.ServiceAccountMountPath, inject.ServiceAccountVolume)
	}
	for _, c := range pod.Spec.InitContainers {
		if c.Name != ctrlmeshv1alpha1.ProxyContainerName {
			continue
		}
		v := saMount(c)
		if v.Projected == nil || !slices.ContainsFunc(v.Projected.Sources, func(s corev1.VolumeProjection) bool {
			return s.ConfigMap != nil && s.ConfigMap.Name == "kube-root-ca.crt"
		}) {
			t.Errorf("the proxy reads %+v at %s, want the pod's token volume with the cluster's CA", v, inject.ServiceAccountMountPath)
		}
	}
	if mode == ctrlmeshv1alpha1.InterceptIptables {
		if len(pod.Status.InitContainerStatuses) < 2 || pod.Status.InitContainerStatuses[0].Name != ctrlmeshv1alpha1.RedirectContainerName ||
			pod.Status.InitContainerStatuses[0].State.Terminated == nil || pod.Status.InitContainerStatuses[0].State.Terminated.ExitCode != 0 {
			t.Errorf("the redirect container did not complete first: %s", podState(pod))
		}
		for _, e := range operator.Env {
			if strings.HasPrefix(e.Name, "KUBERNETES_SERVICE_") {
				t.Errorf("the operator's %s is set (%q): under Iptables it keeps the kubelet's (%s)", e.Name, e.Value, serviceIP)
			}
		}
	}
}

// checkRedirectFailsClosed: a pod whose redirect container cannot write
// its rules (NET_ADMIN taken by a later webhook) starts neither its proxy
// nor its operator.
func checkRedirectFailsClosed(t *testing.T, ctx context.Context, member *env.Cluster, namespace string) {
	pod := interceptedPod(namespace, "kcm-stripped", corev1.Container{Name: "kcm", Image: kcmImage, ImagePullPolicy: corev1.PullNever,
		Args: []string{"--controllers=disruption-controller", "--leader-elect=false", "--secure-port=0"}})
	pod.Labels[stripLabel] = "true"
	env.Create(t, ctx, member.Client, pod)
	if add := pod.Spec.InitContainers[0].SecurityContext.Capabilities.Add; pod.Spec.InitContainers[0].Name != ctrlmeshv1alpha1.RedirectContainerName || len(add) != 0 {
		t.Fatalf("init containers %+v, want the redirect container without NET_ADMIN", pod.Spec.InitContainers)
	}
	var failures int32
	env.Eventually(t, 3*time.Minute, "the redirect container failing twice", func() error {
		if err := member.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		if len(pod.Status.InitContainerStatuses) == 0 {
			return fmt.Errorf("%s", podState(pod))
		}
		s := pod.Status.InitContainerStatuses[0]
		failures = s.RestartCount
		if s.RestartCount < 1 || s.LastTerminationState.Terminated == nil || s.LastTerminationState.Terminated.ExitCode == 0 {
			return fmt.Errorf("%s", podState(pod))
		}
		return nil
	})
	last := pod.Status.InitContainerStatuses[0].LastTerminationState.Terminated
	if !strings.Contains(last.Message, "NET_ADMIN") {
		t.Errorf("the redirect container's last words %q do not name the capability", last.Message)
	}
	for _, s := range slices.Concat(pod.Status.InitContainerStatuses[1:], pod.Status.ContainerStatuses) {
		if s.State.Running != nil || s.State.Terminated != nil || s.LastTerminationState.Terminated != nil || s.RestartCount != 0 {
			t.Errorf("%s ran although the redirection failed: %s", s.Name, podState(pod))
		}
	}
	t.Logf("pod %s: the redirect container failed %d+ times (%q), its proxy and operator never started: %s",
		pod.Name, failures+1, strings.TrimSpace(last.Message), podState(pod))
}

// interceptedPod is a pod asking for the proxy, selected by the
// namespace's ShardRoute, under the ServiceAccount kcm.
func interceptedPod(namespace, name string, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
			Labels: map[string]string{"app": "kcm", ctrlmeshv1alpha1.EnableProxyLabel: "true"}},
		Spec: corev1.PodSpec{ServiceAccountName: "kcm", Containers: containers},
	}
}

// waitRunning waits until every container of the pod runs Ready (the
// operator has no probe: running).
func waitRunning(t *testing.T, ctx context.Context, member *env.Cluster, pod *corev1.Pod) {
	t.Helper()
	env.Eventually(t, 4*time.Minute, "pod "+pod.Name+" Running with its proxy Ready", func() error {
		if err := member.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("%s", podState(pod))
		}
		for _, s := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
			if s.Name == ctrlmeshv1alpha1.RedirectContainerName {
				continue
			}
			if !s.Ready {
				return fmt.Errorf("%s not ready: %s", s.Name, podState(pod))
			}
		}
		return nil
	})
}

// pdb is a PodDisruptionBudget in namespace that selects no pod.
func pdb(namespace string) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "budget"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "none"}},
		},
	}
}

// namespaceInBuckets is the first name prefix-<i> in buckets low-high.
func namespaceInBuckets(space sharding.Space, prefix string, low, high int) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if b := space.Bucket(name); b >= low && b <= high {
			return name
		}
	}
}

// The ClusterRoles of the test's operators: the shipped proxy's, and
// kube-controller-manager's disruption controller's.
const (
	proxyClusterRole = "ctrlmesh-proxy"
	kcmClusterRole   = "ctrlmesh-test-kcm-disruption"
)

// kcmRBAC is the proxy's shipped ClusterRole (deploy/rbac/proxy.yaml)
// and the disruption controller's.
func kcmRBAC(t *testing.T, root string) []client.Object {
	t.Helper()
	proxyRole := shippedProxyRole(t, root)
	if proxyRole.Name != proxyClusterRole {
		t.Fatalf("deploy/rbac/proxy.yaml names ClusterRole %q, want %q", proxyRole.Name, proxyClusterRole)
	}
	read := []string{"get", "list", "watch"}
	return []client.Object{proxyRole, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: kcmClusterRole}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "replicationcontrollers", "namespaces"}, Verbs: read},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "replicasets", "statefulsets"}, Verbs: read},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments/scale", "replicasets/scale", "statefulsets/scale"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"replicationcontrollers/scale"}, Verbs: []string{"get"}},
		{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: read},
		{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets/status"}, Verbs: []string{"update", "patch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
	}}}
}

// proxyMetrics reads the proxy's /metrics at the pod's address (the host
// routes the node's pod subnet).
func proxyMetrics(t *testing.T, ctx context.Context, pod *corev1.Pod) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(ctrlmeshv1alpha1.ProxyHealthPort))+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the proxy's metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the proxy's metrics: %d %v", resp.StatusCode, err)
	}
	return string(body)
}

// metricValue is the value of the series (name{labels} as exposed), or -1.
func metricValue(metrics, series string) float64 {
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// serveInjection serves the agent's injection Handler, reading the
// member's ShardRoutes, and a second webhook that takes NET_ADMIN from the
// redirect container of pods labeled stripLabel, and registers both
// (failurePolicy Fail) with the member's API server, which calls them on
// this machine's loopback.
func serveInjection(t *testing.T, ctx context.Context, member *env.Cluster) {
	t.Helper()
	handler, err := inject.NewHandler(member.Client, inject.Options{Image: proxyImage, APIServer: member.Client}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caPEM, err := certs.WriteServing(dir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.CertFile), filepath.Join(dir, certs.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/inject", handler)
	mux.HandleFunc("/strip", stripNetAdmin)
	server := httptest.NewUnstartedServer(mux)
	server.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	server.StartTLS()
	t.Cleanup(server.Close)
	injectURL, stripURL := server.URL+"/inject", server.URL+"/strip"
	config, err := inject.WebhookConfiguration(inject.WebhookOptions{ConfigurationName: "ctrlmesh-agent-inject", WebhookName: "inject.ctrlmesh.io",
		ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &injectURL, CABundle: caPEM}})
	if err != nil {
		t.Fatal(err)
	}
	env.Create(t, ctx, member.Client, config)
	// Called after the injector's: configurations are called in the order
	// of their names.
	strip := config.DeepCopy()
	strip.ObjectMeta = metav1.ObjectMeta{Name: "zz-strip-net-admin"}
	strip.Webhooks[0].Name = "strip.ctrlmesh.test"
	strip.Webhooks[0].ClientConfig.URL = &stripURL
	strip.Webhooks[0].ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{stripLabel: "true"}}
	env.Create(t, ctx, member.Client, strip)
}

// stripNetAdmin answers an AdmissionReview of a pod with a patch that
// empties the added capabilities of its redirect container.
func stripNetAdmin(w http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "bad review", http.StatusBadRequest)
		return
	}
	var pod corev1.Pod
	if err := json.Unmarshal(review.Request.Object.Raw, &pod); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	response := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	for i, c := range pod.Spec.InitContainers {
		if c.Name == ctrlmeshv1alpha1.RedirectContainerName {
			patch := fmt.Sprintf(`[{"op":"replace","path":"/spec/initContainers/%d/securityContext/capabilities/add","value":[]}]`, i)
			response.Patch = []byte(patch)
			response.PatchType = ptr.To(admissionv1.PatchTypeJSONPatch)
		}
	}
	review.Response = response
	review.Request = nil
	_ = json.NewEncoder(w).Encode(&review)
}
