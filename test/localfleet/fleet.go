// Package localfleet runs a ctrlmesh fleet on one machine, with no Docker and
// no existing cluster: a hub and member clusters, each a real etcd and
// kube-apiserver; the hub and one agent per member (standalone mode, or
// Karmada mode with Options.Karmada), in this process, each with only its
// shipped RBAC; and operator "pods": a Pod object in a member plus
// ctrlmesh-proxy and the demo operator as local processes with the pod's
// identity.
//
// The localfleet command (make demo, make local-up) uses it, and so can tests.
package localfleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	policyv1alpha1 "github.com/karmada-io/karmada/pkg/apis/policy/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ctrlmesh/ctrlmesh/agent"
	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
)

// HubName is the hub cluster's name; its kubeconfig is <WorkDir>/hub.kubeconfig.
const HubName = "hub"

// namespace the hub and the agents run in, on the hub and on the members.
const namespace = membership.AgentNamespace

// Heartbeat of the agents: short, so that a lost member shows soon.
const (
	heartbeatDuration = 4 * time.Second
	heartbeatInterval = time.Second
)

// RulesValidity is the hub's validity of Fleet-scope rules in the fleet: the
// shortest the ShardRoute CRD allows, so that a lost member's buckets move
// after route.LapseBound(5 s) = 7.5 s.
const RulesValidity = 5 * time.Second

// Options for Start.
type Options struct {
	// BinDir holds kube-apiserver and etcd (make tools), ctrlmesh-proxy and
	// demo-operator (make build).
	BinDir string
	// CRDDirs are installed into every cluster; see controlplane.CRDDirs.
	CRDDirs []string
	// WorkDir receives the kubeconfigs and the logs. It must exist; Stop
	// leaves it.
	WorkDir string
	// Members are the member clusters' names, DNS labels.
	Members []string
	// MemberFeatureGates are turned on in the members' API servers, such as
	// FeatureShardedListAndWatch.
	MemberFeatureGates []string
	// HubFeatureGates are turned on in the hub's API server: range mode for
	// operators whose objects live on the hub (PodSpec.ObjectsOnHub).
	HubFeatureGates []string
	// Relays puts a fault-injecting relay (Relay) on each agent's link to
	// the hub and each pod proxy's link to its upstream API server, for
	// AgentHubRelay and Pod.UpstreamRelay to cut, heal or drop.
	Relays bool
	// Karmada, when set, makes the hub cluster a Karmada control plane
	// (controlplane.Spec.Karmada; BinDir must hold Karmada's components)
	// and gives each member's sync mode there, Push or Pull; every member
	// needs one. Join then joins the member to Karmada that way before its
	// ctrlmesh agent joins the hub, the agent runs in Karmada mode
	// (applying nothing: Karmada applies the Works and reports their
	// status through the shipped ShardRoute interpreter), and the hub puts
	// Karmada's execution finalizer on its Works.
	Karmada map[string]clusterv1alpha1.ClusterSyncMode
}

// Fleet is a running local fleet. StartHub, Join and StartPod bring up its
// parts; StopHub, StopAgent, StartAgent and KillPod disrupt them; Stop ends
// them all.
type Fleet struct {
	Hub *controlplane.Cluster
	// Members by name.
	Members map[string]*controlplane.Cluster
	// WorkDir holds the kubeconfigs (<cluster>.kubeconfig) and the logs
	// (logs/).
	WorkDir string

	binDir string
	relays bool
	// karmada are the members' sync modes with Options.Karmada; nil in
	// standalone mode.
	karmada  map[string]clusterv1alpha1.ClusterSyncMode
	clusters *controlplane.Group
	// ctx ends the in-process components; Stop cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// components are the hub and the agents by name ("hub", "agent
	// <member>"), each with how to run it again after a stop.
	components map[string]*component
	pods       []*Pod
	logFiles   []*os.File
	// agentRelays are the agents' links to the hub by member, with
	// Options.Relays; pods' relays are in their Pod.
	agentRelays map[string]*Relay
	// agentClocks are the agents' clocks by member, which SkewAgentClock
	// sets.
	agentClocks map[string]*skewedClock
}

