package controlplane

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	configv1alpha1 "github.com/karmada-io/karmada/pkg/apis/config/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ctrlmesh/ctrlmesh/test/certs"
)

// The Karmada components a Karmada control plane runs beside its
// kube-apiserver, built from source by 'make tools' (test/tools/karmada).
const (
	KarmadaAggregatedAPIServerBinary = "karmada-aggregated-apiserver"
	KarmadaControllerManagerBinary   = "karmada-controller-manager"
	KarmadaAgentBinary               = "karmada-agent"
)

// KarmadaSystemNamespace is where Karmada's components keep their state
// (leader election, the aggregated API server's Service) on the Karmada API
// server.
const KarmadaSystemNamespace = "karmada-system"

// karmadaModule is the module whose chart CRDs a Karmada control plane
// installs: the version the main module requires, the one make tools builds
// the components of.
const karmadaModule = "github.com/karmada-io/karmada"

// The aggregated API server's APIService and Service, named as Karmada's
// own deployment (artifacts/deploy) names them.
const (
	karmadaClusterAPIService     = "v1alpha1.cluster.karmada.io"
	karmadaAggregatedServiceName = "karmada-aggregated-apiserver"
)

// frontProxyClientName is the user the kube-apiserver's aggregator presents
// to aggregated API servers, the only name they accept request headers from.
const frontProxyClientName = "front-proxy-client"

// KarmadaClusterStatusUpdateFrequency is how often karmada-controller-manager
// posts a member's status (its Ready condition) to the Karmada API server;
// Karmada's default is 10s, shortened so that tests see a Cluster Ready soon.
const KarmadaClusterStatusUpdateFrequency = 2 * time.Second

// How soon Karmada marks a pull member's Cluster not Ready (Ready Unknown)
// once its karmada-agent stops: karmada-controller-manager checks every
// KarmadaClusterMonitorPeriod whether the agent renewed the cluster's lease
// (every KarmadaClusterLeaseDuration/4) within
// KarmadaClusterMonitorGracePeriod. Karmada's defaults are 5 s, 40 s and
// 40 s; shortened so that tests see it within 15–17 s, and still four
// renewals long, so that a loaded machine does not make a Cluster flap.
const (
	KarmadaClusterMonitorPeriod      = time.Second
	KarmadaClusterMonitorGracePeriod = 15 * time.Second
	KarmadaClusterLeaseDuration      = 15 * time.Second
)

// Karmada is the Karmada side of a control plane started with Spec.Karmada:
// karmada-aggregated-apiserver serving cluster.karmada.io through the
// kube-apiserver's aggregation layer, and karmada-controller-manager.
type Karmada struct {
	// Dir holds the components' certificates and logs.
	Dir string

	aggregatedAPIServer, controllerManager *Process
	// assets holds the Karmada binaries.
	assets string

	mu sync.Mutex
	// agents are the karmada-agents of the members joined in pull mode, by
	// member.
	agents map[string]*pullAgent
}

// pullAgent is the karmada-agent of a member joined in pull mode.
type pullAgent struct {
	name, logPath string
	args          []string
	// process is the running agent; nil while stopped (StopAgent).
	process *Process
}

// karmadaPaths are the files the kube-apiserver of a Karmada control plane
// reads, made before it starts.
type karmadaPaths struct {
	dir, frontProxyCA, frontProxyClient string
}

// KarmadaCRDDirs are the directories of Karmada's CRDs (policy, work,
// config, …) in the chart of the karmada module the checkout at root
// requires, found with 'go list -m'.
func KarmadaCRDDirs(root string) ([]string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", karmadaModule)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("locating the %s module (go list -m in %s): %w", karmadaModule, root, err)
	}
	bases := filepath.Join(strings.TrimSpace(string(out)), "charts", "karmada", "_crds", "bases")
	entries, err := os.ReadDir(bases)
	if err != nil {
		return nil, fmt.Errorf("reading Karmada's chart CRDs: %w", err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(bases, e.Name()))
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no CRD directories in %s", bases)
	}
	return dirs, nil
}

