package controlplane

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// nodeNetwork is the network of one node: a network namespace of its own,
// where its containerd's pods (a CNI bridge) and its kube-proxy live, joined
// to this machine by a veth pair. Each node's kube-proxy thus writes the
// iptables chains of its own namespace (several kube-proxies in one would
// fight over the same chains), and nothing leaves this machine: the host
// routes the node's pod subnet and its cluster's Service range to the
// namespace, the namespace routes the nodes' addresses (nodeNetworks) to
// the host, where the API servers of node clusters listen (HostIP), and
// nothing else: a pod's connection to any other address fails as
// unreachable instead of leaving the machine.
type nodeNetwork struct {
	// Name is the host end of the veth pair and the network namespace,
	// ctrlmesh<i>; creating the veth pair claims i, so that the nodes of
	// concurrent test runs differ.
	Name string
	// HostIP is the host end's address, where the cluster's API server
	// listens and which it advertises (the kubernetes Service's endpoint);
	// NodeIP is the namespace end's, the node's address.
	HostIP, NodeIP string
	// PodSubnet is the subnet of the node's pods, 10.244.<i>.0/24, behind
	// the namespace's bridge.
	PodSubnet string
	// ServiceSubnet is the Service IP range of the node's cluster,
	// 10.96.<i>.0/24, and KubernetesServiceIP the ClusterIP of its
	// kubernetes Service (the range's first address). The host routes the
	// range into the namespace, where the node's kube-proxy takes a
	// ClusterIP to its endpoints: a host process (the API server calling a
	// webhook's Service, a test) that dials a ClusterIP reaches the cluster
	// instead of leaving the machine by the default route. A range per node
	// keeps the host's routes apart.
	ServiceSubnet, KubernetesServiceIP string
}

// nodeNetworks holds the addresses of every node's veth pair.
const nodeNetworks = "10.245.0.0/16"

// nodeBridge is the name of the CNI bridge of the node's pods, inside the
// node's network namespace (so every node may use the same name).
const nodeBridge = "cni0"

// claimNodeNetwork makes the network of a node: it claims the first free
// ctrlmesh<i> by creating the veth pair of that name, makes the network
// namespace, moves the pair's other end into it as eth0, and routes the
// pods' subnet and the cluster's Service range from the host into the
// namespace (routes of the veth, which go with it). On error, what it made
// is removed.
func claimNodeNetwork() (*nodeNetwork, error) {
	for i := range 250 {
		name := "ctrlmesh" + strconv.Itoa(i)
		peer := name + "p"
		out, err := exec.Command("ip", "link", "add", "name", name, "type", "veth", "peer", "name", peer).CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "exists") {
				continue
			}
			return nil, fmt.Errorf("creating veth pair %s: %w: %s", name, err, out)
		}
		net := &nodeNetwork{
			Name:      name,
			HostIP:    fmt.Sprintf("10.245.%d.1", i),
			NodeIP:    fmt.Sprintf("10.245.%d.2", i),
			PodSubnet: fmt.Sprintf("10.244.%d.0/24", i),

			ServiceSubnet:       fmt.Sprintf("10.96.%d.0/24", i),
			KubernetesServiceIP: fmt.Sprintf("10.96.%d.1", i),
		}
		if err := net.setUp(peer); err != nil {
			return nil, errors.Join(fmt.Errorf("making the network of a node (%s): %w", name, err), net.remove())
		}
		return net, nil
	}
	return nil, errors.New("no free ctrlmesh0..249 for a node's network: remove the stale ones (ip link del ctrlmeshN; ip netns del ctrlmeshN)")
}

// setUp makes the namespace and the routes of a claimed veth pair.
func (net *nodeNetwork) setUp(peer string) error {
	ns := net.Name
	steps := [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "link", "set", peer, "netns", ns},
		{"ip", "-n", ns, "link", "set", peer, "name", "eth0"},
		{"ip", "-n", ns, "addr", "add", net.NodeIP + "/30", "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", ns, "route", "add", nodeNetworks, "via", net.HostIP},
		{"ip", "addr", "add", net.HostIP + "/30", "dev", net.Name},
		{"ip", "link", "set", net.Name, "up"},
		{"ip", "route", "add", net.PodSubnet, "via", net.NodeIP, "dev", net.Name},
		// kube-proxy's PREROUTING rules DNAT a ClusterIP arriving on eth0,
		// and masquerade it (its source is outside the pods' subnet) so
		// that the reply comes back through the namespace.
		{"ip", "route", "add", net.ServiceSubnet, "via", net.NodeIP, "dev", net.Name, "src", net.HostIP},
		// The namespace forwards between its pods' bridge and eth0.
		net.Exec("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"),
	}
	for _, step := range steps {
		if out, err := exec.Command(step[0], step[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(step, " "), err, out)
		}
	}
	return nil
}

// Exec is the command line that runs command in the node's network
// namespace (only there: the mounts stay the host's, so the kubelet and
// the node's containerd see the same volumes).
func (net *nodeNetwork) Exec(command ...string) []string {
	return append([]string{"nsenter", "--net=" + filepath.Join("/run/netns", net.Name), "--"}, command...)
}

// remove deletes the veth pair (with it the host's routes to the pods and
// the Services) and
// the network namespace (with it the iptables rules of the node's
// kube-proxy and its pods' bridge), once nothing runs in it.
func (net *nodeNetwork) remove() error {
	var errs []error
	if out, err := exec.Command("ip", "link", "del", net.Name).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
		errs = append(errs, fmt.Errorf("removing veth pair %s: %w: %s", net.Name, err, out))
	}
	if out, err := exec.Command("ip", "netns", "del", net.Name).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
		errs = append(errs, fmt.Errorf("removing network namespace %s: %w: %s", net.Name, err, out))
	}
	return errors.Join(errs...)
}
