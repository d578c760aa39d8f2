package realpods_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/images"
)

// agentImage is the image of cmd/ctrlmesh-agent this test builds and
// imports into the member's node.
const agentImage = "ctrlmesh.test/ctrlmesh-agent:test"

// TestAgentChartOnRealNode installs the agent as a user would: the hub
// admin makes the member's identity on the hub (its execution namespace,
// ServiceAccount agent-<member> and membership.AgentHubRBAC) and hands its
// token over as a kubeconfig Secret; the agent chart is installed into the
// member with the real helm, with an image of ctrlmesh-agent built here.
// The kubelet runs the chart's Deployment: its pods run Ready (the
// kubelet's probes reach them), with the member's in-cluster config and
// the chart's RBAC only, and the agent joins the hub: its ManagedCluster
// carries the agent's claims (not accepted: that is the hub's), and an
// agent pod renews the member's heartbeat Lease on the hub. The member's
// API server calls the agent's injection webhook in its pods. Its step
// InjectedSidecar then runs an operator with the injected proxy
// (checkInjectedSidecar).
func TestAgentChartOnRealNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	helm := filepath.Join(root, "bin", "helm")
	if dir := os.Getenv(env.AssetsEnv); dir != "" {
		helm = filepath.Join(dir, "helm")
	}
	if err := controlplane.CheckBinaries(filepath.Dir(helm), "run 'make tools' to build it from source", "helm"); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	// The hub has a node too: its API server then listens where pods
	// reach it (the host end of a node's veth), as a hub in a cluster does.
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub", Node: true}, {Name: "member1", Node: true}}})
	if err != nil {
		t.Fatal(err)
	}
	hub, member := fleet.Cluster("hub"), fleet.Cluster("member1")
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	t.Logf("hub and member1 with their nodes started in %s", time.Since(start).Round(time.Millisecond))

	built := time.Now()
	// The agent's image, the proxy's it injects, and the demo operator's.
	for _, img := range []struct {
		name, pkg, user string
	}{{agentImage, "./cmd/ctrlmesh-agent", ""}, {proxyImage, "./cmd/ctrlmesh-proxy", "65532"}, {operatorImage, "./scenarios/demo-operator", ""}} {
		file := "/" + filepath.Base(img.pkg)
		bin := filepath.Join(t.TempDir(), filepath.Base(img.pkg))
		if err := images.BuildStatic(ctx, root, img.pkg, bin); err != nil {
			t.Fatal(err)
		}
		if err := member.Node.ImportImages(ctx, images.Image{Name: img.name, Files: map[string]string{file: bin}, Entrypoint: []string{file}, User: img.user}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("images %s, %s and %s built and imported in %s", agentImage, proxyImage, operatorImage, time.Since(built).Round(time.Millisecond))

	// The hub admin's part, then the member's (installAgent): the
	// chart's two replicas run Ready on the member's node.
	const cluster = "member1"
	installed := installAgent(t, ctx, helm, root, hub, member, cluster, 2)
	t.Logf("the agent's 2 pods Running and Ready %s after helm install", time.Since(installed).Round(time.Second))

	// The agent joined: its ManagedCluster on the hub, with its claims.
	var mc clusterv1.ManagedCluster
	env.Eventually(t, 2*time.Minute, "the agent's ManagedCluster on the hub", func() error {
		if err := hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
			return err
		}
		if membership.ClaimedAgentNamespace(&mc) != agentNamespace {
			return fmt.Errorf("claims %+v, want the agent namespace %q", mc.Status.ClusterClaims, agentNamespace)
		}
		return nil
	})
	if mc.Spec.HubAcceptsClient {
		t.Error("the ManagedCluster is accepted: only the hub or its admin accepts a member, never the agent")
	}
	// And it keeps a heartbeat: its Lease on the hub, held by an agent pod,
	// renewed again and again.
	key := client.ObjectKey{Namespace: ctrlmeshv1alpha1.ClusterNamespace(cluster), Name: ctrlmeshv1alpha1.HeartbeatLeaseName}
	var first, lease coordinationv1.Lease
	env.Eventually(t, 2*time.Minute, "the agent's heartbeat Lease", func() error {
		if err := hub.Client.Get(ctx, key, &first); err != nil {
			return err
		}
		if first.Spec.RenewTime == nil {
			return fmt.Errorf("lease %+v not renewed", first.Spec)
		}
		return nil
	})
	env.Eventually(t, 2*time.Minute, "the agent's heartbeat Lease renewed again", func() error {
		if err := hub.Client.Get(ctx, key, &lease); err != nil {
			return err
		}
		if lease.Spec.RenewTime == nil || !lease.Spec.RenewTime.After(first.Spec.RenewTime.Time) {
			return fmt.Errorf("lease renewed at %v, as before", lease.Spec.RenewTime)
		}
		return nil
	})

	// The agent's injection webhook (failurePolicy Fail) is reachable from
	// the member's API server, which calls it at the agent pods' addresses:
	// a pod that asks for the proxy is admitted (a dry run: nothing runs).
	env.Eventually(t, 2*time.Minute, "the agent's injection webhook configuration", func() error {
		var configs admissionregistrationv1.MutatingWebhookConfigurationList
		if err := member.Client.List(ctx, &configs); err != nil {
			return err
		}
		for _, c := range configs.Items {
			for _, w := range c.Webhooks {
				if w.ObjectSelector != nil && w.ObjectSelector.MatchLabels[ctrlmeshv1alpha1.EnableProxyLabel] == "true" {
					return nil
				}
			}
		}
		return fmt.Errorf("none among %d MutatingWebhookConfigurations", len(configs.Items))
	})
	asking := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "asks-for-the-proxy", Labels: map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: agentImage}}},
	}
	if err := member.Client.Create(ctx, asking, client.DryRunAll); err != nil {
		t.Errorf("a pod asking for the proxy was not admitted (the API server could not call the agent's webhook?): %v", err)
	}

	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	t.Logf("agent of %s joined the hub %s after helm install: ManagedCluster %s with its claims, Lease %s/%s held by %q renewed at %s and %s",
		cluster, time.Since(installed).Round(time.Second), mc.Name, lease.Namespace, lease.Name, holder,
		first.Spec.RenewTime.Format(time.TimeOnly), lease.Spec.RenewTime.Format(time.TimeOnly))
	if !strings.HasPrefix(holder, "ctrlmesh-agent-") {
		t.Errorf("the Lease's holder is %q, want an agent pod (ctrlmesh-agent-...)", holder)
	}

	// Then an operator sharded on this member: its injected sidecar run by
	// the kubelet.
	t.Run("InjectedSidecar", func(t *testing.T) { checkInjectedSidecar(t, ctx, hub, member, cluster) })
}

// helmInstall installs chart as release ctrlmesh-agent into namespace of
// the cluster of kubeconfig, with --set values sets, and waits for it.
func helmInstall(t *testing.T, ctx context.Context, helm, kubeconfig, namespace, chart string, sets ...string) {
	t.Helper()
	dir := t.TempDir()
	args := []string{"install", "ctrlmesh-agent", chart, "--kubeconfig", kubeconfig, "--namespace", namespace}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(dir, "config"),
		"HELM_CACHE_HOME="+filepath.Join(dir, "cache"), "HELM_DATA_HOME="+filepath.Join(dir, "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v: %s", strings.Join(args, " "), err, out.String())
	}
}
