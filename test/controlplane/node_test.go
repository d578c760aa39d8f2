package controlplane_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/images"
)

// TestRealNode runs a cluster with a real node (containerd, runc, kubelet,
// kube-controller-manager, kube-scheduler) and a Deployment of an image
// built and imported here: its pod runs through the kubelet, a container
// killed with SIGKILL is restarted by the kubelet, and a deleted pod is
// replaced by its ReplicaSet.
func TestRealNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "member1", Node: true}}})
	if err != nil {
		t.Fatal(err)
	}
	member := fleet.Cluster("member1")
	node := member.Node
	defer func() {
		if t.Failed() {
			logTails(t, node.Dir)
		}
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
		// Nothing of the node stays: no process of its containerd (the
		// shims name its socket), no mount under its directory.
		if leftover := processesWith(t, node.ContainerdAddress); len(leftover) > 0 {
			t.Errorf("processes of node %s left after Stop: %q", node.Name, leftover)
		}
		mounts, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(mounts), node.Dir) {
			t.Errorf("mounts under %s left after Stop", node.Dir)
		}
		checkNetworkRemoved(t, node)
	}()
	t.Logf("node %s Ready %s after its API server served (cluster started in %s)", node.Name,
		node.ColdStart.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	// An image of the pause program under another name: built and imported
	// here, with no registry.
	dir := t.TempDir()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "idle")
	if err := images.BuildStatic(ctx, root, "./test/images/pause", bin); err != nil {
		t.Fatal(err)
	}
	const image = "ctrlmesh.test/idle:1"
	if err := node.ImportImages(ctx, images.Image{Name: image, Files: map[string]string{"/bin/idle": bin}, Entrypoint: []string{"/bin/idle"}}); err != nil {
		t.Fatal(err)
	}

	labels := map[string]string{"app": "idle"}
	deployment := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "idle"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers:                    []corev1.Container{{Name: "idle", Image: image, ImagePullPolicy: corev1.PullNever}},
				},
			},
		},
	}
	env.Create(t, ctx, member.Client, deployment)

	first := runningPod(t, ctx, member.Client, node.Name, labels, "")
	t.Logf("pod %s Running on %s after %s", first.Name, first.Spec.NodeName, time.Since(first.CreationTimestamp.Time).Round(time.Second))
	if len(first.Spec.Volumes) == 0 || first.Spec.Volumes[0].Projected == nil {
		t.Errorf("pod %s has no projected service-account token volume: %+v", first.Name, first.Spec.Volumes)
	}

	// A crash: the container's process killed with SIGKILL; the kubelet
	// starts it again in the same pod.
	id := strings.TrimPrefix(first.Status.ContainerStatuses[0].ContainerID, "containerd://")
	pid, err := node.ContainerPID(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing container %s (pid %d): %v", id, pid, err)
	}
	killed := time.Now()
	env.Eventually(t, 2*time.Minute, "the kubelet restarts the killed container", func() error {
		var pod corev1.Pod
		if err := member.Client.Get(ctx, client.ObjectKeyFromObject(&first), &pod); err != nil {
			return err
		}
		s := pod.Status.ContainerStatuses[0]
		if s.RestartCount < 1 || s.State.Running == nil {
			return fmt.Errorf("restarts %d, state %+v", s.RestartCount, s.State)
		}
		if s.LastTerminationState.Terminated == nil || s.LastTerminationState.Terminated.ExitCode != 137 {
			return fmt.Errorf("last termination %+v, want exit code 137 (SIGKILL)", s.LastTerminationState.Terminated)
		}
		return nil
	})
	t.Logf("container restarted %s after kill -9", time.Since(killed).Round(time.Second))

	// A deleted pod: its ReplicaSet makes another, which the kubelet runs.
	if err := member.Client.Delete(ctx, &first); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	second := runningPod(t, ctx, member.Client, node.Name, labels, first.Name)
	t.Logf("pod %s replaced by %s, Running %s after the deletion", first.Name, second.Name, time.Since(deleted).Round(time.Second))
	if owner := metav1.GetControllerOf(&second); owner == nil || owner.Kind != "ReplicaSet" {
		t.Errorf("pod %s is controlled by %+v, want its ReplicaSet", second.Name, owner)
	}
}