// prepareKarmada makes the front-proxy certificates of a Karmada control
// plane named name and returns the kube-apiserver flags that use them, as
// Karmada's own deployment sets them: the aggregator authenticates to
// karmada-aggregated-apiserver with a client certificate for
// front-proxy-client, which that server trusts through the request-header
// CA the kube-apiserver publishes in kube-system/extension-apiserver-authentication.
func prepareKarmada(workDir, name string) (karmadaPaths, map[string]string, error) {
	p := karmadaPaths{dir: filepath.Join(workDir, name+"-karmada")}
	p.frontProxyCA = filepath.Join(p.dir, "front-proxy-ca.crt")
	p.frontProxyClient = filepath.Join(p.dir, "front-proxy-client")
	ca, err := certs.NewCA("front-proxy-ca")
	if err != nil {
		return p, nil, err
	}
	if err := ca.WriteClient(p.frontProxyClient, frontProxyClientName); err != nil {
		return p, nil, err
	}
	if err := os.WriteFile(p.frontProxyCA, ca.PEM, 0o644); err != nil {
		return p, nil, fmt.Errorf("writing the front-proxy CA: %w", err)
	}
	return p, map[string]string{
		"requestheader-client-ca-file":       p.frontProxyCA,
		"requestheader-allowed-names":        frontProxyClientName,
		"requestheader-extra-headers-prefix": "X-Remote-Extra-",
		"requestheader-group-headers":        "X-Remote-Group",
		"requestheader-username-headers":     "X-Remote-User",
		"proxy-client-cert-file":             filepath.Join(p.frontProxyClient, certs.CertFile),
		"proxy-client-key-file":              filepath.Join(p.frontProxyClient, certs.KeyFile),
	}, nil
}

// startKarmada starts karmada-aggregated-apiserver against c (its etcd is
// c's, under cluster.karmada.io's own keys), registers it as the
// cluster.karmada.io APIService, waits until that is Available, then starts
// karmada-controller-manager. On error, what started is killed.
func startKarmada(ctx context.Context, c *Cluster, p karmadaPaths, assets string) (k *Karmada, err error) {
	k = &Karmada{Dir: p.dir, assets: assets}
	defer func() {
		if err != nil {
			k.stop()
			err = fmt.Errorf("starting Karmada on %q (logs in %s): %w", c.Name, p.dir, err)
		}
	}()
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KarmadaSystemNamespace}}); err != nil {
		return k, fmt.Errorf("creating namespace %s: %w", KarmadaSystemNamespace, err)
	}

	// The aggregator verifies the server as <service>.<namespace>.svc.
	serviceHost := karmadaAggregatedServiceName + "." + KarmadaSystemNamespace + ".svc"
	servingCA, err := certs.NewCA("karmada-aggregated-apiserver-ca")
	if err != nil {
		return k, err
	}
	serving := filepath.Join(p.dir, "aggregated-apiserver")
	if err := servingCA.WriteServing(serving, serviceHost, "localhost", "127.0.0.1"); err != nil {
		return k, err
	}
	port, err := FreePort()
	if err != nil {
		return k, err
	}
	etcd := c.env.ControlPlane.Etcd.URL.String()
	k.aggregatedAPIServer, err = StartProcess(KarmadaAggregatedAPIServerBinary, filepath.Join(p.dir, "aggregated-apiserver.log"), false,
		filepath.Join(assets, KarmadaAggregatedAPIServerBinary),
		"--kubeconfig="+c.KubeconfigPath,
		"--authentication-kubeconfig="+c.KubeconfigPath,
		"--authorization-kubeconfig="+c.KubeconfigPath,
		"--etcd-servers="+etcd,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--tls-cert-file="+filepath.Join(serving, certs.CertFile),
		"--tls-private-key-file="+filepath.Join(serving, certs.KeyFile),
		"--tls-min-version=VersionTLS13",
	)
	if err != nil {
		return k, err
	}

	// An ExternalName Service: the aggregator resolves it to
	// localhost:<the APIService's port>, with no endpoints to keep.
	service := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: KarmadaSystemNamespace, Name: karmadaAggregatedServiceName},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"},
	}
	if err := c.Client.Create(ctx, service); err != nil {
		return k, fmt.Errorf("creating the Service of %s: %w", KarmadaAggregatedAPIServerBinary, err)
	}
	// Unstructured: the kube-aggregator's Go types are no dependency of
	// ctrlmesh's.
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": karmadaClusterAPIService},
		"spec": map[string]any{
			"group": "cluster.karmada.io", "version": "v1alpha1",
			"service":              map[string]any{"namespace": KarmadaSystemNamespace, "name": karmadaAggregatedServiceName, "port": int64(port)},
			"caBundle":             base64.StdEncoding.EncodeToString(servingCA.PEM),
			"groupPriorityMinimum": int64(2000), "versionPriority": int64(10),
		},
	}}
	apiService.SetGroupVersionKind(apiServiceGVK)
	if err := c.Client.Create(ctx, apiService); err != nil {
		return k, fmt.Errorf("creating APIService %s: %w", karmadaClusterAPIService, err)
	}
	if err := waitAPIServiceAvailable(ctx, c.Client, k.aggregatedAPIServer, karmadaClusterAPIService); err != nil {
		return k, err
	}

	k.controllerManager, err = StartProcess(KarmadaControllerManagerBinary, filepath.Join(p.dir, "controller-manager.log"), false,
		filepath.Join(assets, KarmadaControllerManagerBinary),
		"--kubeconfig="+c.KubeconfigPath,
		"--metrics-bind-address=0",
		"--health-probe-bind-address=0",
		"--cluster-status-update-frequency="+KarmadaClusterStatusUpdateFrequency.String(),
		"--cluster-monitor-period="+KarmadaClusterMonitorPeriod.String(),
		"--cluster-monitor-grace-period="+KarmadaClusterMonitorGracePeriod.String(),
	)
	if err != nil {
		return k, err
	}
	return k, nil
}

