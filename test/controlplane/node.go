package controlplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ctrlmesh/ctrlmesh/test/certs"
	"github.com/ctrlmesh/ctrlmesh/test/images"
)

// The Kubernetes components of a real node, built from source by 'make
// tools' from kube-apiserver's k8s.io/kubernetes.
const (
	KubeletBinary               = "kubelet"
	KubeControllerManagerBinary = "kube-controller-manager"
	KubeSchedulerBinary         = "kube-scheduler"
	KubeProxyBinary             = "kube-proxy"
)

// PauseImage is the sandbox image of every node's containerd: the pause
// program of test/images/pause, built and imported when the node starts.
const PauseImage = "ctrlmesh.test/pause:1"

// nodeExecutables are the programs of the Debian packages 'make
// node-packages' installs that a node runs, found in PATH; cniPlugins are
// the CNI plugins of its network, in cniBinDir.
var (
	nodeExecutables = []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "iptables", "ip", "nsenter", "unshare", "findmnt"}
	cniPlugins      = []string{"bridge", "host-local", "loopback"}
)

const cniBinDir = "/usr/lib/cni"

// nodeControllers are the kube-controller-manager controllers a node's
// cluster runs: the node lifecycle (which lifts the not-ready taint the
// kubelet registers the node with), what pods need before they start (each
// namespace's default ServiceAccount, the kube-root-ca.crt ConfigMap) and
// what brings a pod back (ReplicaSets, Deployments), with garbage
// collection, namespace deletion and EndpointSlices for Services.
var nodeControllers = []string{
	"node-lifecycle-controller",
	"serviceaccount-controller", "serviceaccount-token-controller", "root-ca-certificate-publisher-controller",
	"replicaset-controller", "deployment-controller", "garbage-collector-controller",
	"namespace-controller", "endpointslice-controller",
}

// Node is a real node of a cluster started with Spec.Node: a network
// namespace of its own where its containerd (runc, a CNI bridge) puts its
// pods and its kube-proxy routes Services, a kubelet registered as Name,
// and the cluster's kube-controller-manager and kube-scheduler.
type Node struct {
	// Name is the node's name, the cluster's name with "-node".
	Name string
	// Dir holds the node's state, configuration and logs (*.log).
	Dir string
	// ContainerdAddress is the socket of the node's containerd, for ctr
	// --address.
	ContainerdAddress string
	// NetworkNamespace is the node's network namespace (ip netns), where
	// its pods' bridge and its kube-proxy's iptables rules are.
	NetworkNamespace string
	// ServiceSubnet is the Service IP range of the node's cluster (one per
	// node, 10.96.<i>.0/24), which the host routes into NetworkNamespace,
	// and KubernetesServiceIP the ClusterIP of its kubernetes Service (the
	// range's first address), which pods reach their API server by
	// (KUBERNETES_SERVICE_HOST) and which the API server's serving
	// certificate covers.
	ServiceSubnet, KubernetesServiceIP string
	// ColdStart is how long the node took from its cluster's API server
	// serving to the Node Ready.
	ColdStart time.Duration

	containerd, kubelet, kubeProxy, controllerManager, scheduler *Process
	network                                                      *nodeNetwork
	// cgroupRoot is the cgroup the kubelet puts its pods under, one per
	// node so that no kubelet removes another's pods as orphans.
	cgroupRoot string
}

