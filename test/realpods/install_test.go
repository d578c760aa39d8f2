package realpods_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/karmada-io/karmada/pkg/util/names"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// agentNamespace is the member namespace the agent chart is installed in.
const agentNamespace = "ctrlmesh"

// installAgent joins member to the hub as cluster, the user's way: the hub
// admin makes the member's identity on the hub and hands its token over as
// a kubeconfig Secret, and the agent chart is installed into the member
// with the real helm (replicas of it), with the images of buildImages. It
// returns when helm install was started, once the agent's pods run Ready
// on the member's node.
func installAgent(t *testing.T, ctx context.Context, helm, root string, hubCluster, member *env.Cluster, cluster string, replicas int) time.Time {
	t.Helper()
	hubObjects := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: membership.AgentNamespace}},
		// The cluster namespace, where the agent renews its heartbeat.
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ctrlmeshv1alpha1.ClusterNamespace(cluster)}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: names.GenerateExecutionSpaceName(cluster)}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: membership.AgentNamespace, Name: membership.AgentServiceAccount(cluster)}},
	}
	for _, o := range append(hubObjects, membership.AgentHubRBAC(cluster)...) {
		env.Create(t, ctx, hubCluster.Client, o)
	}
	hubClientset, err := kubernetes.NewForConfig(hubCluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	token, err := hubClientset.CoreV1().ServiceAccounts(membership.AgentNamespace).CreateToken(ctx, membership.AgentServiceAccount(cluster),
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"hub": {Server: hubCluster.Config.Host, CertificateAuthorityData: hubCluster.Config.CAData}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"agent": {Token: token.Status.Token}},
		Contexts:       map[string]*clientcmdapi.Context{"hub": {Cluster: "hub", AuthInfo: "agent"}},
		CurrentContext: "hub",
	})
	if err != nil {
		t.Fatal(err)
	}
	// The member's part: the namespace and the Secret the chart mounts,
	// then the chart.
	env.Create(t, ctx, member.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}})
	env.Create(t, ctx, member.Client, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "ctrlmesh-hub-kubeconfig"},
		Data:       map[string][]byte{"kubeconfig": kubeconfig},
	})
	repository, tag, _ := strings.Cut(agentImage, ":")
	proxyRepository, proxyTag, _ := strings.Cut(proxyImage, ":")
	installed := time.Now()
	helmInstall(t, ctx, helm, member.KubeconfigPath, agentNamespace, filepath.Join(root, "deploy", "charts", "ctrlmesh-agent"),
		"clusterName="+cluster, "image.repository="+repository, "image.tag="+tag, "image.pullPolicy=Never",
		"proxyImage.repository="+proxyRepository, "proxyImage.tag="+proxyTag, "replicas="+strconv.Itoa(replicas),
		// The test clusters start with ctrlmesh's CRDs, as a cluster
		// whose CRDs are managed apart from the chart.
		"crds.install=false")
	t.Logf("%s: helm install returned after %s", cluster, time.Since(installed).Round(time.Millisecond))
	env.Eventually(t, 4*time.Minute, fmt.Sprintf("%s: the agent's %d pods Running and Ready on %s", cluster, replicas, member.Node.Name), func() error {
		var pods corev1.PodList
		if err := member.Client.List(ctx, &pods, client.InNamespace(agentNamespace), client.MatchingLabels{"app.kubernetes.io/name": "ctrlmesh-agent"}); err != nil {
			return err
		}
		var states []string
		ready := 0
		for _, p := range pods.Items {
			states = append(states, fmt.Sprintf("%s on %q: %s", p.Name, p.Spec.NodeName, podState(&p)))
			if p.Spec.NodeName == member.Node.Name && p.Status.Phase == corev1.PodRunning &&
				len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready {
				ready++
			}
		}
		if ready != replicas {
			return fmt.Errorf("%d of %d ready: %v", ready, replicas, states)
		}
		return nil
	})
	return installed
}

// operatorRBAC are the demo operator's ServiceAccount name in namespace and
// its rights, as a user shards it: its own (ConfigMaps, its Lease, Events)
// and the shipped proxy ClusterRole (deploy/rbac/proxy.yaml) bound in its
// namespace only, with the namespace.
func operatorRBAC(t *testing.T, root, namespace, name string) []client.Object {
	t.Helper()
	proxyRole := shippedProxyRole(t, root)
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}}
	return []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}},
		proxyRole,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: proxyRole.Name}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: proxyRole.Name}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
			{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}},
	}
}

// shippedProxyRole is the proxy's ClusterRole as ctrlmesh ships it
// (deploy/rbac/proxy.yaml), which every operator's ServiceAccount is bound
// to for its sidecar.
func shippedProxyRole(t *testing.T, root string) *rbacv1.ClusterRole {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "deploy", "rbac", "proxy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var proxyRole rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(data, &proxyRole); err != nil {
		t.Fatal(err)
	}
	return &proxyRole
}
