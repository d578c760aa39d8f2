package localfleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/images"
)

// The images of a fleet on real nodes, built from the checkout and
// imported into every node: what deploy/docker builds, without Docker.
const (
	HubImage      = "ctrlmesh.test/ctrlmesh-hub:local"
	AgentImage    = "ctrlmesh.test/ctrlmesh-agent:local"
	ProxyImage    = "ctrlmesh.test/ctrlmesh-proxy:local"
	OperatorImage = "ctrlmesh.test/demo-operator:local"
)

// nodeImages are the images, with the package each one's binary is built
// from and the user it runs as (the proxy's as deploy/docker's: the
// injected container asks for runAsNonRoot; the charts set their own).
var nodeImages = []struct{ name, pkg, user string }{
	{HubImage, "./cmd/ctrlmesh-hub", ""},
	{AgentImage, "./cmd/ctrlmesh-agent", ""},
	{ProxyImage, "./cmd/ctrlmesh-proxy", "65532"},
	{OperatorImage, "./scenarios/demo-operator", ""},
}

// NodeOptions for StartNodes.
type NodeOptions struct {
	// BinDir holds kube-apiserver, etcd, the node components and helm
	// (make tools) and ctrlmeshctl (make build).
	BinDir string
	// CRDDirs are installed into every cluster; see controlplane.CRDDirs.
	CRDDirs []string
	// WorkDir receives the kubeconfigs, the nodes' directories and logs. It
	// must exist; Stop leaves it.
	WorkDir string
	// Members are the member clusters' names, DNS labels.
	Members []string
	// MemberFeatureGates are turned on in the members' API servers.
	MemberFeatureGates []string
}

// NodeFleet is a local fleet whose clusters each have a real node: the hub
// and the agents run there as pods of their Helm charts, the operators as
// Deployments whose proxy the agent injects; nothing runs with admin
// credentials but the clusters' own controllers. InstallHub, Join and
// DeployOperator bring it up as a user would.
type NodeFleet struct {
	Hub *controlplane.Cluster
	// Members by name.
	Members map[string]*controlplane.Cluster
	// WorkDir holds the kubeconfigs (<cluster>.kubeconfig) and the nodes'
	// directories (<cluster>-node, with their logs).
	WorkDir string

	root, binDir string
	members      []string
	group        *controlplane.Group
}