// checkNodeMachine fails unless this machine can run a node: root, the
// packages of 'make node-packages' and the binaries of 'make tools'.
func checkNodeMachine(assets string) error {
	if os.Geteuid() != 0 {
		return errors.New("a real node (Spec.Node) needs root: containerd, runc and the kubelet mount, make cgroups and network namespaces; run the tests as root (the README lists what the machine needs)")
	}
	var missing []string
	for _, name := range nodeExecutables {
		if _, err := exec.LookPath(name); err != nil {
			missing = append(missing, name)
		}
	}
	for _, name := range cniPlugins {
		if _, err := os.Stat(filepath.Join(cniBinDir, name)); err != nil {
			missing = append(missing, filepath.Join(cniBinDir, name))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("a real node needs %s: run 'make node-packages' (as root)", strings.Join(missing, ", "))
	}
	return CheckBinaries(assets, "run 'make tools' to build them from source", KubeletBinary, KubeControllerManagerBinary, KubeSchedulerBinary, KubeProxyBinary)
}

// prepareNodeAPIServer makes the kube-apiserver of a cluster with a node
// one its pods reach as in a real cluster: it listens on the host end of
// the node's veth pair and advertises it (the kubernetes Service's
// endpoint, which the node's kube-proxy routes the Service's ClusterIP to),
// with a serving certificate for that address, the ClusterIP and the
// Service's names, written into its certificate directory (where envtest
// then makes none; the service-account signer with it). Its flags are a
// real cluster's: the Node authorizer and NodeRestriction for the kubelet's
// credentials, the ServiceAccount admission plugin (which envtest turns
// off) so that pods get their service account's token, and aggregator
// routing.
func prepareNodeAPIServer(apiServer *envtest.APIServer, net *nodeNetwork) error {
	ca, err := certs.NewCA("ctrlmesh test API server CA")
	if err != nil {
		return err
	}
	serving := filepath.Join(apiServer.CertDir, "serving")
	if err := ca.WriteServing(serving, net.HostIP, net.KubernetesServiceIP, "localhost", "127.0.0.1",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"); err != nil {
		return err
	}
	// envtest's file names: it makes its own certificates unless
	// apiserver.crt exists, and reads the CA clients trust from
	// SecureServing.CA.
	for from, to := range map[string]string{certs.CertFile: "apiserver.crt", certs.KeyFile: "apiserver.key"} {
		if err := os.Rename(filepath.Join(serving, from), filepath.Join(apiServer.CertDir, to)); err != nil {
			return err
		}
	}
	signer, err := certs.NewCA("ctrlmesh test service-account signer")
	if err != nil {
		return err
	}
	if err := signer.WriteFiles(filepath.Join(apiServer.CertDir, "sa-signer.crt"), filepath.Join(apiServer.CertDir, "sa-signer.key")); err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	apiServer.SecureServing.CA = ca.PEM
	apiServer.SecureServing.Address = net.HostIP
	apiServer.SecureServing.Port = strconv.Itoa(port)

	args := apiServer.Configure()
	args.Set("advertise-address", net.HostIP)
	args.Set("service-cluster-ip-range", net.ServiceSubnet)
	args.Set("authorization-mode", "Node,RBAC")
	args.Set("enable-admission-plugins", "NodeRestriction")
	args.Disable("disable-admission-plugins")
	// The API server runs on the host, not in the node's namespace where
	// kube-proxy routes ClusterIPs: it calls webhooks and aggregated API
	// servers at their endpoints, pod addresses the host routes to the node,
	// without waiting for kube-proxy's rules. (A ClusterIP it dialled would
	// reach the node too: the host routes the Service range into the
	// node's namespace.)
	args.Set("enable-aggregator-routing", "true")
	return nil
}

// startNode starts the node of cluster c and waits until it is Ready. On
// error, what started is stopped.
func startNode(ctx context.Context, c *Cluster, net *nodeNetwork, assets, workDir string, timeout time.Duration) (n *Node, err error) {
	apiServing := time.Now()
	n = &Node{Name: c.Name + "-node", NetworkNamespace: net.Name, ServiceSubnet: net.ServiceSubnet, KubernetesServiceIP: net.KubernetesServiceIP, network: net}
	n.Dir, err = filepath.Abs(filepath.Join(workDir, c.Name+"-node"))
	if err != nil {
		return n, fmt.Errorf("starting the node of %q: %w", c.Name, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("starting the node of %q (logs in %s): %w", c.Name, n.Dir, err), n.stop())
		}
	}()
	for _, d := range []string{"containerd", "kubelet", "device-plugins", "pod-logs", "cni", "images"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return n, err
		}
	}
	if err := n.makeCgroupRoot(); err != nil {
		return n, err
	}
	if err := n.startContainerd(ctx); err != nil {
		return n, err
	}
	pause, err := n.buildPause(ctx)
	if err != nil {
		return n, err
	}
	if err := n.ImportImages(ctx, images.Image{Name: PauseImage, Files: map[string]string{"/pause": pause}, Entrypoint: []string{"/pause"}}); err != nil {
		return n, err
	}
	if err := n.startKubelet(c, assets); err != nil {
		return n, err
	}
	if err := n.startKubeProxy(c, assets); err != nil {
		return n, err
	}
	if err := n.startControllers(c, assets); err != nil {
		return n, err
	}
	if err := n.waitReady(ctx, c.Client, timeout); err != nil {
		return n, err
	}
	n.ColdStart = time.Since(apiServing)
	return n, nil
}

