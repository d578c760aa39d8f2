package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// On real nodes the demo operator runs in each member as the Deployment
// demoName (podsPerMember replicas, track=stable), and the canary as the
// Deployment canaryPodName in the first member (one replica,
// track=canary): the ShardingConfig selects both by app=demo-operator,
// its canary the second by track=canary.
var (
	stableLabels = map[string]string{"app": demoName, "track": "stable"}
	canaryLabels = map[string]string{"app": demoName, "track": "canary"}
	demoLabels   = map[string]string{"app": demoName}
)

// hub, member and fleetErr are the fleet's, on real nodes or processes.
func (s *session) hub() *controlplane.Cluster {
	if s.nodes != nil {
		return s.nodes.Hub
	}
	return s.fleet.Hub
}

func (s *session) member(name string) *controlplane.Cluster {
	if s.nodes != nil {
		return s.nodes.Members[name]
	}
	return s.fleet.Members[name]
}

func (s *session) fleetErr() error {
	if s.nodes != nil {
		return s.nodes.Err()
	}
	return s.fleet.Err()
}

// runNodes is runFleet on real nodes: every cluster has a node, and the
// user's steps install and run everything there.
func (s *session) runNodes(ctx context.Context, ff fleetFlags, opts localfleet.NodeOptions, then func(*session, context.Context) error) (err error) {
	s.step("starting %d clusters, each a kube-apiserver + etcd with a real node (containerd + runc, kubelet, kube-proxy in a network namespace of its own; kube-controller-manager, kube-scheduler): %s, %s; building the images of ctrlmesh-hub, ctrlmesh-agent, ctrlmesh-proxy and demo-operator meanwhile (no Docker: OCI tarballs imported into each node's containerd)",
		1+len(demoMembers), localfleet.HubName, strings.Join(demoMembers, ", "))
	s.nodes, err = localfleet.StartNodes(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		s.step("stopping the fleet (pods, nodes, API servers)")
		err = errors.Join(err, s.nodes.Stop())
		if err == nil {
			s.step("done")
		}
	}()
	for _, n := range s.nodes.Nodes() {
		s.step("node %s Ready %.1fs after its API server served; images imported", n.Name, n.ColdStart.Seconds())
	}
	if err := s.upNodes(ctx); err != nil {
		return err
	}
	if err := then(s, ctx); err != nil {
		return err
	}
	if !ff.keep {
		return nil
	}
	s.printKubeconfigs()
	fmt.Fprintln(s.out, "Changes to the demo operator's pods are printed as they happen (kill a container's process, delete a pod: the kubelet and its ReplicaSet bring it back).")
	watching, stopWatching := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		s.watchPods(watching)
	}()
	defer func() {
		stopWatching()
		<-watched
	}()
	select {
	case <-ctx.Done():
		return nil
	case <-s.watchFailure(ctx):
		return s.fleetErr()
	}
}