// Start checks the binaries and starts the API servers: the hub and the
// members. Nothing runs on them yet.
func Start(ctx context.Context, opts Options) (*Fleet, error) {
	if err := controlplane.CheckBinaries(opts.BinDir, "run 'make tools' to build them from source", "kube-apiserver", "etcd"); err != nil {
		return nil, err
	}
	if err := controlplane.CheckBinaries(opts.BinDir, "run 'make build'", proxyBinary, operatorBinary); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(opts.WorkDir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("localfleet: %w", err)
	}
	specs := []controlplane.Spec{{Name: HubName, FeatureGates: opts.HubFeatureGates, Karmada: opts.Karmada != nil}}
	for _, m := range opts.Members {
		specs = append(specs, controlplane.Spec{Name: m, FeatureGates: opts.MemberFeatureGates})
	}
	cpOpts := controlplane.Options{Clusters: specs, AssetsDir: opts.BinDir, CRDDirs: opts.CRDDirs, WorkDir: opts.WorkDir}
	var root string
	if opts.Karmada != nil {
		for _, m := range opts.Members {
			if mode := opts.Karmada[m]; mode != clusterv1alpha1.Push && mode != clusterv1alpha1.Pull {
				return nil, fmt.Errorf("localfleet: member %q has Karmada sync mode %q; give it %s or %s", m, mode, clusterv1alpha1.Push, clusterv1alpha1.Pull)
			}
		}
		var err error
		if root, err = controlplane.RepoRoot(); err != nil {
			return nil, fmt.Errorf("localfleet: %w", err)
		}
		if cpOpts.KarmadaCRDDirs, err = controlplane.KarmadaCRDDirs(root); err != nil {
			return nil, fmt.Errorf("localfleet: %w", err)
		}
	}
	group, err := controlplane.Start(ctx, cpOpts)
	if err != nil {
		return nil, err
	}
	f := &Fleet{Hub: group.Cluster(HubName), Members: map[string]*controlplane.Cluster{}, WorkDir: opts.WorkDir, binDir: opts.BinDir,
		relays: opts.Relays, karmada: opts.Karmada, clusters: group, components: map[string]*component{},
		agentRelays: map[string]*Relay{}, agentClocks: map[string]*skewedClock{}}
	for _, m := range opts.Members {
		f.Members[m] = group.Cluster(m)
	}
	if opts.Karmada != nil {
		if err := controlplane.InstallShardRouteInterpreter(ctx, f.Hub, root); err != nil {
			return nil, errors.Join(fmt.Errorf("localfleet: %w", err), group.Stop())
		}
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f, nil
}

// StartHub installs the hub's namespace and RBAC and runs the hub with
// exactly that RBAC, accepting every member that joins. After StopHub it
// runs the hub again.
func (f *Fleet) StartHub(ctx context.Context) error {
	if f.restart(hubComponent) {
		return nil
	}
	identity, err := PrepareHub(ctx, f.Hub, namespace)
	if err != nil {
		return err
	}
	log, err := f.logger("hub")
	if err != nil {
		return err
	}
	f.run(hubComponent, func(ctx context.Context) error {
		return hub.Run(ctx, hub.Options{Config: identity, AutoAccept: true, RulesValidity: RulesValidity, KarmadaFinalizer: f.karmada != nil,
			MetricsAddress: "0", HealthAddress: "0", Log: log})
	})
	return nil
}

// notPropagated labels the namespaces made on the hub for ctrlmesh (the
// hub's, each member's cluster namespace), as the README's "Install on
// Karmada" does: a Karmada hub would otherwise copy them into every member.
var notPropagated = map[string]string{policyv1alpha1.NamespaceSkipAutoPropagationLabel: "true"}

// PrepareHub creates the hub's namespace and RBAC (hub.RBAC) in the hub
// cluster and returns credentials with exactly that RBAC: those of the
// hub's ServiceAccount.
func PrepareHub(ctx context.Context, hubCluster *controlplane.Cluster, namespace string) (*rest.Config, error) {
	objs := append([]client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: notPropagated}}}, hub.RBAC(namespace, true)...)
	if err := create(ctx, hubCluster.Client, objs...); err != nil {
		return nil, fmt.Errorf("localfleet: preparing the hub: %w", err)
	}
	return hubCluster.AddUser("system:serviceaccount:" + namespace + ":" + hub.ServiceAccount)
}

