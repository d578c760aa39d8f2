package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

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
