package controlplane_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/images"
)

// inClusterImage is the image of test/images/incluster, a program that
// uses rest.InClusterConfig only.
const inClusterImage = "ctrlmesh.test/incluster:1"

// TestPodsReachTheirAPIServer runs two clusters with real nodes at once
// (two kube-proxies, each in its node's network namespace) and in each a
// pod of test/images/incluster under a ServiceAccount of its own: through
// the kubernetes Service's ClusterIP, with its token and the
// kube-root-ca.crt CA, the pod reads what the ServiceAccount's Role allows
// (its own cluster's ConfigMap) and is refused what it does not (the
// Nodes, 403 naming the ServiceAccount). A node's namespace routes no
// address outside this machine; the host routes each cluster's Service
// range into its node's namespace, where a ClusterIP dialled from the host
// reaches that cluster. After Stop, no network namespace, veth or Service
// route of the nodes remains.
func TestPodsReachTheirAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "member1", Node: true}, {Name: "member2", Node: true}}})
	if err != nil {
		t.Fatal(err)
	}
	members := []*env.Cluster{fleet.Cluster("member1"), fleet.Cluster("member2")}
	defer func() {
		if t.Failed() {
			for _, m := range members {
				logTails(t, m.Node.Dir)
			}
		}
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
		for _, m := range members {
			checkNetworkRemoved(t, m.Node)
		}
	}()
	t.Logf("two clusters with nodes started in %s", time.Since(start).Round(time.Millisecond))

	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "incluster")
	if err := images.BuildStatic(ctx, root, "./test/images/incluster", bin); err != nil {
		t.Fatal(err)
	}
	image := images.Image{Name: inClusterImage, Files: map[string]string{"/bin/incluster": bin}, Entrypoint: []string{"/bin/incluster"}}

	// Nothing a pod sends leaves this machine: its node's namespace routes
	// only the nodes' addresses (a route lookup, nothing is sent).
	for _, m := range members {
		out, err := exec.Command("ip", "-n", m.Node.NetworkNamespace, "route", "get", "192.0.2.1").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "unreachable") {
			t.Errorf("%s: node %s routes an outside address: %v: %s", m.Name, m.Node.Name, err, out)
		}
	}

	var wg sync.WaitGroup
	for _, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			checkInClusterPod(t, ctx, m, image)
		}()
	}
	wg.Wait()
	for i, m := range members {
		checkHostReachesClusterIP(t, ctx, m, members[1-i])
	}
}

// checkHostReachesClusterIP checks that a process on this machine (as the
// API server calling a webhook's Service) that dials a ClusterIP of m's
// cluster reaches that cluster through its node's namespace, where
// kube-proxy takes it to the Service's endpoints, instead of leaving the
// machine by the default route: the host's route to the kubernetes
// Service's ClusterIP goes through the node's veth, and a request there is
// served with m's certificate (verified with m's CA, for that IP) and m's
// ConfigMap. It dials nothing unless the route is the node's. In m's
// node's namespace, the Service range of other's cluster is unreachable.
func checkHostReachesClusterIP(t *testing.T, ctx context.Context, m, other *env.Cluster) {
	t.Helper()
	ip := m.Node.KubernetesServiceIP
	if !strings.HasPrefix(ip, "10.96.") || ip == other.Node.KubernetesServiceIP {
		t.Errorf("%s: kubernetes ClusterIP %s, want one of 10.96.0.0/16 of its own (%s has %s)", m.Name, ip, other.Name, other.Node.KubernetesServiceIP)
		return
	}
	// A route lookup: nothing is sent.
	out, err := exec.Command("ip", "route", "get", ip).CombinedOutput()
	if err != nil {
		t.Errorf("%s: ip route get %s: %v: %s", m.Name, ip, err, out)
		return
	}
	if f := strings.Fields(string(out)); !slices.Contains(f, "dev") || slices.Index(f, "dev")+1 >= len(f) || f[slices.Index(f, "dev")+1] != m.Node.NetworkNamespace {
		t.Errorf("%s: the host routes ClusterIP %s as %q, want through the veth %s of node %s (so not dialling it)", m.Name, ip, strings.TrimSpace(string(out)), m.Node.NetworkNamespace, m.Node.Name)
		return
	}
	route := strings.TrimSpace(strings.Split(string(out), "\n")[0])
	out, err = exec.Command("ip", "-n", m.Node.NetworkNamespace, "route", "get", other.Node.KubernetesServiceIP).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unreachable") {
		t.Errorf("%s: node %s routes ClusterIP %s of %s: %v: %s", m.Name, m.Node.Name, other.Node.KubernetesServiceIP, other.Name, err, out)
	}

	var whoami corev1.ConfigMap
	if err := m.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "whoami"}, &whoami); err != nil {
		t.Errorf("%s: %v", m.Name, err)
		return
	}
	cfg := rest.CopyConfig(m.Config)
	cfg.Host = "https://" + net.JoinHostPort(ip, "443")
	cfg.TLSClientConfig.ServerName = ""
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Errorf("%s: %v", m.Name, err)
		return
	}
	var got corev1.ConfigMap
	env.Eventually(t, time.Minute, m.Name+": the host reads the ConfigMap through ClusterIP "+ip, func() error {
		return c.Get(ctx, client.ObjectKeyFromObject(&whoami), &got)
	})
	if got.UID != whoami.UID || got.Data["cluster"] != m.Name {
		t.Errorf("%s: through ClusterIP %s the host read ConfigMap uid %s of cluster %q, want uid %s of %q", m.Name, ip, got.UID, got.Data["cluster"], whoami.UID, m.Name)
	}
	// The namespace's connection tracking saw the host's connection to the
	// ClusterIP DNATed by kube-proxy's rules to the API server and
	// masqueraded to the node's address, where the reply returns.
	apiServer, err := url.Parse(m.Config.Host)
	if err != nil {
		t.Errorf("%s: %v", m.Name, err)
		return
	}
	f := strings.Fields(route)
	nodeIP := f[slices.Index(f, "via")+1]
	reply := fmt.Sprintf("dport=443 src=%s dst=%s sport=%s ", apiServer.Hostname(), nodeIP, apiServer.Port())
	out, err = exec.Command("ip", "netns", "exec", m.Node.NetworkNamespace, "conntrack", "-L", "-p", "tcp", "--orig-dst", ip).CombinedOutput()
	if err != nil || !strings.Contains(string(out), reply) {
		t.Errorf("%s: node %s's connection tracking has no connection to %s with %q (DNATed to the API server, masqueraded): %v: %s", m.Name, m.Node.Name, ip, reply, err, out)
	}
	var tracked string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, reply) {
			tracked = strings.Join(strings.Fields(line), " ")
		}
	}
	t.Logf("%s: the host routes ClusterIP %s through %s (%s) and read its ConfigMap there; tracked as %s", m.Name, ip, m.Node.NetworkNamespace, route, tracked)
}