// PrepareAgent creates what a member's agent needs, as joining does: its
// execution and cluster namespaces and RBAC on the hub
// (membership.AgentHubRBAC), its
// namespace and RBAC in the member (agent.MemberRBAC). It returns the
// agent's credentials on each, with exactly that RBAC.
func PrepareAgent(ctx context.Context, hubCluster, memberCluster *controlplane.Cluster, member, namespace string) (hubIdentity, memberIdentity *rest.Config, err error) {
	hubObjs := append([]client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: names.GenerateExecutionSpaceName(member)}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ctrlmeshv1alpha1.ClusterNamespace(member), Labels: notPropagated}},
	}, membership.AgentHubRBAC(member)...)
	if err := create(ctx, hubCluster.Client, hubObjs...); err != nil {
		return nil, nil, fmt.Errorf("localfleet: preparing the hub for %s: %w", member, err)
	}
	memberObjs := append([]client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}}, agent.MemberRBAC(namespace)...)
	if err := create(ctx, memberCluster.Client, memberObjs...); err != nil {
		return nil, nil, fmt.Errorf("localfleet: preparing %s for its agent: %w", member, err)
	}
	if hubIdentity, err = hubCluster.AddUser(membership.AgentUserName(member)); err != nil {
		return nil, nil, err
	}
	if memberIdentity, err = memberCluster.AddUser("system:serviceaccount:" + namespace + ":" + agent.ServiceAccount); err != nil {
		return nil, nil, err
	}
	return hubIdentity, memberIdentity, nil
}

// StopHub stops the hub, as a crash of its pod would before a new one
// starts; the members, agents and pods keep running. StartHub runs it again.
func (f *Fleet) StopHub() error { return f.stop(hubComponent) }

const hubComponent = "hub"

func agentComponent(member string) string { return "agent " + member }

// Join prepares the member and the hub for the member's agent, runs the
// agent with its shipped RBAC on both, and waits until the hub has
// accepted the member. With Options.Karmada it first joins the member to
// Karmada in its sync mode (joinKarmada), and the agent runs in Karmada
// mode; otherwise in standalone mode.
func (f *Fleet) Join(ctx context.Context, member string) error {
	m := f.Members[member]
	if m == nil {
		return fmt.Errorf("localfleet: no member %q", member)
	}
	if f.karmada != nil {
		if err := f.joinKarmada(ctx, m); err != nil {
			return err
		}
	}
	hubIdentity, memberIdentity, err := PrepareAgent(ctx, f.Hub, m, member, namespace)
	if err != nil {
		return err
	}
	// The webhook's port and certificate stay across restarts of the agent,
	// as a Service and its Secret would.
	webhook, err := f.agentWebhook(member)
	if err != nil {
		return err
	}
	log, err := f.logger("agent-" + member)
	if err != nil {
		return err
	}
	if f.relays {
		relay, err := f.relay("agent "+member+" -> hub", hubIdentity.Host)
		if err != nil {
			return err
		}
		if hubIdentity.Host, err = relay.relayedURL(hubIdentity.Host); err != nil {
			return err
		}
		f.mu.Lock()
		f.agentRelays[member] = relay
		f.mu.Unlock()
	}
	clock := &skewedClock{}
	f.mu.Lock()
	f.agentClocks[member] = clock
	f.mu.Unlock()
	f.run(agentComponent(member), func(ctx context.Context) error {
		return agent.Run(ctx, agent.Options{
			Member: rest.CopyConfig(memberIdentity), Hub: rest.CopyConfig(hubIdentity), ClusterName: member, Identity: "agent-0",
			LeaseDuration: heartbeatDuration, RenewInterval: heartbeatInterval, Clock: clock,
			ApplyWorks: f.karmada == nil, Namespace: namespace, MetricsAddress: "0", HealthAddress: "0",
			Webhook: webhook,
			// The injected container is only written into Pod objects: the
			// pods' proxies run as local processes.
			Proxy: inject.Options{Image: "ctrlmesh-proxy:local"},
			Log:   log,
		})
	})
	return f.waitFor(ctx, time.Minute, "the hub to accept "+member, func() (bool, error) {
		accepted, err := membership.IsAccepted(ctx, f.Hub.Client, member)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return accepted, err
	})
}