// waitAPIServiceAvailable waits until the aggregator reports the APIService
// Available, failing early when the server behind it exits.
func waitAPIServiceAvailable(ctx context.Context, c client.Client, server *Process, name string) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := server.ExitError(); err != nil {
			return false, err
		}
		available, reason, err := APIServiceAvailable(ctx, c, name)
		if apierrors.IsNotFound(err) {
			return false, err
		}
		if err != nil {
			reason = err.Error()
		}
		last = reason
		return available, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for APIService %s to be Available (last: %s): %w", name, last, err)
	}
	return nil
}

var apiServiceGVK = schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"}

// APIServiceAvailable tells whether the aggregator reports APIService name
// Available, and the reason and message of its Available condition.
func APIServiceAvailable(ctx context.Context, c client.Client, name string) (available bool, reason string, err error) {
	svc := &unstructured.Unstructured{}
	svc.SetGroupVersionKind(apiServiceGVK)
	if err := c.Get(ctx, client.ObjectKey{Name: name}, svc); err != nil {
		return false, "", err
	}
	conditions, _, err := unstructured.NestedSlice(svc.Object, "status", "conditions")
	if err != nil {
		return false, "", fmt.Errorf("reading the conditions of APIService %s: %w", name, err)
	}
	for _, item := range conditions {
		cond, _ := item.(map[string]any)
		if cond["type"] == "Available" {
			return cond["status"] == "True", fmt.Sprintf("%v: %v", cond["reason"], cond["message"]), nil
		}
	}
	return false, "no Available condition yet", nil
}

// Err reports a Karmada component (agents included) that exited on its own.
func (k *Karmada) Err() error {
	var errs []error
	for _, p := range k.processes() {
		if p != nil {
			errs = append(errs, p.ExitError())
		}
	}
	return errors.Join(errs...)
}

// processes are the Karmada components in the order stop kills them: the
// agents and the controller manager first, so that they do not act on an
// API server going away.
func (k *Karmada) processes() []*Process {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*Process
	for _, member := range slices.Sorted(maps.Keys(k.agents)) {
		if p := k.agents[member].process; p != nil {
			out = append(out, p)
		}
	}
	return append(out, k.controllerManager, k.aggregatedAPIServer)
}

// stop kills the Karmada components.
func (k *Karmada) stop() {
	for _, p := range k.processes() {
		if p != nil {
			p.Kill()
		}
	}
}

// KarmadaClusterNamespace is where 'karmadactl join' keeps a member's
// credentials: the ServiceAccount in the member, the Secret in Karmada.
const KarmadaClusterNamespace = "karmada-cluster"