// runningPod waits for a pod of labels other than except, Running and ready
// on node, and returns it.
func runningPod(t *testing.T, ctx context.Context, c client.Client, node string, labels map[string]string, except string) corev1.Pod {
	t.Helper()
	var found corev1.Pod
	env.Eventually(t, 3*time.Minute, "a pod Running on "+node, func() error {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels(labels)); err != nil {
			return err
		}
		var states []string
		for _, p := range pods.Items {
			if p.Name == except || p.DeletionTimestamp != nil {
				continue
			}
			state := fmt.Sprintf("%s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
			for _, c := range p.Status.Conditions {
				if c.Status != corev1.ConditionTrue {
					state += fmt.Sprintf(", %s: %s", c.Type, c.Message)
				}
			}
			states = append(states, state)
			if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning &&
				len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready {
				found = p
				return nil
			}
		}
		return fmt.Errorf("pods: %v", states)
	})
	return found
}

// processesWith lists the command lines of the processes that have s in
// one.
func processesWith(t *testing.T, s string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			found = append(found, strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return found
}

// TestNodeFailsClearlyWithoutBinaries: a cluster with a node whose
// components (kubelet, kube-controller-manager, kube-scheduler, kube-proxy) were not built fails with what to run, never a skip.
func TestNodeFailsClearlyWithoutBinaries(t *testing.T) {
	assets := t.TempDir()
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if err := os.WriteFile(filepath.Join(assets, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, err := controlplane.Start(context.Background(), controlplane.Options{
		Clusters: []controlplane.Spec{{Name: "member1", Node: true}}, AssetsDir: assets,
	})
	if err == nil {
		t.Fatal("a node started without kubelet, kube-controller-manager and kube-scheduler")
	}
	for _, want := range []string{controlplane.KubeletBinary, controlplane.KubeControllerManagerBinary, controlplane.KubeSchedulerBinary, controlplane.KubeProxyBinary, "make tools"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// logTails logs the last lines of the node's component logs, which Stop
// removes with the node's directory.
func logTails(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Log(err)
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		t.Logf("%s, last lines:\n%s", filepath.Base(path), strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
}

// TestKubeletsKeepTheirOwnDevicePluginSocket: two nodes on one machine,
// whose kubelets are restarted at once, each keep the device plugins'
// registration socket in their own directory and come back Ready. The
// kubelet binds that socket at a fixed host path whatever its --root-dir;
// shared, a restarting kubelet failed with "address already in use" (in
// CI, TestNoDoubleReconcileOnRealPods).
func TestKubeletsKeepTheirOwnDevicePluginSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "member1", Node: true}, {Name: "member2", Node: true}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			for _, name := range []string{"member1", "member2"} {
				logTails(t, fleet.Cluster(name).Node.Dir)
			}
		}
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	sockets := func() {
		t.Helper()
		for _, name := range []string{"member1", "member2"} {
			socket := filepath.Join(fleet.Cluster(name).Node.Dir, "device-plugins", "kubelet.sock")
			env.Eventually(t, time.Minute, "the kubelet of "+name+" serves its device plugin socket", func() error {
				info, err := os.Stat(socket)
				if err != nil {
					return err
				}
				if info.Mode()&os.ModeSocket == 0 {
					return fmt.Errorf("%s is %s, not a socket", socket, info.Mode())
				}
				return nil
			})
		}
	}
	sockets()
	var g errgroup.Group
	for _, name := range []string{"member1", "member2"} {
		cluster := fleet.Cluster(name)
		g.Go(func() error {
			took, err := cluster.Node.RestartKubelet(ctx, cluster, time.Second, 2*time.Minute)
			if err == nil {
				t.Logf("kubelet of %s restarted, node Ready %s after the kill", name, took.Round(time.Millisecond))
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	sockets()
}