// makeCgroupRoot makes the node's cgroup in every cgroup v1 hierarchy (this
// machine's cgroups are hybrid), as the kubelet requires of a cgroupRoot.
func (n *Node) makeCgroupRoot() error {
	n.cgroupRoot = "/" + n.network.Name
	for _, dir := range cgroupHierarchies() {
		if err := os.MkdirAll(filepath.Join(dir, n.cgroupRoot), 0o755); err != nil {
			return fmt.Errorf("making the node's cgroup: %w", err)
		}
	}
	return nil
}

func cgroupHierarchies() []string {
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && e.Type()&os.ModeSymlink == 0 {
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return dirs
}

// startContainerd writes the node's containerd configuration and CNI
// network and starts containerd in the node's network namespace, where the
// CNI plugins then make its pods' bridge. The configuration carries what
// this kind of machine needs (docs/design.md §8): runc as
// io.containerd.runc.v2, oom_score_adj clamped (root lacks
// CAP_SYS_RESOURCE), the CNI plugins of Debian's package, and the pause
// image built here as the sandbox; its streaming server (exec, attach)
// listens on the node's address, which the kubelet reaches.
func (n *Node) startContainerd(ctx context.Context) error {
	dir := filepath.Join(n.Dir, "containerd")
	n.ContainerdAddress = filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q

[grpc]
  address = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  stream_server_address = %q
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), n.ContainerdAddress, PauseImage, n.network.NodeIP, cniBinDir, filepath.Join(n.Dir, "cni"))
	configPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return err
	}
	network := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": %q,
  "plugins": [{
    "type": "bridge",
    "bridge": %q,
    "isDefaultGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}
  }]
}
`, n.network.Name, nodeBridge, n.network.PodSubnet, filepath.Join(n.Dir, "cni-ipam"))
	if err := os.WriteFile(filepath.Join(n.Dir, "cni", "10-"+n.network.Name+".conflist"), []byte(network), 0o644); err != nil {
		return err
	}
	containerd, err := exec.LookPath("containerd")
	if err != nil {
		return err
	}
	command := n.network.Exec(containerd, "--config", configPath)
	if n.containerd, err = StartProcess("containerd", filepath.Join(n.Dir, "containerd.log"), false, command[0], command[1:]...); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := n.containerd.ExitError(); err != nil {
			return false, err
		}
		return exec.CommandContext(ctx, "ctr", "--address", n.ContainerdAddress, "version").Run() == nil, nil
	})
}

// ImportImages imports imgs into the node's containerd, where its kubelet
// finds them (pods name them with imagePullPolicy Never or IfNotPresent).
func (n *Node) ImportImages(ctx context.Context, imgs ...images.Image) error {
	for _, img := range imgs {
		dir, err := os.MkdirTemp(filepath.Join(n.Dir, "images"), "")
		if err != nil {
			return err
		}
		file := filepath.Join(dir, "image.tar")
		if err := images.WriteOCI(file, dir, img); err != nil {
			return err
		}
		if err := images.Import(ctx, n.ContainerdAddress, file); err != nil {
			return err
		}
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	return nil
}

// buildPause builds test/images/pause into the node's directory.
func (n *Node) buildPause(ctx context.Context) (string, error) {
	bin := filepath.Join(n.Dir, "images", "pause")
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return bin, images.BuildStatic(ctx, root, "./test/images/pause", bin)
}

// startKubelet starts the node's kubelet with credentials of its own, as
// system:node:<name> in system:nodes (which the Node authorizer serves),
// and a serving certificate; it authenticates its clients by the
// certificates of the cluster's client CA and asks the API server to
// authorize them.
//
// Its image garbage collection is off (imageGCHighThresholdPercent 100):
// the node's images are imported, from no registry, so an image it
// removed could never be pulled again. On a disk 90% full (a shared
// development machine) the kubelet removed the pause image, and no pod of
// the node started again.
func (n *Node) startKubelet(c *Cluster, assets string) error {
	user, err := c.env.AddUser(envtest.User{Name: "system:node:" + n.Name, Groups: []string{"system:nodes"}}, nil)
	if err != nil {
		return fmt.Errorf("credentials of the kubelet: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	kubeconfigPath := filepath.Join(n.Dir, "kubelet.kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return err
	}
	serving := filepath.Join(n.Dir, "kubelet-serving")
	if _, err := certs.WriteServing(serving, "127.0.0.1", "localhost", n.Name); err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %q
failSwapOn: false
containerRuntimeEndpoint: unix://%s
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzPort: 0
tlsCertFile: %q
tlsPrivateKeyFile: %q
podLogsDir: %q
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %q
authorization:
  mode: Webhook
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
imageGCHighThresholdPercent: 100
`, n.cgroupRoot, n.ContainerdAddress, port, filepath.Join(serving, certs.CertFile), filepath.Join(serving, certs.KeyFile),
		filepath.Join(n.Dir, "pod-logs"), filepath.Join(c.env.ControlPlane.APIServer.CertDir, "client-cert-auth-ca.crt"))
	configPath := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return err
	}
	command, err := n.kubeletMountNamespace(filepath.Join(assets, KubeletBinary),
		"--config="+configPath,
		"--kubeconfig="+kubeconfigPath,
		"--root-dir="+filepath.Join(n.Dir, "kubelet"),
		"--hostname-override="+n.Name,
		"--v=2",
	)
	if err != nil {
		return err
	}
	n.kubelet, err = StartProcess(KubeletBinary, filepath.Join(n.Dir, "kubelet.log"), false, command[0], command[1:]...)
	return err
}

