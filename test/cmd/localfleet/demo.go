package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/printers"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// The demo's fleet: two members, each running two pods of the demo
// operator in demoNamespace, sharded by the ShardingConfig demoName.
const (
	demoNamespace = "operators"
	demoName      = "demo-operator"
	podsPerMember = 2
	canaryPodName = demoName + "-canary"
	canaryHealthy = 10 // seconds the canary stays healthy before the next step
	readyTimeout  = 2 * time.Minute
)

var demoMembers = []string{"member1", "member2"}

// karmadaSyncModes are the members' sync modes with --karmada: the two
// ways Karmada joins a member.
var karmadaSyncModes = map[string]clusterv1alpha1.ClusterSyncMode{"member1": clusterv1alpha1.Push, "member2": clusterv1alpha1.Pull}

// fleetFlags are the flags demo and up share.
type fleetFlags struct {
	binDir    string
	keep      bool
	karmada   bool
	processes bool
}

func (ff *fleetFlags) bind(cmd *cobra.Command, keepUsage string) {
	cmd.Flags().StringVar(&ff.binDir, "bin-dir", "", "directory with kube-apiserver and etcd (make tools: also the node components and helm, or Karmada's components with --karmada), ctrlmeshctl (make build; ctrlmesh-proxy and demo-operator with --processes or --karmada); empty: bin/ of the checkout")
	cmd.Flags().BoolVar(&ff.karmada, "karmada", false, "make the hub a Karmada control plane (karmada-aggregated-apiserver, karmada-controller-manager) and join member1 to it in push mode, member2 in pull mode (karmada-agent): Karmada applies the Works and reports their status, the agents run in Karmada mode; a fleet of processes (--processes)")
	cmd.Flags().BoolVar(&ff.processes, "processes", false, "run the hub and the agents in this process and each pod's proxy and operator as local processes (with admin credentials), on API servers without nodes: quicker, for development loops; without it every cluster has a real node and everything runs in pods")
	if keepUsage != "" {
		cmd.Flags().BoolVar(&ff.keep, "keep", false, keepUsage)
	}
}

func newDemoCommand() *cobra.Command {
	var ff fleetFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run ctrlmesh on a local fleet: placement, a canary, a pod failure healed",
		Long: `demo starts a local fleet — a hub and two member clusters, each a real
kube-apiserver and etcd with a real node (containerd, runc, the kubelet,
kube-proxy, kube-controller-manager, kube-scheduler), with no Docker and no
existing cluster; it needs root and the node packages (make node-packages).
It builds the images of ctrlmesh-hub, ctrlmesh-agent, ctrlmesh-proxy and the
demo operator into each node and runs the user's steps: installs the hub's
Helm chart into the hub cluster, joins each member with ctrlmeshctl join
--agent-chart (the agent's chart), applies a ShardingConfig over both
members and deploys the demo operator there as Deployments labeled
ctrlmesh.io/enable-proxy=true (the agent injects the proxy), and prints the
placement once every pod is placed; then deploys a canary and prints the
placement at each canary step, deletes a pod and prints the placement once
its buckets moved and its replacement is placed. Run it from the ctrlmesh
checkout after make tools and make build (make demo does all of it).

With --processes the fleet has no nodes: the hub and one agent per member
(standalone mode) run in this process with their shipped RBAC, and each pod
of the demo operator is a Pod object in its member with ctrlmesh-proxy and
demo-operator as local processes (a pod failure: both killed).

With --karmada the hub is a Karmada control plane: member1 joins it in push
mode (karmada-controller-manager applies its Works), member2 in pull mode
(karmada-agent in the member does), the agents run in Karmada mode (they
apply nothing), and each member's sync mode, read back from Karmada's
Cluster, is printed beside every placement (make demo-karmada).`,
		Example: `  localfleet demo
  localfleet demo --processes  # no nodes: processes, for quick loops
  localfleet demo --karmada    # processes on a Karmada control plane, one push and one pull member
  localfleet demo --keep       # stay up afterwards, until Ctrl-C`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFleet(cmd.Context(), cmd.OutOrStdout(), ff, (*session).demo)
		},
	}
	ff.bind(cmd, "stay up after the demo, printing the kubeconfigs, until Ctrl-C")
	return cmd
}