// memberTokenLifetime is how long the token a push-mode member is joined
// with lasts: beyond any test or demo run.
const memberTokenLifetime = 24 * time.Hour

// JoinPush registers member with the Karmada control plane k runs on,
// as 'karmadactl join' does in push mode: in the member a ServiceAccount
// karmada-<member> in karmada-cluster with all rights, in Karmada a Secret
// karmada-cluster/<member> with its token and the member's CA, and a Cluster
// <member> of sync mode Push naming both, with the member's ID (its kube-system
// UID) as spec.id. karmadactl takes the token from a
// legacy ServiceAccount token Secret, which needs kube-controller-manager's
// token controller; the test clusters run none, so the token comes from the
// TokenRequest API. Karmada's cluster controller then creates the execution
// namespace karmada-es-<member>, and its cluster-status controller marks the
// Cluster Ready once the member's API server answers.
func JoinPush(ctx context.Context, karmada, member *Cluster) error {
	if karmada.Karmada == nil {
		return fmt.Errorf("clusters: joining %q: cluster %q is not a Karmada control plane", member.Name, karmada.Name)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: KarmadaClusterNamespace, Name: names.GenerateServiceAccountName(member.Name)}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: names.GenerateRoleName(sa.Name)},
		// karmadactl binds a ClusterRole of its own granting everything
		// (util.ClusterPolicyRules); cluster-admin is the same.
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name}},
	}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KarmadaClusterNamespace}}, sa, binding,
	} {
		if err := member.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("clusters: joining %q: creating %T %s in the member: %w", member.Name, obj, obj.GetName(), err)
		}
	}
	expiration := int64(memberTokenLifetime / time.Second)
	token := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiration}}
	if err := member.Client.SubResource("token").Create(ctx, sa, token); err != nil {
		return fmt.Errorf("clusters: joining %q: requesting a token for ServiceAccount %s/%s: %w", member.Name, sa.Namespace, sa.Name, err)
	}

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: KarmadaClusterNamespace, Name: member.Name},
		Data: map[string][]byte{
			clusterv1alpha1.SecretTokenKey:  []byte(token.Status.Token),
			clusterv1alpha1.SecretCADataKey: member.Config.CAData,
		},
	}
	// The member's ID, as karmadactl join (and karmada-agent) writes it:
	// the UID of its kube-system namespace (util.ObtainClusterID).
	var kubeSystem corev1.Namespace
	if err := member.Client.Get(ctx, client.ObjectKey{Name: metav1.NamespaceSystem}, &kubeSystem); err != nil {
		return fmt.Errorf("clusters: joining %q: reading its cluster ID: %w", member.Name, err)
	}
	cluster := &clusterv1alpha1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: member.Name},
		Spec: clusterv1alpha1.ClusterSpec{
			ID:          string(kubeSystem.UID),
			SyncMode:    clusterv1alpha1.Push,
			APIEndpoint: member.Config.Host,
			SecretRef:   &clusterv1alpha1.LocalSecretReference{Namespace: secret.Namespace, Name: secret.Name},
		},
	}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KarmadaClusterNamespace}}, secret, cluster,
	} {
		if err := karmada.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("clusters: joining %q: creating %T %s in Karmada: %w", member.Name, obj, obj.GetName(), err)
		}
	}
	return nil
}