// hostDevicePlugins is the device plugins' directory every kubelet uses
// whatever its --root-dir: the kubelet's registration socket and its
// checkpoint live there (pluginapi.KubeletSocket, a constant).
const hostDevicePlugins = "/var/lib/kubelet/device-plugins"

// kubeletMountNamespace is the command that runs the kubelet in a mount
// namespace of its own where the node's device-plugins directory is
// mounted over hostDevicePlugins. Several kubelets on one machine otherwise
// share that socket: one starting removes another's and binds it again, or
// fails with "address already in use" when a third bound it in between (a
// kubelet restarted in CI so). The kubelet's --root-dir is made a shared
// mount first, so what the kubelet mounts there (the pods' volumes)
// propagates to the host, where the node's containerd and runc see it; the
// mount namespace is created with the host's propagation unchanged (a
// private root), so the device-plugins mount stays the kubelet's.
func (n *Node) kubeletMountNamespace(kubelet string, args ...string) ([]string, error) {
	root := filepath.Join(n.Dir, "kubelet")
	if err := os.MkdirAll(hostDevicePlugins, 0o750); err != nil {
		return nil, fmt.Errorf("making the kubelets' device-plugins directory: %w", err)
	}
	if err := syscall.Mount(root, root, "", syscall.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind-mounting the kubelet's root directory %s: %w", root, err)
	}
	if err := syscall.Mount("", root, "", syscall.MS_SHARED, ""); err != nil {
		return nil, fmt.Errorf("making the kubelet's root directory %s a shared mount: %w", root, err)
	}
	// Where the host's root is a shared mount (systemd's default), the
	// bind mount would propagate back to the host: the mount holding the
	// device-plugins directory is made private in the kubelet's namespace
	// first (that mount only, not the root directory's bind mount).
	script := `mount --make-private "$(findmnt -n -o TARGET -T "$2")" && mount --bind "$1" "$2" && shift 2 && exec "$@"`
	return append([]string{"unshare", "--mount", "--propagation", "unchanged", "--", "sh", "-c", script, "sh",
		filepath.Join(n.Dir, "device-plugins"), hostDevicePlugins, kubelet}, args...), nil
}