// StartNodes checks the binaries, starts the hub and the members, each
// with its node, builds the images of ctrlmesh's binaries and the demo
// operator and imports them into every node. Nothing of ctrlmesh runs yet.
func StartNodes(ctx context.Context, opts NodeOptions) (*NodeFleet, error) {
	if err := controlplane.CheckBinaries(opts.BinDir, "run 'make tools' to build them from source", "kube-apiserver", "etcd", "helm",
		controlplane.KubeletBinary, controlplane.KubeControllerManagerBinary, controlplane.KubeSchedulerBinary, controlplane.KubeProxyBinary); err != nil {
		return nil, err
	}
	if err := controlplane.CheckBinaries(opts.BinDir, "run 'make build'", "ctrlmeshctl"); err != nil {
		return nil, err
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, fmt.Errorf("localfleet: %w", err)
	}
	// The images' binaries build while the clusters start.
	binaries := filepath.Join(opts.WorkDir, "images")
	built := make(chan error, 1)
	go func() { built <- buildImageBinaries(ctx, root, binaries) }()

	specs := []controlplane.Spec{{Name: HubName, Node: true}}
	for _, m := range opts.Members {
		specs = append(specs, controlplane.Spec{Name: m, FeatureGates: opts.MemberFeatureGates, Node: true})
	}
	group, err := controlplane.Start(ctx, controlplane.Options{Clusters: specs, AssetsDir: opts.BinDir, CRDDirs: opts.CRDDirs, WorkDir: opts.WorkDir})
	if err != nil {
		return nil, errors.Join(err, <-built)
	}
	f := &NodeFleet{Hub: group.Cluster(HubName), Members: map[string]*controlplane.Cluster{}, WorkDir: opts.WorkDir,
		root: root, binDir: opts.BinDir, members: opts.Members, group: group}
	for _, m := range opts.Members {
		f.Members[m] = group.Cluster(m)
	}
	if err := <-built; err != nil {
		return nil, errors.Join(err, group.Stop())
	}
	var wg sync.WaitGroup
	errs := make([]error, len(group.Clusters))
	for i, c := range group.Clusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, img := range nodeImages {
				file := "/" + filepath.Base(img.pkg)
				if err := c.Node.ImportImages(ctx, images.Image{Name: img.name, Files: map[string]string{file: filepath.Join(binaries, filepath.Base(img.pkg))},
					Entrypoint: []string{file}, User: img.user}); err != nil {
					errs[i] = fmt.Errorf("localfleet: importing %s into %s: %w", img.name, c.Node.Name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, group.Stop())
	}
	return f, nil
}

// buildImageBinaries builds the static binaries of the images into dir.
func buildImageBinaries(ctx context.Context, root, dir string) error {
	for _, img := range nodeImages {
		if err := images.BuildStatic(ctx, root, img.pkg, filepath.Join(dir, filepath.Base(img.pkg))); err != nil {
			return fmt.Errorf("localfleet: %w", err)
		}
	}
	return nil
}

// Nodes are the nodes of the fleet's clusters, the hub's first.
func (f *NodeFleet) Nodes() []*controlplane.Node {
	nodes := []*controlplane.Node{f.Hub.Node}
	for _, m := range f.members {
		nodes = append(nodes, f.Members[m].Node)
	}
	return nodes
}

// ColdStart is the longest time a member's node took from its API server
// serving to Ready.
func (f *NodeFleet) ColdStart() time.Duration {
	var longest time.Duration
	for _, m := range f.members {
		longest = max(longest, f.Members[m].Node.ColdStart)
	}
	return longest
}

// InstallHub installs the hub chart into the hub cluster with helm, as the
// README's "Install on real clusters" step 2 does (the members of the
// fleet may join, auto-accepted), with the hub's image and one replica,
// and waits until the hub's pod is Ready. The clusters were started with
// the CRDs, so the chart installs none.
func (f *NodeFleet) InstallHub(ctx context.Context) error {
	repository, tag, _ := strings.Cut(HubImage, ":")
	args := []string{"install", "ctrlmesh-hub", filepath.Join(f.root, "deploy", "charts", "ctrlmesh-hub"),
		"--kubeconfig", f.Hub.KubeconfigPath, "--namespace", namespace, "--create-namespace",
		"--set", "image.repository=" + repository, "--set", "image.tag=" + tag, "--set", "image.pullPolicy=Never",
		"--set", "replicas=1", "--set", "podDisruptionBudget.enabled=false", "--set", "crds.shardingConfig=false",
		"--set", "crds.circuitBreaker=false", "--set", "crds.faultInjection=false"}
	for i, m := range f.members {
		args = append(args, "--set", fmt.Sprintf("members[%d].name=%s", i, m))
	}
	if err := f.command(ctx, filepath.Join(f.binDir, "helm"), args...); err != nil {
		return err
	}
	return f.WaitReady(ctx, f.Hub, namespace, map[string]string{"app.kubernetes.io/name": "ctrlmesh-hub"}, 1, 3*time.Minute)
}

// JoinCommand is the ctrlmeshctl join that installs member's agent with its
// chart (one replica; the images of the fleet), as a user joins a member.
func (f *NodeFleet) JoinCommand(member string) []string {
	repository, tag, _ := strings.Cut(AgentImage, ":")
	proxyRepository, proxyTag, _ := strings.Cut(ProxyImage, ":")
	return []string{filepath.Join(f.binDir, "ctrlmeshctl"), "join", "--hub-kubeconfig", f.Hub.KubeconfigPath,
		"--kubeconfig", f.Members[member].KubeconfigPath, "--cluster-name", member, "--timeout", "5m",
		"--agent-chart", filepath.Join(f.root, "deploy", "charts", "ctrlmesh-agent"), "--helm", filepath.Join(f.binDir, "helm"),
		"--set", "image.repository=" + repository, "--set", "image.tag=" + tag, "--set", "image.pullPolicy=Never",
		"--set", "proxyImage.repository=" + proxyRepository, "--set", "proxyImage.tag=" + proxyTag,
		"--set", "replicas=1", "--set", "podDisruptionBudget.enabled=false", "--set", "crds.install=false"}
}

// Join runs JoinCommand for member; it returns once the agent has joined
// the hub, its pod Ready.
func (f *NodeFleet) Join(ctx context.Context, member string) error {
	join := f.JoinCommand(member)
	if err := f.command(ctx, join[0], join[1:]...); err != nil {
		return err
	}
	return f.WaitReady(ctx, f.Members[member], namespace, map[string]string{"app.kubernetes.io/name": "ctrlmesh-agent"}, 1, 3*time.Minute)
}

// command runs a command, its output in the error.
func (f *NodeFleet) command(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("localfleet: %s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, out.String())
	}
	return nil
}

// OperatorRBAC is what the demo operator's pods in namespace of a member
// run with: the ServiceAccount name, bound to the operator's own rights
// (its ConfigMaps, its leader Lease, Events) and, in namespace only, to
// the shipped proxy ClusterRole of deploy/rbac/proxy.yaml, which the
// injected proxy needs beyond them.
func (f *NodeFleet) OperatorRBAC(namespace, name string) ([]client.Object, error) {
	data, err := os.ReadFile(filepath.Join(f.root, "deploy", "rbac", "proxy.yaml"))
	if err != nil {
		return nil, fmt.Errorf("localfleet: %w", err)
	}
	var proxyRole rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(data, &proxyRole); err != nil {
		return nil, fmt.Errorf("localfleet: deploy/rbac/proxy.yaml: %w", err)
	}
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}}
	return []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}},
		&proxyRole,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: proxyRole.Name}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: proxyRole.Name}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
			{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}},
	}, nil
}