func newUpCommand() *cobra.Command {
	var ff fleetFlags
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a local fleet running the demo operator and stay up until Ctrl-C",
		Long: `up starts the fleet of localfleet demo — a hub, two members, their
agents and the demo operator's pods — applies the ShardingConfig, waits until
it is Ready, prints the placement and the kubeconfigs, and stays up until
Ctrl-C. On real nodes (without --processes) it behaves like a cluster: a
pod's process killed or a pod deleted is healed by the kubelet and the
ReplicaSet, and each change of the operator's pods is printed; only a node
component that exits ends it. With --karmada the hub is a Karmada control plane, member1 joined in
push mode and member2 in pull mode, as with demo --karmada.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ff.keep = true
			return runFleet(cmd.Context(), cmd.OutOrStdout(), ff, func(*session, context.Context) error { return nil })
		},
	}
	ff.bind(cmd, "")
	return cmd
}

// session is one run of the demo fleet, printing its progress.
type session struct {
	out   io.Writer
	start time.Time
	fleet *localfleet.Fleet
	pods  map[string]*localfleet.Pod
	sc    *ctrlmeshv1alpha1.ShardingConfig
	// karmada: the hub is a Karmada control plane (--karmada).
	karmada bool
	// nodes is the fleet on real nodes, without --processes; fleet is nil
	// then, and pods too.
	nodes *localfleet.NodeFleet
}

// step prints a progress line with the time since the start.
func (s *session) step(format string, args ...any) {
	fmt.Fprintf(s.out, "==> [%6.1fs] %s\n", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

// runFleet brings the fleet up with the ShardingConfig Ready, runs then,
// and with ff.keep stays up until ctx ends or a signal comes. The work
// directory is removed at the end, unless something failed: its logs then
// tell why.
func runFleet(ctx context.Context, out io.Writer, ff fleetFlags, then func(*session, context.Context) error) (err error) {
	s := &session{out: out, start: time.Now(), pods: map[string]*localfleet.Pod{}, karmada: ff.karmada}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	binDir, crdDirs, err := checkout(ff.binDir)
	if err != nil {
		return err
	}
	workDir, err := os.MkdirTemp("", "ctrlmesh-demo-")
	if err != nil {
		return fmt.Errorf("creating the work directory: %w", err)
	}
	defer func() {
		interrupted := ctx.Err() != nil
		if err != nil && !interrupted && (s.fleet != nil || s.nodes != nil) {
			fmt.Fprintf(out, "the kubeconfigs and logs are kept in %s\n", workDir)
			return
		}
		if interrupted && err != nil {
			err = errors.New("interrupted")
		}
		err = errors.Join(err, os.RemoveAll(workDir))
	}()
	// The hub and the agents log to files in the work directory; what
	// controller-runtime and client-go log globally is dropped, so that
	// it does not mix with the progress lines.
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())

	opts := localfleet.Options{
		BinDir: binDir, CRDDirs: crdDirs, WorkDir: workDir, Members: demoMembers,
		// Range mode: the canary serves single namespaces besides buckets.
		MemberFeatureGates: []string{controlplane.FeatureShardedListAndWatch},
	}
	if !ff.processes && !ff.karmada {
		return s.runNodes(ctx, ff, localfleet.NodeOptions{BinDir: binDir, CRDDirs: crdDirs, WorkDir: workDir, Members: demoMembers,
			MemberFeatureGates: opts.MemberFeatureGates}, then)
	}
	s.step("starting %d API servers (kube-apiserver + etcd each): %s, %s", 1+len(demoMembers), localfleet.HubName, strings.Join(demoMembers, ", "))
	if s.karmada {
		opts.Karmada = karmadaSyncModes
		s.step("%s is a Karmada control plane: Karmada's CRDs, karmada-aggregated-apiserver serving cluster.karmada.io, karmada-controller-manager; the ShardRoute interpreter", localfleet.HubName)
	}
	s.fleet, err = localfleet.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		s.step("stopping the fleet")
		err = errors.Join(err, s.fleet.Stop())
		if err == nil {
			s.step("done")
		}
	}()
	if err := s.up(ctx); err != nil {
		return err
	}
	if err := then(s, ctx); err != nil {
		return err
	}
	if !ff.keep {
		return nil
	}
	s.printKubeconfigs()
	select {
	case <-ctx.Done():
		return nil
	case <-s.watchFailure(ctx):
		return s.fleet.Err()
	}
}

// checkout finds the binaries and the CRDs in the ctrlmesh checkout.
func checkout(binDir string) (string, []string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", nil, fmt.Errorf("%w: run localfleet demo from the ctrlmesh checkout (make demo)", err)
	}
	if binDir == "" {
		binDir = filepath.Join(root, "bin")
	}
	return binDir, controlplane.CRDDirs(root), nil
}

// up runs the hub, joins the members, starts the pods, applies the
// ShardingConfig and prints its placement once it is Ready.
func (s *session) up(ctx context.Context) error {
	if s.karmada {
		s.step("hub: namespace ctrlmesh, RBAC, ctrlmesh-hub (auto-accepting members; Karmada's finalizer on its Works)")
	} else {
		s.step("hub: namespace ctrlmesh, RBAC, ctrlmesh-hub (auto-accepting members)")
	}
	if err := s.fleet.StartHub(ctx); err != nil {
		return err
	}
	for _, m := range demoMembers {
		switch {
		case !s.karmada:
			s.step("joining %s: RBAC on the hub and the member, ctrlmesh-agent in standalone mode", m)
		case karmadaSyncModes[m] == clusterv1alpha1.Push:
			s.step("joining %s: to Karmada in push mode (a Cluster with its credentials: karmada-controller-manager applies its Works), then RBAC on the hub and the member, ctrlmesh-agent in Karmada mode", m)
		default:
			s.step("joining %s: to Karmada in pull mode (karmada-agent in the member registers its Cluster and applies its Works), then RBAC on the hub and the member, ctrlmesh-agent in Karmada mode", m)
		}
		if err := s.fleet.Join(ctx, m); err != nil {
			return err
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}
	if err := s.fleet.Hub.Client.Create(ctx, ns.DeepCopy()); err != nil {
		return fmt.Errorf("creating namespace %s on the hub: %w", demoNamespace, err)
	}
	for _, m := range demoMembers {
		s.step("%s: %d pods of %s (Pod object; ctrlmesh-proxy and demo-operator processes)", m, podsPerMember, demoName)
		// With --karmada it may be there already: Karmada's namespace
		// controller propagates the namespaces of its control plane (the
		// hub's) to every member.
		if err := s.fleet.Members[m].Client.Create(ctx, ns.DeepCopy()); err != nil && !(s.karmada && apierrors.IsAlreadyExists(err)) {
			return fmt.Errorf("creating namespace %s in %s: %w", demoNamespace, m, err)
		}
		for i := range podsPerMember {
			if err := s.startPod(ctx, m, fmt.Sprintf("%s-%d", demoName, i), nil); err != nil {
				return err
			}
		}
	}
	s.sc = demoShardingConfig()
	s.step("applying ShardingConfig %s/%s: configmaps sharded per cluster over %s; canary steps for pods labeled track=canary (none yet): namespace team-a, then team-a and buckets 0-3",
		demoNamespace, demoName, strings.Join(demoMembers, ", "))
	if err := s.fleet.Hub.Client.Create(ctx, s.sc); err != nil {
		return fmt.Errorf("creating the ShardingConfig: %w", err)
	}
	s.step("waiting until it is Ready")
	return s.waitAndPrint(ctx, "Ready", func(*ctrlmeshv1alpha1.ShardingConfig) bool { return true })
}

// demoShardingConfig is the demo operator's ShardingConfig, with a canary
// shard that appears once a pod labeled track=canary runs.
func demoShardingConfig() *ctrlmeshv1alpha1.ShardingConfig {
	sc := localfleet.ShardingConfig(demoNamespace, demoName, demoMembers)
	sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
		Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
		Steps: []ctrlmeshv1alpha1.CanaryStep{
			{Namespaces: []string{"team-a"}},
			{Buckets: "0-3", Namespaces: []string{"team-a"}},
		},
		MinHealthySeconds: canaryHealthy,
	}
	return sc
}

// demo shows a canary and a pod failure on the fleet up runs.
func (s *session) demo(ctx context.Context) error {
	if s.nodes != nil {
		return s.demoNodes(ctx)
	}
	s.step("canary: pod %s in %s labeled track=canary; the hub moves to the next step after %ds healthy",
		canaryPodName, demoMembers[0], canaryHealthy)
	if err := s.startPod(ctx, demoMembers[0], canaryPodName, map[string]string{"track": "canary"}); err != nil {
		return err
	}
	if err := s.canarySteps(ctx); err != nil {
		return err
	}

	victim := s.pods[demoMembers[1]+"/"+demoName+"-0"]
	s.step("pod failure: killing %s/%s (SIGKILL to its proxy and operator, Pod object deleted)", victim.Cluster, victim.Name)
	killed := time.Now()
	if err := s.fleet.KillPod(ctx, victim); err != nil {
		return err
	}
	if err := s.waitAndPrint(ctx, "healed", func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
			return p.Cluster == victim.Cluster && slices.Contains(p.Pods, victim.Name)
		})
	}); err != nil {
		return err
	}
	s.step("healed %.1fs after the kill: the dead pod's buckets moved to the other pod of %s", time.Since(killed).Seconds(), victim.Cluster)
	return nil
}

// canarySteps waits for each canary step and prints its placement.
func (s *session) canarySteps(ctx context.Context) error {
	for step := range int32(len(s.sc.Spec.Canary.Steps)) {
		s.step("waiting for canary step %d", step+1)
		if err := s.waitAndPrint(ctx, fmt.Sprintf("Ready at canary step %d", step+1), func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
			return sc.Status.Canary != nil && sc.Status.Canary.Step == step && servesCanaryStep(sc, sc.Spec.Canary.Steps[step])
		}); err != nil {
			return err
		}
	}
	return nil
}

// servesCanaryStep tells whether the canary shard is placed on what step
// names: the status moves to a step before the hub has placed it.
func servesCanaryStep(sc *ctrlmeshv1alpha1.ShardingConfig, step ctrlmeshv1alpha1.CanaryStep) bool {
	return slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
		return p.Canary && p.Buckets == step.Buckets && slices.Equal(p.Namespaces, step.Namespaces)
	})
}

func (s *session) startPod(ctx context.Context, cluster, name string, extraLabels map[string]string) error {
	labels := map[string]string{"app": demoName}
	for k, v := range extraLabels {
		labels[k] = v
	}
	p, err := s.fleet.StartPod(ctx, localfleet.PodSpec{Cluster: cluster, Namespace: demoNamespace, Name: name, Labels: labels, RulesName: demoName})
	if err != nil {
		return err
	}
	s.pods[cluster+"/"+name] = p
	return nil
}

// waitAndPrint waits until the ShardingConfig is Ready for its current
// generation, every shard ready, and matches, then prints its status.
func (s *session) waitAndPrint(ctx context.Context, what string, matches func(*ctrlmeshv1alpha1.ShardingConfig) bool) error {
	deadline := time.Now().Add(readyTimeout)
	var sc ctrlmeshv1alpha1.ShardingConfig
	for {
		if err := s.hub().Client.Get(ctx, client.ObjectKeyFromObject(s.sc), &sc); err != nil {
			return fmt.Errorf("reading the ShardingConfig: %w", err)
		}
		st := &sc.Status
		if st.ObservedGeneration == sc.Generation && meta.IsStatusConditionTrue(st.Conditions, ctrlmeshv1alpha1.ConditionReady) &&
			st.ReadyShards == st.Shards && matches(&sc) {
			s.step("%s:", what)
			if err := printers.ShardingConfig(s.out, &sc); err != nil {
				return err
			}
			if s.nodes != nil {
				return s.printPods(ctx)
			}
			return s.printSyncModes(ctx)
		}
		if err := s.fleetErr(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(s.out, "not %s within %v; the status now:\n", what, readyTimeout)
			return errors.Join(printers.ShardingConfig(s.out, &sc), fmt.Errorf("ShardingConfig %s/%s not %s within %v", demoNamespace, demoName, what, readyTimeout))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// printSyncModes prints, on a Karmada fleet, each member's sync mode as
// Karmada's Cluster has it: who applies the member's Works.
func (s *session) printSyncModes(ctx context.Context) error {
	if !s.karmada {
		return nil
	}
	w := tabwriter.NewWriter(s.out, 0, 0, 3, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tKARMADA SYNC MODE\tWORKS APPLIED BY")
	for _, m := range demoMembers {
		mode, err := s.fleet.KarmadaSyncMode(ctx, m)
		if err != nil {
			return err
		}
		by := "karmada-controller-manager"
		if mode == clusterv1alpha1.Pull {
			by = "karmada-agent in " + m
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", m, mode, by)
	}
	return w.Flush()
}

func (s *session) printKubeconfigs() {
	fmt.Fprintln(s.out, "The fleet stays up until Ctrl-C. Kubeconfigs (admin):")
	fmt.Fprintf(s.out, "  %-8s %s\n", localfleet.HubName, s.hub().KubeconfigPath)
	for _, m := range demoMembers {
		fmt.Fprintf(s.out, "  %-8s %s\n", m, s.member(m).KubeconfigPath)
	}
	if s.nodes != nil {
		fmt.Fprintf(s.out, "Nodes (their logs, and the pods' under pod-logs/): %s\nFor example:\n  ctrlmeshctl status %s -n %s --kubeconfig %s\n",
			filepath.Join(s.nodes.WorkDir, "<cluster>-node"), demoName, demoNamespace, s.hub().KubeconfigPath)
		fmt.Fprintf(s.out, "  kubectl get pods -A -o wide --kubeconfig %s\n", s.member(demoMembers[0]).KubeconfigPath)
		return
	}
	fmt.Fprintf(s.out, "Logs: %s\nFor example:\n  ctrlmeshctl status %s -n %s --kubeconfig %s\n",
		filepath.Join(s.fleet.WorkDir, "logs"), demoName, demoNamespace, s.fleet.Hub.KubeconfigPath)
	if s.karmada {
		fmt.Fprintf(s.out, "  kubectl get clusters.cluster.karmada.io,works.work.karmada.io -A --kubeconfig %s   # the hub is the Karmada API server\n",
			s.fleet.Hub.KubeconfigPath)
	}
}

// watchFailure closes the returned channel once a part of the fleet fails.
func (s *session) watchFailure(ctx context.Context) <-chan struct{} {
	failed := make(chan struct{})
	go func() {
		for ctx.Err() == nil {
			if s.fleetErr() != nil {
				close(failed)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return failed
}