// joinKarmada joins member to the Karmada control plane the hub cluster is,
// in its sync mode (controlplane.JoinPush or JoinPull), and waits until
// Karmada's Cluster for it is Ready and Karmada made its execution
// namespace, which the hub writes the member's Works into: that namespace
// is Karmada's, and PrepareAgent leaves it as it is.
func (f *Fleet) joinKarmada(ctx context.Context, member *controlplane.Cluster) error {
	join := controlplane.JoinPush
	if f.karmada[member.Name] == clusterv1alpha1.Pull {
		join = controlplane.JoinPull
	}
	if err := join(ctx, f.Hub, member); err != nil {
		return fmt.Errorf("localfleet: %w", err)
	}
	executionSpace := names.GenerateExecutionSpaceName(member.Name)
	return f.waitFor(ctx, time.Minute, "Karmada's Cluster "+member.Name+" Ready and namespace "+executionSpace, func() (bool, error) {
		cluster := &clusterv1alpha1.Cluster{}
		if err := f.Hub.Client.Get(ctx, client.ObjectKey{Name: member.Name}, cluster); err != nil {
			return false, err
		}
		if !meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1alpha1.ClusterConditionReady) {
			return false, fmt.Errorf("conditions %v", cluster.Status.Conditions)
		}
		err := f.Hub.Client.Get(ctx, client.ObjectKey{Name: executionSpace}, &corev1.Namespace{})
		return err == nil, err
	})
}

// KarmadaSyncMode is the sync mode of Karmada's Cluster for member, as
// Karmada has it; an error in standalone mode or before Join.
func (f *Fleet) KarmadaSyncMode(ctx context.Context, member string) (clusterv1alpha1.ClusterSyncMode, error) {
	if f.karmada == nil {
		return "", errors.New("localfleet: the fleet runs without Karmada")
	}
	cluster := &clusterv1alpha1.Cluster{}
	if err := f.Hub.Client.Get(ctx, client.ObjectKey{Name: member}, cluster); err != nil {
		return "", fmt.Errorf("localfleet: reading Karmada's Cluster %s: %w", member, err)
	}
	return cluster.Spec.SyncMode, nil
}

// AgentHubRelay is the relay between a member's agent and the hub; nil
// without Options.Relays or before Join.
func (f *Fleet) AgentHubRelay(member string) *Relay {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.agentRelays[member]
}

// SkewAgentClock sets a member's agent clock off the real one by skew (its
// heartbeat's renewTime, its judging of shard leases' expiry), at once and
// while it runs; 0 sets it right again.
func (f *Fleet) SkewAgentClock(member string, skew time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.agentClocks[member]
	if c == nil {
		return fmt.Errorf("localfleet: %s has not joined", member)
	}
	c.skew.Store(int64(skew))
	return nil
}

// StopAgent stops a member's agent: its heartbeat stops, and the rules in
// the member stay as they are until StartAgent runs it again.
func (f *Fleet) StopAgent(member string) error { return f.stop(agentComponent(member)) }

// StartAgent runs a member's agent again after StopAgent, with the same
// identity, webhook port and certificate.
func (f *Fleet) StartAgent(member string) error {
	if !f.restart(agentComponent(member)) {
		return fmt.Errorf("localfleet: %s has not joined", member)
	}
	return nil
}

// agentWebhook makes the serving certificate of a member's agent and picks
// its port.
func (f *Fleet) agentWebhook(member string) (agent.WebhookOptions, error) {
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		return agent.WebhookOptions{}, fmt.Errorf("localfleet: agent certificate: %w", err)
	}
	dir := filepath.Join(f.WorkDir, "agent-"+member+"-certs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return agent.WebhookOptions{}, fmt.Errorf("localfleet: %w", err)
	}
	if err := errors.Join(os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600), os.WriteFile(filepath.Join(dir, "tls.key"), keyPEM, 0o600)); err != nil {
		return agent.WebhookOptions{}, fmt.Errorf("localfleet: writing the agent certificate: %w", err)
	}
	port, err := controlplane.FreePort()
	if err != nil {
		return agent.WebhookOptions{}, err
	}
	return agent.WebhookOptions{Host: "127.0.0.1", Port: port, CertDir: dir,
		// certPEM holds the serving certificate and the CA that signed it.
		ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d", port)), CABundle: certPEM}}, nil
}