// OperatorDeployment is a Deployment of the demo operator in namespace of
// a member, its pods labeled labels and ctrlmesh.io/enable-proxy=true (the
// agent injects the proxy), running as ServiceAccount serviceAccount (see
// OperatorRBAC) with the fleet's short leader-election lease
// (OperatorLeaseDuration). Its selector is labels.
func OperatorDeployment(namespace, name, serviceAccount string, replicas int32, labels map[string]string) *appsv1.Deployment {
	podLabels := map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true"}
	for k, v := range labels {
		podLabels[k] = v
	}
	fieldEnv := func(name, field string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: field}}}
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec: corev1.PodSpec{
					ServiceAccountName: serviceAccount,
					// A deleted pod's operator releases nothing it would
					// not lose anyway: its shard lease expires.
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers: []corev1.Container{{
						Name: "manager", Image: OperatorImage, ImagePullPolicy: corev1.PullNever,
						// No webhooks (they need a certificate) and no metrics.
						Args: append([]string{"--webhook-port=0", "--metrics-addr=0", "--health-addr=:8081"}, operatorLeaderElectionFlags...),
						Env:  []corev1.EnvVar{fieldEnv("POD_NAME", "metadata.name"), fieldEnv("POD_NAMESPACE", "metadata.namespace")},
					}},
				},
			},
		},
	}
}

// WaitReady waits until want pods of namespace in cluster matching labels
// run with every container Ready (the injected proxy, a native sidecar,
// among them), and no more; a node component that exits fails it.
func (f *NodeFleet) WaitReady(ctx context.Context, cluster *controlplane.Cluster, namespace string, labels map[string]string, want int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		pods, err := PodsOf(ctx, cluster.Client, namespace, labels)
		ready := 0
		var states []string
		for _, p := range pods {
			if PodReady(&p) {
				ready++
			}
			states = append(states, p.Name+": "+PodState(&p))
		}
		if err == nil && ready == want && len(pods) == want {
			return nil
		}
		if nodeErr := f.Err(); nodeErr != nil {
			return nodeErr
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localfleet: waited %v for %d pods of %s in %s/%s Ready (%v): %v (logs in %s)", within, want, labels, cluster.Name, namespace,
				err, states, filepath.Join(cluster.Node.Dir, "pod-logs"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// PodsOf lists the pods of namespace matching labels, by name, leaving out
// those being deleted.
func PodsOf(ctx context.Context, c client.Client, namespace string, labels map[string]string) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := c.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels(labels)); err != nil {
		return nil, err
	}
	pods := slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return pods, nil
}

// PodReady tells whether the pod runs with every container, init
// (native sidecars) included, Ready.
func PodReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	statuses := slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses)
	return len(statuses) == len(pod.Spec.InitContainers)+len(pod.Spec.Containers) &&
		!slices.ContainsFunc(statuses, func(s corev1.ContainerStatus) bool { return !s.Ready })
}