// upNodes runs the user's four steps on the fleet's nodes: the hub's chart,
// the members joined by ctrlmeshctl join (the agent's chart), the
// ShardingConfig applied (and the operator deployed), the placement once
// every pod of the operator is placed.
func (s *session) upNodes(ctx context.Context) error {
	s.step("1. install the hub: helm install ctrlmesh-hub deploy/charts/ctrlmesh-hub -n ctrlmesh into %s (members %s may join; auto-accept)",
		localfleet.HubName, strings.Join(demoMembers, ", "))
	if err := s.nodes.InstallHub(ctx); err != nil {
		return err
	}
	if err := s.printPodsOf(s.hub(), "ctrlmesh", map[string]string{"app.kubernetes.io/name": "ctrlmesh-hub"}); err != nil {
		return err
	}
	for _, m := range demoMembers {
		s.step("2. join %s: ctrlmeshctl join --cluster-name %s --agent-chart deploy/charts/ctrlmesh-agent (the agent's hub token from the hub into a Secret of %s, helm install of the agent chart, until the agent joined)", m, m, m)
		joining := time.Now()
		if err := s.nodes.Join(ctx, m); err != nil {
			return err
		}
		s.step("   %s joined: its agent Ready and accepted by the hub %.1fs after ctrlmeshctl join began", m, time.Since(joining).Seconds())
		if err := s.printPodsOf(s.member(m), "ctrlmesh", map[string]string{"app.kubernetes.io/name": "ctrlmesh-agent"}); err != nil {
			return err
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}
	if err := s.hub().Client.Create(ctx, ns.DeepCopy()); err != nil {
		return fmt.Errorf("creating namespace %s on the hub: %w", demoNamespace, err)
	}
	rbac, err := s.nodes.OperatorRBAC(demoNamespace, demoName)
	if err != nil {
		return err
	}
	s.step("the operator's namespace %s in %s, its ServiceAccount %s with its own RBAC and deploy/rbac/proxy.yaml bound in %s",
		demoNamespace, strings.Join(demoMembers, " and "), demoName, demoNamespace)
	for _, m := range demoMembers {
		for _, o := range append([]client.Object{ns.DeepCopy()}, rbac...) {
			if err := s.member(m).Client.Create(ctx, o.DeepCopyObject().(client.Object)); err != nil {
				return fmt.Errorf("creating %T %s in %s: %w", o, o.GetName(), m, err)
			}
		}
	}
	s.sc = demoShardingConfig()
	s.step("3. apply ShardingConfig %s/%s on the hub: configmaps sharded per cluster over %s; canary steps for pods labeled track=canary (none yet): namespace team-a, then team-a and buckets 0-3",
		demoNamespace, demoName, strings.Join(demoMembers, ", "))
	if err := s.hub().Client.Create(ctx, s.sc); err != nil {
		return fmt.Errorf("creating the ShardingConfig: %w", err)
	}
	for _, m := range demoMembers {
		if err := s.waitForRoute(ctx, m); err != nil {
			return err
		}
		s.step("   %s: its agent applied ShardRoute %s/%s; deploying the demo operator: Deployment %s, %d replicas labeled ctrlmesh.io/enable-proxy=true, ServiceAccount %s",
			m, demoNamespace, demoName, demoName, podsPerMember, demoName)
		if err := s.deployOperator(ctx, m, demoName, podsPerMember, stableLabels); err != nil {
			return err
		}
	}
	s.step("4. observe the placement: waiting until it is Ready with every pod of the operator placed")
	return s.waitAndPrint(ctx, "Ready", func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		for _, m := range demoMembers {
			if len(placedPods(sc, m, false)) != podsPerMember {
				return false
			}
		}
		return true
	})
}

// waitForRoute waits until member's agent has applied the ShardingConfig's
// ShardRoute: pods created before it run without the proxy until the
// agent evicts them (README "Install on real clusters" step 4), which the
// demo spares itself.
func (s *session) waitForRoute(ctx context.Context, member string) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		err := s.member(member).Client.Get(ctx, client.ObjectKey{Namespace: demoNamespace, Name: demoName}, &ctrlmeshv1alpha1.ShardRoute{})
		if err == nil {
			return nil
		}
		if fleetErr := s.fleetErr(); fleetErr != nil {
			return fleetErr
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the ShardRoute %s/%s not in %s within %v: %w", demoNamespace, demoName, member, readyTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// deployOperator creates the demo operator's Deployment name in member
// and waits until its pods run Ready, the injected proxy with them.
func (s *session) deployOperator(ctx context.Context, member, name string, replicas int32, labels map[string]string) error {
	c := s.member(member)
	if err := c.Client.Create(ctx, localfleet.OperatorDeployment(demoNamespace, name, demoName, replicas, labels)); err != nil {
		return fmt.Errorf("creating Deployment %s in %s: %w", name, member, err)
	}
	return s.nodes.WaitReady(ctx, c, demoNamespace, labels, int(replicas), readyTimeout)
}

// demoNodes shows a canary and a pod deleted on the fleet upNodes runs.
func (s *session) demoNodes(ctx context.Context) error {
	s.step("canary: Deployment %s in %s, 1 replica labeled track=canary; the hub moves to the next step after %ds healthy",
		canaryPodName, demoMembers[0], canaryHealthy)
	if err := s.deployOperator(ctx, demoMembers[0], canaryPodName, 1, canaryLabels); err != nil {
		return err
	}
	if err := s.canarySteps(ctx); err != nil {
		return err
	}

	member := demoMembers[1]
	pods, err := localfleet.PodsOf(ctx, s.member(member).Client, demoNamespace, stableLabels)
	if err != nil {
		return err
	}
	if len(pods) == 0 {
		return fmt.Errorf("no pod of %s in %s", demoName, member)
	}
	victim := pods[0]
	s.step("pod failure: deleting pod %s/%s on node %s (its ReplicaSet makes a new one, the scheduler places it, the kubelet starts it with an injected proxy)",
		member, victim.Name, victim.Spec.NodeName)
	deleted := time.Now()
	if err := s.member(member).Client.Delete(ctx, &victim); err != nil {
		return fmt.Errorf("deleting pod %s in %s: %w", victim.Name, member, err)
	}
	if err := s.waitAndPrint(ctx, "healed", func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		placed := placedPods(sc, member, false)
		return len(placed) == podsPerMember && !slices.Contains(placed, victim.Name)
	}); err != nil {
		return err
	}
	s.step("healed %.1fs after the deletion: %s's buckets moved, its replacement placed", time.Since(deleted).Seconds(), victim.Name)
	return s.printSidecarMemory(ctx)
}