// Err reports a component, pod process or Karmada component that ended on
// its own.
func (f *Fleet) Err() error {
	if f.Hub.Karmada != nil {
		if err := f.Hub.Karmada.Err(); err != nil {
			return fmt.Errorf("localfleet: %w (logs in %s)", err, f.Hub.Karmada.Dir)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.components {
		if c.running == nil {
			continue
		}
		select {
		case <-c.running.done:
			if f.ctx.Err() == nil {
				return fmt.Errorf("localfleet: %s stopped: %v (log in %s)", c.name, c.running.err, filepath.Join(f.WorkDir, "logs"))
			}
		default:
		}
	}
	for _, p := range f.pods {
		if err := p.err(); err != nil {
			return err
		}
	}
	return nil
}

// Stop kills the pods' processes, stops the hub and the agents, then the
// API servers. WorkDir stays.
func (f *Fleet) Stop() error {
	f.mu.Lock()
	pods := f.pods
	f.pods = nil
	components := make([]string, 0, len(f.components))
	for name := range f.components {
		components = append(components, name)
	}
	f.mu.Unlock()
	for _, p := range pods {
		p.kill()
	}
	f.cancel()
	f.mu.Lock()
	for _, r := range f.agentRelays {
		r.stop()
	}
	f.mu.Unlock()
	var errs []error
	for _, name := range components {
		errs = append(errs, f.stop(name))
	}
	errs = append(errs, f.clusters.Stop())
	for _, l := range f.logFiles {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

// component is the hub or an agent, running in this process.
type component struct {
	name string
	fn   func(ctx context.Context) error
	// running is the current run; nil while stopped.
	running *run
}

// run is one run of a component.
type run struct {
	cancel context.CancelFunc
	done   chan struct{}
	// err is what the component returned; set before done closes.
	err error
}

// run registers a component and runs it until Stop or stop.
func (f *Fleet) run(name string, fn func(ctx context.Context) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &component{name: name, fn: fn}
	f.components[name] = c
	f.startLocked(c)
}

func (f *Fleet) startLocked(c *component) {
	ctx, cancel := context.WithCancel(f.ctx)
	r := &run{cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = c.fn(ctx)
		close(r.done)
	}()
	c.running = r
}

// restart runs a stopped component again; it reports whether the component
// is known. A running one is left running.
func (f *Fleet) restart(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.components[name]
	if c == nil {
		return false
	}
	if c.running == nil {
		f.startLocked(c)
	}
	return true
}

// stop ends a component's run and waits for it, returning its error.
func (f *Fleet) stop(name string) error {
	f.mu.Lock()
	c := f.components[name]
	var r *run
	if c != nil {
		r, c.running = c.running, nil
	}
	f.mu.Unlock()
	if c == nil {
		return fmt.Errorf("localfleet: %s was never started", name)
	}
	if r == nil {
		return nil
	}
	r.cancel()
	select {
	case <-r.done:
		if r.err != nil {
			return fmt.Errorf("localfleet: %s: %w", name, r.err)
		}
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("localfleet: %s did not stop within a minute", name)
	}
}

// logger logs to <WorkDir>/logs/<name>.log.
func (f *Fleet) logger(name string) (logr.Logger, error) {
	file, err := os.Create(filepath.Join(f.WorkDir, "logs", name+".log"))
	if err != nil {
		return logr.Logger{}, fmt.Errorf("localfleet: %w", err)
	}
	f.mu.Lock()
	f.logFiles = append(f.logFiles, file)
	f.mu.Unlock()
	return zap.New(zap.WriteTo(file)), nil
}

// waitFor polls done every 200 ms until it is true, it fails, a part of the
// fleet fails, or within passes.
func (f *Fleet) waitFor(ctx context.Context, within time.Duration, what string, done func() (bool, error)) error {
	deadline := time.Now().Add(within)
	for {
		ok, err := done()
		if ok {
			return nil
		}
		if fleetErr := f.Err(); fleetErr != nil {
			return fleetErr
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localfleet: waited %v for %s: %v", within, what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("localfleet: waiting for %s: %w", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// create creates objs, leaving those that exist.
func create(ctx context.Context, c client.Client, objs ...client.Object) error {
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s: %w", obj, obj.GetName(), err)
		}
	}
	return nil
}
