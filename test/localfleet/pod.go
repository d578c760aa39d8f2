package localfleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
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
	// OperatorArgs are added to the demo operator's flags, such as
	// --record-file or --reconcile-delay.
	OperatorArgs []string
}

// Pod is an operator pod: a ready Pod object in its member, and its proxy
// and demo operator running as local processes with its name.
type Pod struct {
	PodSpec
	proxy, operator *controlplane.Process
	// mu orders a kill and an operator's restart; gone is set once the
	// pod is killed: its operator is not started again.
	mu   sync.Mutex
	gone atomic.Bool
	// restarts counts the operator's restarts.
	restarts atomic.Int32
}

// operatorRestartDelay is how long after its operator exited the pod starts
// it again, as the kubelet does for a container of a pod whose restart
// policy is Always (with its backoff's first step).
const operatorRestartDelay = time.Second

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
	port, err := controlplane.FreePort()
	if err != nil {
		return nil, err
	}
	logPrefix := filepath.Join(f.WorkDir, "logs", spec.Cluster+"-"+spec.Name)
	operatorKubeconfig := logPrefix + "-operator.kubeconfig"
	upstream, rulesFrom := m.KubeconfigPath, ""
	if spec.ObjectsOnHub {
		upstream, rulesFrom = f.Hub.KubeconfigPath, m.KubeconfigPath
	}
	proxyArgs := []string{"--pod-name=" + spec.Name, "--pod-namespace=" + spec.Namespace, "--rules-name=" + spec.RulesName,
		"--upstream-kubeconfig=" + upstream, "--rules-kubeconfig=" + rulesFrom, fmt.Sprintf("--listen-address=127.0.0.1:%d", port),
		"--health-address=", "--operator-kubeconfig=" + operatorKubeconfig}
	proxy, err := controlplane.StartProcess(spec.Name+" proxy", logPrefix+"-proxy.log", filepath.Join(f.binDir, proxyBinary), proxyArgs...)
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
	start := func() (*controlplane.Process, error) {
		return controlplane.StartProcess(spec.Name+" operator", logPrefix+"-operator.log", filepath.Join(f.binDir, operatorBinary), args...)
	}
	operator, err := start()
	if err != nil {
		return nil, err
	}
	f.setProcesses(p, proxy, operator)
	go f.restartOperator(p, operator, start)
	return p, nil
}

// restartOperator starts the pod's operator again whenever it exits on its
// own — an operator exits when it loses its leader election, as when its
// proxy stops serving — as the kubelet would, until the pod is killed or
// the fleet stops. Its log goes on in the same file.
func (f *Fleet) restartOperator(p *Pod, operator *controlplane.Process, start func() (*controlplane.Process, error)) {
	for {
		<-operator.Done()
		if p.gone.Load() || operator.Killed() || f.ctx.Err() != nil {
			return
		}
		time.Sleep(operatorRestartDelay)
		// Under the pod's lock: a kill sees either the exited process
		// or the new one, never neither.
		p.mu.Lock()
		if p.gone.Load() || f.ctx.Err() != nil {
			p.mu.Unlock()
			return
		}
		next, err := start()
		if err != nil {
			// Err reports the exited process.
			p.mu.Unlock()
			return
		}
		p.restarts.Add(1)
		f.mu.Lock()
		p.operator = next
		f.mu.Unlock()
		p.mu.Unlock()
		operator = next
	}
}

// OperatorRestarts is how often the pod's operator was started again after
// it exited.
func (p *Pod) OperatorRestarts() int { return int(p.restarts.Load()) }

// OperatorPID is the process ID of the pod's demo operator, for reading its
// memory use.
func (p *Pod) OperatorPID() int { return p.operator.PID() }

// ProxyPID is the process ID of the pod's ctrlmesh-proxy, for reading its
// memory use.
func (p *Pod) ProxyPID() int { return p.proxy.PID() }

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
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gone.Store(true)
	for _, proc := range []*controlplane.Process{p.proxy, p.operator} {
		if proc != nil {
			proc.Kill()
		}
	}
}

// err reports a process of the pod that ended without being killed; an
// operator that exited is reported only while it is not started again.
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