// checkInClusterPod runs the in-cluster pod on m's node and checks its
// report.
func checkInClusterPod(t *testing.T, ctx context.Context, m *env.Cluster, image images.Image) {
	if err := m.Node.ImportImages(ctx, image); err != nil {
		t.Error(err)
		return
	}
	// What the pod may read: this ConfigMap, by its ServiceAccount's Role.
	whoami := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "whoami"}, Data: map[string]string{"cluster": m.Name}}
	objects := []client.Object{
		whoami,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "incluster"}},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "incluster"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"whoami"}, Verbs: []string{"get"}}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "incluster"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "incluster"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: "incluster"}},
		},
	}
	for _, o := range objects {
		if err := m.Client.Create(ctx, o); err != nil {
			t.Errorf("%s: creating %T: %v", m.Name, o, err)
			return
		}
	}
	const allowed, forbidden = "/api/v1/namespaces/default/configmaps/whoami", "/api/v1/nodes"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "incluster"},
		Spec: corev1.PodSpec{
			ServiceAccountName:            "incluster",
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name: "incluster", Image: image.Name, ImagePullPolicy: corev1.PullNever,
				Args: []string{allowed, forbidden},
			}},
		},
	}
	if err := m.Client.Create(ctx, pod); err != nil {
		t.Errorf("%s: %v", m.Name, err)
		return
	}
	created := time.Now()
	var terminated *corev1.ContainerStateTerminated
	var last string
	for terminated == nil {
		if ctx.Err() != nil {
			t.Errorf("%s: pod %s did not terminate (last: %s)", m.Name, pod.Name, last)
			return
		}
		time.Sleep(time.Second)
		if err := m.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			last = err.Error()
			continue
		}
		last = fmt.Sprintf("%s on %q, %+v", pod.Status.Phase, pod.Spec.NodeName, pod.Status.ContainerStatuses)
		if len(pod.Status.ContainerStatuses) == 1 {
			terminated = pod.Status.ContainerStatuses[0].State.Terminated
		}
	}
	t.Logf("%s: pod %s on %s exited %d after %s:\n%s", m.Name, pod.Name, pod.Spec.NodeName, terminated.ExitCode,
		time.Since(created).Round(time.Second), terminated.Message)
	if pod.Spec.NodeName != m.Node.Name {
		t.Errorf("%s: pod ran on %q, want %q", m.Name, pod.Spec.NodeName, m.Node.Name)
	}
	if terminated.ExitCode != 0 {
		t.Errorf("%s: the pod could not ask its API server (exit code %d): %s", m.Name, terminated.ExitCode, terminated.Message)
		return
	}
	user := "system:serviceaccount:default:incluster"
	lines := strings.Split(strings.TrimSpace(terminated.Message), "\n")
	want := []struct{ prefix, contains string }{
		// The kubernetes Service's ClusterIP, which the node's kube-proxy
		// routes to the API server.
		{prefix: "host https://" + m.Node.KubernetesServiceIP + ":443"},
		// This cluster's ConfigMap, not the other's.
		{prefix: "GET " + allowed + " 200 " + string(whoami.UID)},
		{prefix: "GET " + forbidden + " 403 ", contains: `User "` + user + `" cannot list resource "nodes"`},
	}
	if len(lines) != len(want) {
		t.Errorf("%s: the pod reported %d lines, want %d: %q", m.Name, len(lines), len(want), lines)
		return
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w.prefix) || !strings.Contains(lines[i], w.contains) {
			t.Errorf("%s: line %d of the report is %q, want it to start with %q and contain %q", m.Name, i+1, lines[i], w.prefix, w.contains)
		}
	}
	if whoami.UID == "" {
		t.Errorf("%s: the ConfigMap has no uid", m.Name)
	}
}

// checkNetworkRemoved fails unless the node's network namespace and the
// host end of its veth pair are gone.
func checkNetworkRemoved(t *testing.T, n *controlplane.Node) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == n.NetworkNamespace {
			t.Errorf("network namespace %s of node %s left after Stop", n.NetworkNamespace, n.Name)
		}
	}
	if err := exec.Command("ip", "link", "show", n.NetworkNamespace).Run(); err == nil {
		t.Errorf("veth %s of node %s left after Stop", n.NetworkNamespace, n.Name)
	}
	// The host's route of the cluster's Service range went with the veth.
	out, err = exec.Command("ip", "route", "show", n.ServiceSubnet).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("route of Service range %s of node %s left after Stop: %v: %s", n.ServiceSubnet, n.Name, err, out)
	}
}
