package localfleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
)

// The binaries of a pod's two containers, in Options.BinDir.
const (
	proxyBinary    = "ctrlmesh-proxy"
	operatorBinary = "demo-operator"
)

// OperatorLeaseDuration is the demo operators' leader-election lease:
// short, so that a killed pod's shard lease expires, and its buckets move,
// within seconds; long enough that a renewal (each attempt may take half
// the renew deadline) survives a loaded 2-core machine, where a 3 s renew
// deadline once did not.
const OperatorLeaseDuration = 8 * time.Second

const (
	operatorRenewDeadline = 6 * time.Second
	operatorRetryPeriod   = time.Second
)

var operatorLeaderElectionFlags = []string{"--lease-duration=" + OperatorLeaseDuration.String(),
	"--renew-deadline=" + operatorRenewDeadline.String(), "--retry-period=" + operatorRetryPeriod.String()}

// PodSpec describes an operator pod.
type PodSpec struct {
	// Cluster is the member the pod runs in.
	Cluster, Namespace, Name string
	// Labels of the Pod object, which ShardingConfig selectors match.
	Labels map[string]string
	// RulesName names the ShardRoute the pod's proxy enforces: that of the
	// ShardingConfig selecting the pod.
	RulesName string
	// ObjectsOnHub points the operator, through its proxy, at the hub's API
	// server instead of its member's (Fleet scope over the hub's objects).
	// The proxy still takes its rules from the member and keeps the shard
	// locks there, where the member's agent reports the shard leaders.
	ObjectsOnHub bool
	// RestartOperator runs the demo operator again whenever it exits, as a
	// kubelet would (restartPolicy Always): an operator exits when it loses
	// its leader election, which a proxy that stopped serving it causes.
	// Without it, such an exit is an error of the fleet (Err).
	RestartOperator bool
	// OperatorArgs are added to the demo operator's flags, such as
	// --record-file or --reconcile-delay.
	OperatorArgs []string
}

// Pod is an operator pod: a ready Pod object in its member, and its proxy
// and demo operator running as local processes with its name.
type Pod struct {
	PodSpec
	proxy, operator *controlplane.Process
	// upstreamRelay carries the proxy's link to its upstream API server,
	// with Options.Relays.
	upstreamRelay *Relay
}

// UpstreamRelay is the relay between the pod's proxy and its upstream API
// server (the one its operator's objects live in); nil without
// Options.Relays.
func (p *Pod) UpstreamRelay() *Relay { return p.upstreamRelay }

