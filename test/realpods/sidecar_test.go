package realpods_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// Images of the sidecar step, built and imported beside the agent's.
const (
	// proxyImage is cmd/ctrlmesh-proxy, run as 65532 as deploy/docker's
	// image is: the injected container asks for runAsNonRoot.
	proxyImage = "ctrlmesh.test/ctrlmesh-proxy:test"
	// operatorImage is scenarios/demo-operator.
	operatorImage = "ctrlmesh.test/demo-operator:test"
)

// operatorNamespace, operatorName: where the demo operator runs in the
// member, its Deployment, ServiceAccount and ShardRoute.
const (
	operatorNamespace = "demo"
	operatorName      = "demo-operator"
)

// checkInjectedSidecar runs the demo operator as a user would shard it,
// once the agent of cluster has joined the hub: the hub accepts the member
// and writes the Work of a ShardRoute for it (as the hub's controllers do),
// the agent applies it; the operator's Deployment asks for the proxy, under
// a ServiceAccount of its own bound to the operator's rights and to
// deploy/rbac/proxy.yaml. The agent's webhook injects the proxy as a native
// sidecar, the kubelet starts it before the operator, and both run Ready
// with the pod's service-account token as their only credential: the proxy
// loads its rules and reports them in the ShardRoute's status.
func checkInjectedSidecar(t *testing.T, ctx context.Context, hub, member *env.Cluster, cluster string) {
	// The hub's part: it accepts the member, and writes the Work carrying
	// the ShardRoute into the member's execution namespace.
	var mc clusterv1.ManagedCluster
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
		t.Fatal(err)
	}
	accepted := mc.DeepCopy()
	accepted.Spec.HubAcceptsClient = true
	if err := hub.Client.Patch(ctx, accepted, client.MergeFrom(&mc)); err != nil {
		t.Fatal(err)
	}
	selector := map[string]string{"app.kubernetes.io/name": operatorName}
	route := &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace, Name: operatorName},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: cluster, RoutingGeneration: 1, RulesHash: "h1", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector: metav1.LabelSelector{MatchLabels: selector},
			Limits: ctrlmeshv1alpha1.Limits{{
				RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}},
			}},
			// No pod yet: the hub places the operator's pods once they run.
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: "0-31"}},
		},
	}
	work := routework.NewWork(routework.WorkKey(cluster, operatorNamespace, operatorName))
	if err := routework.SetManifests(work, route, nil); err != nil {
		t.Fatal(err)
	}

	// The member's part: the operator's namespace, ServiceAccount and RBAC
	// (its own rights, and the shipped proxy ClusterRole bound in its
	// namespace only).
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "rbac", "proxy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var proxyRole rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(data, &proxyRole); err != nil {
		t.Fatal(err)
	}
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: operatorNamespace, Name: operatorName}}
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace, Name: operatorName}},
		&proxyRole,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace, Name: proxyRole.Name}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: proxyRole.Name}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: operatorName}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
			{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: operatorName}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: operatorName}},
	} {
		env.Create(t, ctx, member.Client, o)
	}
	env.Create(t, ctx, hub.Client, work)

	// The agent, accepted, applies the ShardRoute: its webhook then injects
	// into the pods the route selects.
	env.Eventually(t, 3*time.Minute, "the ShardRoute applied by the agent", func() error {
		var got ctrlmeshv1alpha1.ShardRoute
		return member.Client.Get(ctx, client.ObjectKeyFromObject(route), &got)
	})

	podLabels := map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true"}
	for k, v := range selector {
		podLabels[k] = v
	}
	fieldEnv := func(name, field string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: field}}}
	}
	deployment := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace, Name: operatorName},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec: corev1.PodSpec{
					ServiceAccountName: operatorName,
					Containers: []corev1.Container{{
						Name: "manager", Image: operatorImage, ImagePullPolicy: corev1.PullNever,
						// No webhooks (they need a certificate) and no metrics.
						Args: []string{"--webhook-port=0", "--metrics-addr=0", "--health-addr=:8081"},
						Env:  []corev1.EnvVar{fieldEnv("POD_NAME", "metadata.name"), fieldEnv("POD_NAMESPACE", "metadata.namespace")},
					}},
				},
			},
		},
	}
	created := time.Now()
	env.Create(t, ctx, member.Client, deployment)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the operator's pods:\n%s", podLogs(member.Node, operatorNamespace))
		}
	})

	var pod corev1.Pod
	env.Eventually(t, 4*time.Minute, "the operator's pod Running with its proxy and manager Ready on "+member.Node.Name, func() error {
		var pods corev1.PodList
		if err := member.Client.List(ctx, &pods, client.InNamespace(operatorNamespace), client.MatchingLabels(selector)); err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		pod = pods.Items[0]
		state := podState(&pod)
		if pod.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("not running: %s", state)
		}
		for _, s := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
			if !s.Ready {
				return fmt.Errorf("%s not ready: %s", s.Name, state)
			}
		}
		if len(pod.Status.InitContainerStatuses) != 1 || len(pod.Status.ContainerStatuses) != 1 {
			return fmt.Errorf("want the proxy and the manager: %s", state)
		}
		return nil
	})
	t.Logf("pod %s on %s: Running with its proxy and manager Ready %s after the Deployment was created: %s",
		pod.Name, pod.Spec.NodeName, time.Since(created).Round(time.Second), podState(&pod))

	// What the webhook wrote: the proxy as a native sidecar, before the
	// operator container.
	if got := pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation]; got != ctrlmeshv1alpha1.ProxyInjected {
		t.Errorf("injection annotation %q (%s), want %q", got, pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation], ctrlmeshv1alpha1.ProxyInjected)
	}
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Name != ctrlmeshv1alpha1.ProxyContainerName ||
		ptr.Deref(pod.Spec.InitContainers[0].RestartPolicy, "") != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("init containers %+v, want the proxy as a native sidecar (restartPolicy Always)", pod.Spec.InitContainers)
	}
	proxyStatus, managerStatus := pod.Status.InitContainerStatuses[0], pod.Status.ContainerStatuses[0]
	if proxyStatus.Image != proxyImage && !strings.HasSuffix(proxyStatus.Image, proxyImage) {
		t.Errorf("the proxy runs image %q, want %q", proxyStatus.Image, proxyImage)
	}
	// The kubelet starts the operator once the proxy's startup probe
	// passed: never before the proxy.
	if proxyStatus.State.Running == nil || managerStatus.State.Running == nil ||
		managerStatus.State.Running.StartedAt.Before(&proxyStatus.State.Running.StartedAt) {
		t.Errorf("the manager started before the proxy: proxy %+v, manager %+v", proxyStatus.State, managerStatus.State)
	}
	if proxyStatus.RestartCount != 0 || managerStatus.RestartCount != 0 {
		t.Errorf("restarts: proxy %d, manager %d, want none", proxyStatus.RestartCount, managerStatus.RestartCount)
	}

	// No credentials but the pod's own: its ServiceAccount's projected
	// token, mounted into both containers by the ServiceAccount admission
	// plugin, and the emptyDir of the kubeconfig the proxy writes.
	if pod.Spec.ServiceAccountName != operatorName {
		t.Errorf("the pod runs as ServiceAccount %q, want %q", pod.Spec.ServiceAccountName, operatorName)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil || (v.Projected == nil && v.EmptyDir == nil) {
			t.Errorf("volume %s: %+v, want only the projected service-account token and the proxy's emptyDir", v.Name, v.VolumeSource)
		}
	}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount"
		}) {
			t.Errorf("container %s has no service-account token mounted: %+v", c.Name, c.VolumeMounts)
		}
	}

	// The proxy, as the operator's ServiceAccount, read its ShardRoute and
	// reported the rules it applied into its status (a patch that
	// deploy/rbac/proxy.yaml allows, nothing else does).
	env.Eventually(t, 2*time.Minute, "the proxy's report in the ShardRoute's status", func() error {
		var got ctrlmeshv1alpha1.ShardRoute
		if err := member.Client.Get(ctx, client.ObjectKeyFromObject(route), &got); err != nil {
			return err
		}
		for _, f := range got.ManagedFields {
			if f.Manager == ctrlmeshv1alpha1.ProxyFieldManager(pod.Name) && f.Subresource == "status" {
				return nil
			}
		}
		managers := []string{}
		for _, f := range got.ManagedFields {
			managers = append(managers, f.Manager+"/"+f.Subresource)
		}
		return fmt.Errorf("status %+v written by %v, none by %s", got.Status, managers, ctrlmeshv1alpha1.ProxyFieldManager(pod.Name))
	})

	// The hub places the pod in the shard (the next routing generation of
	// the same Work): the operator behind its proxy then takes its leader
	// Lease and reconciles a ConfigMap, every request through the proxy
	// with the pod's own token.
	// The agent writes the Work's status meanwhile: the update retries on a
	// conflict, as the hub's own writer does.
	route.Spec.RoutingGeneration = 2
	route.Spec.Shards[0].Pods = []ctrlmeshv1alpha1.RoutePod{{Name: pod.Name}}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(work), work); err != nil {
			return err
		}
		if err := routework.SetManifests(work, route, nil); err != nil {
			return err
		}
		return hub.Client.Update(ctx, work)
	})
	if err != nil {
		t.Fatal(err)
	}
	placed := time.Now()
	env.Eventually(t, 2*time.Minute, "the operator's leader Lease held by "+pod.Name, func() error {
		var lease coordinationv1.Lease
		if err := member.Client.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: operator.DefaultLeaderElectionID}, &lease); err != nil {
			return err
		}
		if holder := ptr.Deref(lease.Spec.HolderIdentity, ""); holder != pod.Name {
			return fmt.Errorf("held by %q", holder)
		}
		return nil
	})
	managed := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace, Name: "managed",
		Labels: map[string]string{operator.ManagedLabel: operator.ManagedValue}}, Data: map[string]string{"k": "v"}}
	env.Create(t, ctx, member.Client, managed)
	env.Eventually(t, 2*time.Minute, "the ConfigMap reconciled by "+pod.Name, func() error {
		if err := member.Client.Get(ctx, client.ObjectKeyFromObject(managed), managed); err != nil {
			return err
		}
		if by := managed.Annotations[operator.ReconciledByAnnotation]; by != pod.Name {
			return fmt.Errorf("reconciled by %q", by)
		}
		return nil
	})
	t.Logf("pod %s placed in shard 0: leader and its ConfigMap reconciled %s after the Work's update", pod.Name, time.Since(placed).Round(time.Millisecond))
}

// podState is the pod's phase and its containers' states, for messages.
func podState(pod *corev1.Pod) string {
	state := string(pod.Status.Phase)
	for _, s := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		state += fmt.Sprintf("; %s ready=%v restarts=%d %+v", s.Name, s.Ready, s.RestartCount, s.State)
	}
	return state
}

// podLogs returns the last lines each container of the pods of namespace
// printed, read from the kubelet's log files under the node's directory
// (the API server's log requests do not reach this kubelet, which serves
// on 127.0.0.1), for a failure message.
func podLogs(node *controlplane.Node, namespace string) string {
	files, err := filepath.Glob(filepath.Join(node.Dir, "pod-logs", namespace+"_*", "*", "*.log"))
	if err != nil {
		return err.Error()
	}
	var out strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Fprintf(&out, "--- %s (err %v):\n%s\n", f, err, strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
	return out.String()
}