// JoinPull registers member with the Karmada control plane k runs on in
// pull mode: it starts karmada-agent for member (its log beside the other
// Karmada logs), which creates the Cluster <member> of sync mode Pull,
// reports its status and lease, and applies the Works of
// karmada-es-<member> itself. Stop kills the agent with the other Karmada
// components.
//
// The agent talks to Karmada as its admin: 'karmadactl register' gets the
// agent a client certificate through a bootstrap token and a
// CertificateSigningRequest, which needs kube-controller-manager's signer,
// and the test clusters run none. It reports no member credentials to
// Karmada (--report-secrets=None): those would come from legacy
// ServiceAccount token Secrets, which need its token controller.
func JoinPull(ctx context.Context, karmada, member *Cluster) error {
	k := karmada.Karmada
	if k == nil {
		return fmt.Errorf("clusters: joining %q: cluster %q is not a Karmada control plane", member.Name, karmada.Name)
	}
	// The agent's leader election lock lives in the member's karmada-system.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KarmadaSystemNamespace}}
	if err := member.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("clusters: joining %q: creating namespace %s in the member: %w", member.Name, ns.Name, err)
	}
	agent := &pullAgent{
		name: KarmadaAgentBinary + " of " + member.Name, logPath: filepath.Join(k.Dir, "agent-"+member.Name+".log"),
		args: []string{
			"--karmada-kubeconfig=" + karmada.KubeconfigPath,
			"--kubeconfig=" + member.KubeconfigPath,
			"--cluster-name=" + member.Name,
			"--cluster-api-endpoint=" + member.Config.Host,
			"--report-secrets=None",
			"--metrics-bind-address=0",
			"--health-probe-bind-address=0",
			"--cluster-status-update-frequency=" + KarmadaClusterStatusUpdateFrequency.String(),
			"--cluster-lease-duration=" + KarmadaClusterLeaseDuration.String(),
		},
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.agents[member.Name] != nil {
		return fmt.Errorf("clusters: joining %q: it already joined in pull mode", member.Name)
	}
	if err := k.startAgentLocked(agent); err != nil {
		return fmt.Errorf("clusters: joining %q: %w", member.Name, err)
	}
	if k.agents == nil {
		k.agents = map[string]*pullAgent{}
	}
	k.agents[member.Name] = agent
	return nil
}

// startAgentLocked runs a pull member's karmada-agent. The caller holds mu.
func (k *Karmada) startAgentLocked(a *pullAgent) error {
	p, err := StartProcess(a.name, a.logPath, false, filepath.Join(k.assets, KarmadaAgentBinary), a.args...)
	if err != nil {
		return err
	}
	a.process = p
	return nil
}

// StopAgent kills the karmada-agent of a member joined in pull mode, as a
// crash of its pod would: the member's Works are no longer applied nor
// their status reported, and once the agent's cluster lease is not renewed
// for KarmadaClusterMonitorGracePeriod, karmada-controller-manager marks
// the Cluster's Ready Unknown. StartAgent runs it again.
func (k *Karmada) StopAgent(member string) error {
	k.mu.Lock()
	a := k.agents[member]
	var p *Process
	if a != nil {
		p, a.process = a.process, nil
	}
	k.mu.Unlock()
	if a == nil {
		return fmt.Errorf("clusters: %q did not join in pull mode: it has no karmada-agent", member)
	}
	if p != nil {
		p.Kill()
	}
	return nil
}

// StartAgent runs the karmada-agent of a member joined in pull mode again
// after StopAgent, with the same flags; its log goes on. A running agent
// is left running.
func (k *Karmada) StartAgent(member string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	a := k.agents[member]
	if a == nil {
		return fmt.Errorf("clusters: %q did not join in pull mode: it has no karmada-agent", member)
	}
	if a.process != nil {
		return nil
	}
	return k.startAgentLocked(a)
}

// ShardRouteInterpreterFile is the ResourceInterpreterCustomization ctrlmesh
// ships for ShardRoute, relative to the checkout: Karmada reflects a member
// ShardRoute's status into its Work and judges its health by it.
const ShardRouteInterpreterFile = "deploy/karmada/shardroute-interpreter.yaml"

// InstallShardRouteInterpreter creates the shipped ShardRoute
// ResourceInterpreterCustomization (ShardRouteInterpreterFile of the
// checkout at root) on the Karmada control plane c, as a user installing
// ctrlmesh on Karmada applies it.
func InstallShardRouteInterpreter(ctx context.Context, c *Cluster, root string) error {
	data, err := os.ReadFile(filepath.Join(root, ShardRouteInterpreterFile))
	if err != nil {
		return fmt.Errorf("clusters: reading the ShardRoute interpreter: %w", err)
	}
	interpreter := &configv1alpha1.ResourceInterpreterCustomization{}
	if err := yaml.UnmarshalStrict(data, interpreter); err != nil {
		return fmt.Errorf("clusters: decoding %s: %w", ShardRouteInterpreterFile, err)
	}
	if err := c.Client.Create(ctx, interpreter); err != nil {
		return fmt.Errorf("clusters: creating the ShardRoute interpreter on %q: %w", c.Name, err)
	}
	return nil
}