// StartPod creates the Pod object, ready, then runs the proxy with the
// pod's identity and, once the proxy serves, the demo operator behind it.
// The operator elects its leader on the Lease "demo-operator", which the
// proxy renames per shard. Logs go to <WorkDir>/logs.
func (f *Fleet) StartPod(ctx context.Context, spec PodSpec) (*Pod, error) {
	m := f.Members[spec.Cluster]
	if m == nil {
		return nil, fmt.Errorf("localfleet: no member %q", spec.Cluster)
	}
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: spec.Name, Labels: spec.Labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "operator", Image: operatorBinary + ":local"}}},
	}
	if err := create(ctx, m.Client, obj); err != nil {
		return nil, fmt.Errorf("localfleet: pod %s/%s: %w", spec.Cluster, spec.Name, err)
	}
	// No kubelet runs: the pod is marked running and ready as one would.
	obj.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := m.Client.Status().Update(ctx, obj); err != nil {
		return nil, fmt.Errorf("localfleet: marking pod %s/%s ready: %w", spec.Cluster, spec.Name, err)
	}

	p := &Pod{PodSpec: spec}
	f.mu.Lock()
	f.pods = append(f.pods, p)
	f.mu.Unlock()
	logPrefix := filepath.Join(f.WorkDir, "logs", spec.Cluster+"-"+spec.Name)
	operatorKubeconfig := logPrefix + "-operator.kubeconfig"
	upstream, rulesFrom := m.KubeconfigPath, ""
	if spec.ObjectsOnHub {
		upstream, rulesFrom = f.Hub.KubeconfigPath, m.KubeconfigPath
	}
	if f.relays {
		upstreamName, server := spec.Cluster, m.Config.Host
		if spec.ObjectsOnHub {
			upstreamName, server = HubName, f.Hub.Config.Host
		}
		relay, err := f.relay(fmt.Sprintf("proxy %s/%s -> %s", spec.Cluster, spec.Name, upstreamName), server)
		if err != nil {
			return nil, err
		}
		f.mu.Lock()
		p.upstreamRelay = relay
		f.mu.Unlock()
		relayed := logPrefix + "-upstream.kubeconfig"
		if err := relay.relayedKubeconfig(upstream, relayed); err != nil {
			return nil, err
		}
		// The rules, when they live on the same API server, come through
		// the relay too: the link is the proxy's whole connection to it.
		upstream = relayed
	}
	proxyArgs := []string{"--pod-name=" + spec.Name, "--pod-namespace=" + spec.Namespace, "--rules-name=" + spec.RulesName,
		"--upstream-kubeconfig=" + upstream, "--rules-kubeconfig=" + rulesFrom, "--listen-address=127.0.0.1:0",
		"--health-address=", "--operator-kubeconfig=" + operatorKubeconfig}
	proxy, err := controlplane.StartProcess(spec.Name+" proxy", logPrefix+"-proxy.log", false, filepath.Join(f.binDir, proxyBinary), proxyArgs...)
	if err != nil {
		return nil, err
	}
	f.setProcesses(p, proxy, nil)
	// The proxy writes the operator's kubeconfig once it listens.
	if err := f.waitFor(ctx, 30*time.Second, "the proxy of "+spec.Name+" to serve", func() (bool, error) {
		_, err := os.Stat(operatorKubeconfig)
		return err == nil, err
	}); err != nil {
		return nil, err
	}
	args := append([]string{"--kubeconfig=" + operatorKubeconfig, "--pod-name=" + spec.Name, "--leader-election-namespace=" + spec.Namespace,
		"--webhook-port=0", "--health-addr=0", "--metrics-addr=0"}, operatorLeaderElectionFlags...)
	args = append(args, spec.OperatorArgs...)
	operator, err := controlplane.StartProcess(spec.Name+" operator", logPrefix+"-operator.log", spec.RestartOperator, filepath.Join(f.binDir, operatorBinary), args...)
	if err != nil {
		return nil, err
	}
	f.setProcesses(p, proxy, operator)
	return p, nil
}

// OperatorPID is the process ID of the pod's demo operator, for reading its
// memory use.
func (p *Pod) OperatorPID() int { return p.operator.PID() }

// ProxyPID is the process ID of the pod's ctrlmesh-proxy, for reading its
// memory use.
func (p *Pod) ProxyPID() int { return p.proxy.PID() }

// OperatorRestarts counts how often the demo operator ran again after
// exiting (PodSpec.RestartOperator).
func (p *Pod) OperatorRestarts() int { return p.operator.Restarts() }

// setProcesses records the pod's processes, which Err reads.
func (f *Fleet) setProcesses(p *Pod, proxy, operator *controlplane.Process) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p.proxy, p.operator = proxy, operator
}

// KillPod crashes the pod: its proxy is killed first, so that the operator
// cannot release its lease, then the operator; then the Pod object is
// deleted, as the kubelet would once the containers stopped.
func (f *Fleet) KillPod(ctx context.Context, p *Pod) error {
	p.kill()
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	if err := f.Members[p.Cluster].Client.Delete(ctx, obj, client.GracePeriodSeconds(0)); err != nil {
		return fmt.Errorf("localfleet: deleting pod %s/%s: %w", p.Cluster, p.Name, err)
	}
	return nil
}

func (p *Pod) kill() {
	for _, proc := range []*controlplane.Process{p.proxy, p.operator} {
		if proc != nil {
			proc.Kill()
		}
	}
	if p.upstreamRelay != nil {
		p.upstreamRelay.stop()
	}
}

// err reports a process of the pod that ended without being killed.
func (p *Pod) err() error {
	var errs []error
	for _, proc := range []*controlplane.Process{p.proxy, p.operator} {
		if proc != nil {
			errs = append(errs, proc.ExitError())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("localfleet: pod %s/%s: %w", p.Cluster, p.Name, err)
	}
	return nil
}

// ShardingConfig shards the demo operator pods labeled app=<name> in
// clusters: the ConfigMaps they reconcile by namespace, and their leader
// election per shard. It is named name, in namespace; callers add a canary
// or change the scope.
func ShardingConfig(namespace, name string, clusters []string) *ctrlmeshv1alpha1.ShardingConfig {
	return &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector:   metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: operator.DefaultLeaderElectionID},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
			}}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: clusters},
			Scope:    ctrlmeshv1alpha1.ScopePerCluster,
		},
	}
}