// startKubeProxy starts the node's kube-proxy in the node's network
// namespace, as system:kube-proxy (which the bootstrap RBAC binds to
// system:node-proxier): it writes the iptables rules of that namespace that
// take the pods' connections to a Service's ClusterIP to its endpoints, the
// kubernetes Service's to the API server. It sets no conntrack limits (the
// host's, not a namespace's).
func (n *Node) startKubeProxy(c *Cluster, assets string) error {
	user, err := c.env.AddUser(envtest.User{Name: "system:kube-proxy"}, nil)
	if err != nil {
		return fmt.Errorf("credentials of kube-proxy: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	kubeconfigPath := filepath.Join(n.Dir, "kube-proxy.kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return err
	}
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
hostnameOverride: %q
mode: iptables
clusterCIDR: %q
healthzBindAddress: %q
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfigPath, n.Name, n.network.PodSubnet, n.network.NodeIP+":10256")
	configPath := filepath.Join(n.Dir, "kube-proxy.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return err
	}
	command := n.network.Exec(filepath.Join(assets, KubeProxyBinary), "--config="+configPath, "--v=2")
	n.kubeProxy, err = StartProcess(KubeProxyBinary, filepath.Join(n.Dir, "kube-proxy.log"), false, command[0], command[1:]...)
	return err
}

// startControllers starts the cluster's kube-controller-manager (its
// controllers nodeControllers) and kube-scheduler, with admin credentials,
// serving nothing: a cluster has one node here, so no leader election.
func (n *Node) startControllers(c *Cluster, assets string) error {
	apiServer := c.env.ControlPlane.APIServer
	rootCA := filepath.Join(n.Dir, "ca.crt")
	if err := os.WriteFile(rootCA, c.Config.CAData, 0o644); err != nil {
		return err
	}
	var err error
	n.controllerManager, err = StartProcess(KubeControllerManagerBinary, filepath.Join(n.Dir, "kube-controller-manager.log"), false,
		filepath.Join(assets, KubeControllerManagerBinary),
		"--kubeconfig="+c.KubeconfigPath,
		"--controllers="+strings.Join(nodeControllers, ","),
		"--service-account-private-key-file="+filepath.Join(apiServer.CertDir, "sa-signer.key"),
		"--root-ca-file="+rootCA,
		"--use-service-account-credentials=false",
		"--leader-elect=false",
		"--secure-port=0",
	)
	if err != nil {
		return err
	}
	n.scheduler, err = StartProcess(KubeSchedulerBinary, filepath.Join(n.Dir, "kube-scheduler.log"), false,
		filepath.Join(assets, KubeSchedulerBinary),
		"--kubeconfig="+c.KubeconfigPath,
		"--leader-elect=false",
		"--secure-port=0",
	)
	return err
}