// printSidecarMemory prints the memory of each injected proxy as the
// kubelet sees it: its container's cgroup.
func (s *session) printSidecarMemory(ctx context.Context) error {
	s.step("the injected proxies' memory, as the kubelet counts it (cgroup working set; usage and RSS beside it):")
	tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tPOD\tWORKING SET\tUSAGE\tRSS")
	for _, m := range demoMembers {
		pods, err := localfleet.PodsOf(ctx, s.member(m).Client, demoNamespace, demoLabels)
		if err != nil {
			return err
		}
		for _, p := range pods {
			mem, err := localfleet.ContainerMemory(localfleet.ContainerID(&p, ctrlmeshv1alpha1.ProxyContainerName))
			if err != nil {
				return err
			}
			fmt.Fprintf(tw, "%s\t%s\t%.1f MiB\t%.1f MiB\t%.1f MiB\n", m, p.Name, mib(mem.WorkingSet), mib(mem.Usage), mib(mem.RSS))
		}
	}
	return tw.Flush()
}

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// watchPods prints, while the fleet stays up, what happens to the demo
// operator's pods: a container restarted, a pod gone or new. The kubelet
// and the ReplicaSets heal them; the fleet stays.
func (s *session) watchPods(ctx context.Context) {
	seen := map[string]string{}
	for first := true; ctx.Err() == nil; first = false {
		now := map[string]string{}
		for _, m := range demoMembers {
			pods, err := localfleet.PodsOf(ctx, s.member(m).Client, demoNamespace, demoLabels)
			if err != nil {
				continue
			}
			for _, p := range pods {
				key := m + "/" + p.Name
				now[key] = localfleet.PodState(&p)
				if before, ok := seen[key]; !first && (!ok || before != now[key]) {
					fmt.Fprintf(s.out, "pod %s on %s: %s\n", key, p.Spec.NodeName, now[key])
				}
			}
		}
		for key := range seen {
			if _, ok := now[key]; !ok {
				fmt.Fprintf(s.out, "pod %s: gone\n", key)
			}
		}
		seen = now
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}

// placedPods are the pods of cluster the placement names, canary ones or
// the others.
func placedPods(sc *ctrlmeshv1alpha1.ShardingConfig, cluster string, canary bool) []string {
	var pods []string
	for _, p := range sc.Status.Placement {
		if p.Cluster == cluster && p.Canary == canary {
			for _, pod := range p.Pods {
				if !slices.Contains(pods, pod) {
					pods = append(pods, pod)
				}
			}
		}
	}
	return pods
}

// printPods prints the demo operator's pods in every member: their nodes,
// readiness and restarts.
func (s *session) printPods(ctx context.Context) error {
	tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tNODE\tPOD\tSTATUS")
	for _, m := range demoMembers {
		pods, err := localfleet.PodsOf(ctx, s.member(m).Client, demoNamespace, demoLabels)
		if err != nil {
			return err
		}
		for _, p := range pods {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m, p.Spec.NodeName, p.Name, localfleet.PodState(&p))
		}
	}
	return tw.Flush()
}

// printPodsOf prints the pods of namespace in c matching labels, with
// their nodes.
func (s *session) printPodsOf(c *controlplane.Cluster, namespace string, labels map[string]string) error {
	pods, err := localfleet.PodsOf(context.Background(), c.Client, namespace, labels)
	if err != nil {
		return err
	}
	for _, p := range pods {
		fmt.Fprintf(s.out, "   pod %s/%s on node %s: %s\n", namespace, p.Name, p.Spec.NodeName, localfleet.PodState(&p))
	}
	return nil
}
