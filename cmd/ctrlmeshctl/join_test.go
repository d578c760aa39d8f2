package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

func TestJoinCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}, {Name: "member1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	hub, member := fleet.Cluster("hub"), fleet.Cluster("member1")

	run := func(args ...string) (string, error) {
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}

	if _, err := run("join", "--cluster-name", "member1"); err == nil || !strings.Contains(err.Error(), `required flag(s) "hub-kubeconfig" not set`) {
		t.Fatalf("join without the hub kubeconfig: %v", err)
	}
	if _, err := run("join", "--hub-kubeconfig", hub.KubeconfigPath, "--kubeconfig", member.KubeconfigPath, "--cluster-name", "Member_1"); err == nil {
		t.Fatal("join accepted an invalid cluster name")
	}

	out, err := run("join", "--hub-kubeconfig", hub.KubeconfigPath, "--kubeconfig", member.KubeconfigPath, "--cluster-name", "member1")
	if err != nil {
		t.Fatalf("join: %v\n%s", err, out)
	}
	if !strings.Contains(out, "cluster member1 is registered on the hub; it gets rules once the hub accepts it") {
		t.Errorf("join output: %q", out)
	}
	var mc clusterv1.ManagedCluster
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: "member1"}, &mc); err != nil {
		t.Fatal(err)
	}
	claims := map[string]string{}
	for _, c := range mc.Status.ClusterClaims {
		claims[c.Name] = c.Value
	}
	if claims[membership.ClaimKubeVersion] != "v1.36.3" || claims[membership.ClaimCtrlmeshVersion] == "" || mc.Spec.HubAcceptsClient {
		t.Errorf("ManagedCluster after join: claims %v, accepted %v", claims, mc.Spec.HubAcceptsClient)
	}

	// Once the hub accepts it, join says so.
	mc.Spec.HubAcceptsClient = true
	if err := hub.Client.Update(ctx, &mc); err != nil {
		t.Fatal(err)
	}
	out, err = run("join", "--hub-kubeconfig", hub.KubeconfigPath, "--kubeconfig", member.KubeconfigPath, "--cluster-name", "member1")
	if err != nil || !strings.Contains(out, "cluster member1 is registered on the hub and accepted") {
		t.Fatalf("join after acceptance: %v %q", err, out)
	}
}

// TestJoinPrintsTheAgentInstall: join --agent-chart --print builds the
// agent's hub kubeconfig from its token Secret on the hub and prints the
// install, touching neither cluster. (The install itself runs on real
// nodes in the local fleet's demo: test/cmd/localfleet TestDemo.)
func TestJoinPrintsTheAgentInstall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}, {Name: "member1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	hub, member := fleet.Cluster("hub"), fleet.Cluster("member1")
	t.Chdir(t.TempDir())
	run := func(args ...string) (string, error) {
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	args := []string{"join", "--hub-kubeconfig", hub.KubeconfigPath, "--kubeconfig", member.KubeconfigPath, "--cluster-name", "member1",
		"--agent-chart", "deploy/charts/ctrlmesh-agent", "--set", "image.tag=v1", "--print", "--timeout", "3s"}

	// No token Secret yet: join says where it looked.
	if _, err := run(args...); err == nil || !strings.Contains(err.Error(), "Secret ctrlmesh/agent-member1-token on the hub") {
		t.Fatalf("join without the token Secret: %v", err)
	}
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ctrlmesh"}})
	env.Create(t, ctx, hub.Client, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ctrlmesh", Name: "agent-member1-token", Annotations: map[string]string{corev1.ServiceAccountNameKey: "agent-member1"}},
		Type:       corev1.SecretTypeServiceAccountToken,
		Data:       map[string][]byte{corev1.ServiceAccountTokenKey: []byte("t0ken"), corev1.ServiceAccountRootCAKey: hub.Config.CAData},
	})
	out, err := run(args...)
	if err != nil {
		t.Fatalf("join --print: %v\n%s", err, out)
	}
	for _, want := range []string{
		"kubectl --kubeconfig " + member.KubeconfigPath + " -n ctrlmesh create secret generic ctrlmesh-hub-kubeconfig --from-file=kubeconfig=hub-member1.kubeconfig\n",
		"helm upgrade --install ctrlmesh-agent deploy/charts/ctrlmesh-agent --namespace ctrlmesh --set clusterName=member1 --set image.tag=v1 --kubeconfig " + member.KubeconfigPath + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("join --print printed\n%s\nwithout %q", out, want)
		}
	}
	config, err := clientcmd.LoadFromFile("hub-member1.kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	current := config.Contexts[config.CurrentContext]
	if server := config.Clusters[current.Cluster].Server; strings.TrimSuffix(server, "/") != strings.TrimSuffix(hub.Config.Host, "/") {
		t.Errorf("the agent's hub kubeconfig names server %q, want the hub's %q", server, hub.Config.Host)
	}
	if token := config.AuthInfos[current.AuthInfo].Token; token != "t0ken" {
		t.Errorf("the agent's hub kubeconfig has token %q, want the Secret's", token)
	}
	// Printing creates nothing in the member.
	if err := member.Client.Get(ctx, client.ObjectKey{Name: "ctrlmesh"}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace ctrlmesh in the member after join --print: %v", err)
	}
}