// PodState is the pod's phase and its containers' readiness and restarts,
// for messages.
func PodState(pod *corev1.Pod) string {
	state := string(pod.Status.Phase)
	for _, s := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		state += fmt.Sprintf(", %s ready=%v restarts=%d", s.Name, s.Ready, s.RestartCount)
	}
	return state
}

// Err reports a node component (containerd, the kubelet, kube-proxy, the
// controllers) that exited. A pod that dies is no error: its kubelet and
// controllers bring it back.
func (f *NodeFleet) Err() error {
	var errs []error
	for _, n := range f.Nodes() {
		if err := n.Err(); err != nil {
			errs = append(errs, fmt.Errorf("localfleet: node %s: %w (logs in %s)", n.Name, err, n.Dir))
		}
	}
	return errors.Join(errs...)
}

// Stop stops the clusters, their nodes with them. WorkDir stays.
func (f *NodeFleet) Stop() error { return f.group.Stop() }

// Memory is a container's memory as its cgroup (v1, this machine's memory
// hierarchy) counts it, in bytes: the kubelet's working set (usage less
// the inactive file cache, what kubectl top and evictions go by), the
// usage, and the resident anonymous memory.
type Memory struct {
	WorkingSet, Usage, RSS int64
}

// ContainerMemory reads the memory of the container with CRI id (a
// status's containerID without "containerd://") from its cgroup, which a
// node's kubelet (cgroupfs driver) makes at
// <node cgroup>/kubepods[/<qos>]/pod<uid>/<id>.
func ContainerMemory(id string) (Memory, error) {
	var dirs []string
	for _, pattern := range []string{"/sys/fs/cgroup/memory/*/kubepods/pod*/", "/sys/fs/cgroup/memory/*/kubepods/*/pod*/"} {
		found, err := filepath.Glob(pattern + id)
		if err != nil {
			return Memory{}, err
		}
		dirs = append(dirs, found...)
	}
	if len(dirs) != 1 {
		return Memory{}, fmt.Errorf("localfleet: %d memory cgroups of container %s, want one: %v", len(dirs), id, dirs)
	}
	usage, err := os.ReadFile(filepath.Join(dirs[0], "memory.usage_in_bytes"))
	if err != nil {
		return Memory{}, fmt.Errorf("localfleet: %w", err)
	}
	var m Memory
	if _, err := fmt.Sscan(string(usage), &m.Usage); err != nil {
		return Memory{}, fmt.Errorf("localfleet: memory.usage_in_bytes of %s: %w", id, err)
	}
	stat, err := os.ReadFile(filepath.Join(dirs[0], "memory.stat"))
	if err != nil {
		return Memory{}, fmt.Errorf("localfleet: %w", err)
	}
	var inactiveFile int64
	for _, line := range strings.Split(string(stat), "\n") {
		var name string
		var value int64
		if _, err := fmt.Sscan(line, &name, &value); err != nil {
			continue
		}
		switch name {
		case "total_rss":
			m.RSS = value
		case "total_inactive_file":
			inactiveFile = value
		}
	}
	m.WorkingSet = max(0, m.Usage-inactiveFile)
	return m, nil
}

// ContainerID is the CRI id of the pod's container name (init or not),
// empty while it has none.
func ContainerID(pod *corev1.Pod, name string) string {
	for _, s := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		if s.Name == name {
			_, id, _ := strings.Cut(s.ContainerID, "://")
			return id
		}
	}
	return ""
}
