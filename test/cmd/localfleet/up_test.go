package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// syncBuffer is a bytes.Buffer the command writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestUpHealsAKilledProcess runs localfleet up (make local-up) on real
// nodes and, once it stays up, kills the operator's process in one of its
// pods by hand, as a user trying chaos would: kill -9 of the container's
// PID, found by its cgroup. The kubelet restarts the container, the proxy
// sidecar keeps running, the pod is Ready again and keeps its shards, the
// fleet prints the restart and stays up; Ctrl-C (the context) ends it
// cleanly. No pod of the fleet runs with admin credentials.
func TestUpHealsAKilledProcess(t *testing.T) {
	binDir := demoBinDir(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	cmd := newRootCommand()
	cmd.SetArgs([]string{"up", "--bin-dir", binDir})
	cmd.SetOut(out)
	cmd.SetErr(out)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("up after Ctrl-C: %v", err)
			}
		case <-time.After(3 * time.Minute):
			t.Error("up did not stop within 3 minutes of Ctrl-C")
		}
		t.Logf("output:\n%s", out.String())
	}()

	// Up: its kubeconfigs printed.
	env.Eventually(t, 12*time.Minute, "localfleet up to stay up", func() error {
		select {
		case err := <-done:
			t.Fatalf("up ended: %v", err)
		default:
		}
		if !strings.Contains(out.String(), "The fleet stays up until Ctrl-C") {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	clients := map[string]client.Client{}
	for _, name := range append([]string{localfleet.HubName}, demoMembers...) {
		m := regexp.MustCompile(`(?m)^  ` + name + `\s+(/\S+\.kubeconfig)$`).FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("no kubeconfig of %s printed", name)
		}
		clients[name] = kubeconfigClient(t, m[1])
	}

	member := demoMembers[0]
	pods, err := localfleet.PodsOf(ctx, clients[member], demoNamespace, stableLabels)
	if err != nil || len(pods) != podsPerMember {
		t.Fatalf("the operator's pods in %s: %d, %v", member, len(pods), err)
	}
	victim := pods[0]
	id := localfleet.ContainerID(&victim, "manager")
	pid, err := containerPID(id)
	if err != nil {
		t.Fatal(err)
	}
	proxyID := localfleet.ContainerID(&victim, ctrlmeshv1alpha1.ProxyContainerName)
	mem, err := localfleet.ContainerMemory(proxyID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the proxy sidecar of %s: cgroup working set %.1f MiB, usage %.1f MiB, RSS %.1f MiB", victim.Name, mib(mem.WorkingSet), mib(mem.Usage), mib(mem.RSS))
	restarts := func(p *corev1.Pod, name string) int32 {
		for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			if s.Name == name {
				return s.RestartCount
			}
		}
		return -1
	}
	before := restarts(&victim, "manager")
	t.Logf("killing the manager of pod %s/%s on %s: PID %d (container %s)", member, victim.Name, victim.Spec.NodeName, pid, id)
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	// The kubelet restarts it in the same pod, with the same proxy.
	var healed corev1.Pod
	env.Eventually(t, 3*time.Minute, "the killed manager restarted and the pod Ready", func() error {
		if err := clients[member].Get(ctx, client.ObjectKeyFromObject(&victim), &healed); err != nil {
			return err
		}
		if restarts(&healed, "manager") <= before || !localfleet.PodReady(&healed) {
			return fmt.Errorf("%s", localfleet.PodState(&healed))
		}
		return nil
	})
	t.Logf("pod %s Ready again %s after the kill: %s", victim.Name, time.Since(killed).Round(time.Millisecond), localfleet.PodState(&healed))
	if got := localfleet.ContainerID(&healed, ctrlmeshv1alpha1.ProxyContainerName); got != proxyID {
		t.Errorf("the proxy container changed from %s to %s: only the killed container restarts", proxyID, got)
	}
	// The ShardingConfig is Ready with the pod still placed: its shard
	// lease outlived the restart, or its buckets came back.
	env.Eventually(t, 2*time.Minute, "the ShardingConfig Ready with "+victim.Name+" placed", func() error {
		var sc ctrlmeshv1alpha1.ShardingConfig
		if err := clients[localfleet.HubName].Get(ctx, client.ObjectKey{Namespace: demoNamespace, Name: demoName}, &sc); err != nil {
			return err
		}
		if sc.Status.ReadyShards != sc.Status.Shards || !slices.Contains(placedPods(&sc, member, false), victim.Name) {
			return fmt.Errorf("%d of %d shards ready, %s placed %v", sc.Status.ReadyShards, sc.Status.Shards, member, placedPods(&sc, member, false))
		}
		return nil
	})
	// The fleet noticed, and stays up.
	env.Eventually(t, time.Minute, "up to print the restart", func() error {
		pattern := `pod ` + member + `/` + victim.Name + ` on ` + victim.Spec.NodeName + `: Running, ctrlmesh-proxy ready=true restarts=0, manager ready=\w+ restarts=` + strconv.Itoa(int(before+1))
		if !regexp.MustCompile(pattern).MatchString(out.String()) {
			return fmt.Errorf("no line matching %q", pattern)
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("up ended after the kill: %v", err)
	default:
	}

	checkNoAdminCredentials(t, ctx, clients)
}

// checkNoAdminCredentials checks every pod of every cluster: its
// ServiceAccount is bound to no cluster-admin, and the only Secrets it
// mounts are the agent's hub kubeconfig and webhook certificate.
func checkNoAdminCredentials(t *testing.T, ctx context.Context, clients map[string]client.Client) {
	t.Helper()
	allowed := []string{"ctrlmesh-hub-kubeconfig", "ctrlmesh-agent-webhook-cert"}
	checked := 0
	for cluster, c := range clients {
		var bindings rbacv1.ClusterRoleBindingList
		if err := c.List(ctx, &bindings); err != nil {
			t.Fatal(err)
		}
		var admins []rbacv1.Subject
		for _, b := range bindings.Items {
			if b.RoleRef.Name == "cluster-admin" {
				admins = append(admins, b.Subjects...)
			}
		}
		var pods corev1.PodList
		if err := c.List(ctx, &pods); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			checked++
			if slices.ContainsFunc(admins, func(s rbacv1.Subject) bool {
				return (s.Kind == rbacv1.ServiceAccountKind && s.Namespace == p.Namespace && s.Name == p.Spec.ServiceAccountName) ||
					(s.Kind == rbacv1.GroupKind && (s.Name == "system:serviceaccounts" || s.Name == "system:serviceaccounts:"+p.Namespace))
			}) {
				t.Errorf("pod %s/%s/%s runs as ServiceAccount %s, bound to cluster-admin", cluster, p.Namespace, p.Name, p.Spec.ServiceAccountName)
			}
			for _, v := range p.Spec.Volumes {
				if v.Secret != nil && !slices.Contains(allowed, v.Secret.SecretName) {
					t.Errorf("pod %s/%s/%s mounts Secret %s", cluster, p.Namespace, p.Name, v.Secret.SecretName)
				}
			}
		}
	}
	if checked == 0 {
		t.Error("no pods to check")
	}
}

// containerPID finds the host PID of the container with CRI id as a user
// would by hand: the process whose cgroup path names it.
func containerPID(id string) (int, error) {
	if id == "" {
		return 0, fmt.Errorf("no container id")
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(data), "/"+id+"\n") {
			continue
		}
		// The container's first process, PID 1 of its PID namespace: the
		// entrypoint.
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if pids, ok := strings.CutPrefix(line, "NSpid:\t"); ok && strings.HasSuffix(pids, "\t1") {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no process of container %s", id)
}

// kubeconfigClient is a client of the cluster of a kubeconfig file.
func kubeconfigClient(t *testing.T, path string) client.Client {
	t.Helper()
	config, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