// waitReady waits until the Node is Ready, failing early when a component
// exits.
func (n *Node) waitReady(ctx context.Context, c client.Client, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := n.Err(); err != nil {
			return false, err
		}
		var node corev1.Node
		if err := c.Get(ctx, client.ObjectKey{Name: n.Name}, &node); err != nil {
			last = err.Error()
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s: %s", cond.Status, cond.Message)
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		last = "no Ready condition"
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for node %s to be Ready (last: %s): %w", n.Name, last, err)
	}
	return nil
}

// Err reports a component of the node that exited.
func (n *Node) Err() error {
	var errs []error
	for _, p := range n.processes() {
		errs = append(errs, p.ExitError())
	}
	return errors.Join(errs...)
}

func (n *Node) processes() []*Process {
	return slices.DeleteFunc([]*Process{n.scheduler, n.controllerManager, n.kubeProxy, n.kubelet, n.containerd}, func(p *Process) bool { return p == nil })
}

// ContainerPID is the host PID of the main process of the container with
// CRI id (a pod status's containerID without "containerd://"), for killing
// it as a crash would.
func (n *Node) ContainerPID(ctx context.Context, id string) (int, error) {
	out, err := exec.CommandContext(ctx, "ctr", "--address", n.ContainerdAddress, "--namespace", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		return 0, fmt.Errorf("listing the tasks of node %s: %w", n.Name, err)
	}
	scanner := bufio.NewScanner(strings.NewReader(string(out)))
	for scanner.Scan() {
		// TASK PID STATUS
		fields := strings.Fields(scanner.Text())
		if len(fields) == 3 && fields[0] == id {
			return strconv.Atoi(fields[1])
		}
	}
	return 0, fmt.Errorf("no task %s on node %s", id, n.Name)
}

// stop stops the node and removes what it made outside its directory:
// the kubelet, kube-proxy and the controllers are killed, every pod sandbox
// is stopped and removed through containerd's CRI (its containers killed,
// its network torn down), containerd is killed, what stayed mounted under
// the node's directory (the kubelet's volumes) is unmounted, and the node's
// cgroups are removed. Its network goes after the cluster's API server
// (Group.Stop).
func (n *Node) stop() error {
	var errs []error
	for _, p := range []*Process{n.scheduler, n.controllerManager, n.kubeProxy, n.kubelet} {
		if p != nil {
			p.Kill()
		}
	}
	if n.containerd != nil {
		errs = append(errs, n.removePods())
		n.containerd.Kill()
	}
	errs = append(errs, unmountUnder(n.Dir))
	if n.cgroupRoot != "" {
		for _, dir := range cgroupHierarchies() {
			errs = append(errs, removeCgroup(filepath.Join(dir, n.cgroupRoot)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stopping node %s: %w", n.Name, err)
	}
	return nil
}

// removePods stops and removes every pod sandbox of the node's containerd
// through its CRI, as the kubelet would.
func (n *Node) removePods() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+n.ContainerdAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to containerd's CRI: %w", err)
	}
	defer conn.Close()
	runtime := cri.NewRuntimeServiceClient(conn)
	sandboxes, err := runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("listing the pod sandboxes: %w", err)
	}
	var errs []error
	for _, s := range sandboxes.Items {
		if _, err := runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: s.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stopping pod sandbox %s: %w", s.Id, err))
			continue
		}
		if _, err := runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: s.Id}); err != nil {
			errs = append(errs, fmt.Errorf("removing pod sandbox %s: %w", s.Id, err))
		}
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount point under dir, deepest first.
func unmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT ...; octal escapes as \040.
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		point := unescapeMount(fields[4])
		if strings.HasPrefix(point, dir+"/") {
			points = append(points, point)
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	unquoted, err := strconv.Unquote(`"` + s + `"`)
	if err != nil {
		return s
	}
	return unquoted
}

// removeCgroup removes the cgroup at dir and those under it, deepest first.
func removeCgroup(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range slices.Backward(dirs) {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}
