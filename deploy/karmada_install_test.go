package deploy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	policyv1alpha1 "github.com/karmada-io/karmada/pkg/apis/policy/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The Karmada fleet of TestInstallOnKarmada, started on first use and
// stopped by TestMain: a host cluster for the hub's pods, a Karmada control
// plane, and two members. No cluster gets a CRD but Karmada's own, so every
// ctrlmesh CRD found later came from the charts.
var (
	karmadaOnce  sync.Once
	karmadaGroup *env.Fleet
	karmadaErr   error
)

func karmadaFleet(t *testing.T) *env.Fleet {
	t.Helper()
	karmadaOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		karmadaGroup, karmadaErr = env.Start(ctx, env.Options{
			Clusters: []env.ClusterSpec{{Name: "host"}, {Name: "karmada", Karmada: true}, {Name: "member1"}, {Name: "member2"}},
			CRDDirs:  []string{}, // not nil: no ctrlmesh, Work or ManagedCluster CRDs
		})
	})
	if karmadaErr != nil {
		t.Fatal(karmadaErr)
	}
	return karmadaGroup
}

func stopKarmadaFleet() {
	if karmadaGroup != nil {
		if err := karmadaGroup.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
}

// helmInstall is one `helm install` command of the README.
type helmInstall struct {
	line                     string
	chart, namespace, target string // target: the --kube-context
	createNamespace          bool
	sets                     []string
}

// readmeHelmInstalls returns the `helm install` commands of the README
// section titled section, continuation lines joined.
func readmeHelmInstalls(t *testing.T, section string) []helmInstall {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "\n## "+section+"\n")
	if start < 0 {
		t.Fatalf("README.md has no section %q", section)
	}
	text = text[start+1:]
	if end := strings.Index(text[3:], "\n## "); end >= 0 {
		text = text[:end+3]
	}
	var out []helmInstall
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if !strings.HasPrefix(line, "helm install ") {
			continue
		}
		words, err := shellWords(line)
		if err != nil {
			t.Fatalf("README: %q: %v", line, err)
		}
		cmd := helmInstall{line: line}
		var positional []string
		for j := 2; j < len(words); j++ {
			w := words[j]
			next := func() string {
				j++
				if j >= len(words) {
					t.Fatalf("README: %q: %s without a value", line, w)
				}
				return words[j]
			}
			switch w {
			case "-n", "--namespace":
				cmd.namespace = next()
			case "--kube-context":
				cmd.target = next()
			case "--set":
				cmd.sets = append(cmd.sets, next())
			case "--create-namespace":
				cmd.createNamespace = true
			default:
				if strings.HasPrefix(w, "-") {
					t.Fatalf("README: %q: flag %s, which this test does not know how to follow", line, w)
				}
				positional = append(positional, w)
			}
		}
		if len(positional) != 2 || cmd.namespace == "" || cmd.target == "" {
			t.Fatalf("README: %q: want helm install <release> <chart> -n <namespace> --kube-context <cluster>", line)
		}
		cmd.chart = strings.TrimPrefix(positional[1], "deploy/")
		out = append(out, cmd)
	}
	return out
}

// shellWords splits a command line as sh does for words without
// expansions: blanks separate, quotes group.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'' || c == '"':
			end := strings.IndexByte(line[i+1:], c)
			if end < 0 {
				return nil, fmt.Errorf("unclosed %c", c)
			}
			cur.WriteString(line[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// TestInstallOnKarmada follows README "Install on Karmada" on a real
// Karmada control plane: member1 joins by push, member2 by pull (what
// karmadactl join and register do), then each of the section's helm install
// commands is rendered with exactly its values and applied server-side, for
// real, to its cluster (--kube-context: karmada, host, or each member for
// $M). Every object must land in its cluster and none elsewhere: the CRDs,
// RBAC and members' identities in Karmada, the workload in the host, no
// karmada-es namespace rendered. Then the hub runs with the flags of the
// host release's Deployment and the kubeconfig of the Secret it mounts, and
// must lead (its Lease on Karmada) and accept a member on Karmada with the
// RBAC the Karmada release gave it.
func TestInstallOnKarmada(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	commands := readmeHelmInstalls(t, "Install on Karmada")
	byTarget := map[string]helmInstall{}
	for _, c := range commands {
		byTarget[c.target] = c
	}
	for _, want := range []string{"karmada", "host", "$M"} {
		if _, ok := byTarget[want]; !ok || len(byTarget) != 3 {
			t.Fatalf("README's Install on Karmada: helm install commands for %v; want one each for --kube-context karmada, host and $M", mapKeys(byTarget))
		}
	}
	if byTarget["karmada"].chart != hubChart || byTarget["host"].chart != hubChart || byTarget["$M"].chart != agentChart {
		t.Fatalf("README's Install on Karmada: want the hub chart on karmada and host, the agent chart per member: %+v", commands)
	}

	fleet := karmadaFleet(t)
	karmada, host := fleet.Cluster("karmada"), fleet.Cluster("host")
	members := []*env.Cluster{fleet.Cluster("member1"), fleet.Cluster("member2")}

	// 1. The members join Karmada, which makes their execution namespaces.
	if err := controlplane.JoinPush(ctx, karmada, members[0]); err != nil {
		t.Fatal(err)
	}
	if err := controlplane.JoinPull(ctx, karmada, members[1]); err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		env.Eventually(t, 2*time.Minute, "Karmada's execution namespace of "+m.Name, func() error {
			return karmada.Client.Get(ctx, client.ObjectKey{Name: names.GenerateExecutionSpaceName(m.Name)}, &corev1.Namespace{})
		})
	}

	// 2. The hub's API objects on Karmada, in a namespace Karmada does
	// not propagate to the members, as the README's kubectl lines make it.
	api := byTarget["karmada"]
	labelLine := fmt.Sprintf("kubectl --context karmada label namespace %s %s=true", api.namespace, policyv1alpha1.NamespaceSkipAutoPropagationLabel)
	if data, err := os.ReadFile(filepath.Join("..", "README.md")); err != nil || !strings.Contains(string(data), labelLine) {
		t.Fatalf("README.md lacks %q (%v)", labelLine, err)
	}
	if err := karmada.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: api.namespace,
		Labels: map[string]string{policyv1alpha1.NamespaceSkipAutoPropagationLabel: "true"}}}); err != nil {
		t.Fatal(err)
	}
	apiObjs := render(t, api.chart, api.namespace, api.sets)
	for _, u := range apiObjs {
		if u.GetKind() == "Namespace" && strings.HasPrefix(u.GetName(), names.ExecutionSpacePrefix) {
			t.Errorf("%s rendered: Karmada owns it", describe(u))
		}
		if slices.Contains([]string{"Deployment", "PodDisruptionBudget", "Service"}, u.GetKind()) {
			t.Errorf("%s rendered for the Karmada API server, which runs no pods", describe(u))
		}
	}
	install(ctx, t, karmada, api, apiObjs)
	for _, name := range []string{"shardingconfigs.ctrlmesh.io", "managedclusters.cluster.open-cluster-management.io"} {
		env.Eventually(t, time.Minute, "CRD "+name+" established in Karmada", func() error {
			crd := &unstructured.Unstructured{}
			crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
			if err := karmada.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
				return err
			}
			conditions, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conditions {
				if c, _ := c.(map[string]any); c["type"] == string(apiextensionsv1.Established) && c["status"] == string(apiextensionsv1.ConditionTrue) {
					return nil
				}
			}
			return fmt.Errorf("conditions %v", conditions)
		})
	}
	for _, u := range apiObjs {
		mustExist(ctx, t, karmada, u)
	}

	// 3. The hub's kubeconfig Secret in the host, from a token of its
	// ServiceAccount in Karmada. The test clusters run no token
	// controller to fill ctrlmesh-hub-token; the TokenRequest API is the
	// README's other way (kubectl create token).
	ensureNamespace(ctx, t, host, byTarget["host"].namespace) // step 3 creates it
	token := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: api.namespace, Name: hub.ServiceAccount}}
	if err := karmada.Client.SubResource("token").Create(ctx, sa, token); err != nil {
		t.Fatalf("a token of the hub's ServiceAccount %s/%s in Karmada: %v", sa.Namespace, sa.Name, err)
	}
	kubeconfig, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"karmada": {Server: karmada.Config.Host, CertificateAuthorityData: karmada.Config.CAData}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"ctrlmesh-hub": {Token: token.Status.Token}},
		Contexts:       map[string]*clientcmdapi.Context{"karmada": {Cluster: "karmada", AuthInfo: "ctrlmesh-hub"}},
		CurrentContext: "karmada",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: byTarget["host"].namespace, Name: "ctrlmesh-hub-karmada-kubeconfig"},
		Data:       map[string][]byte{"kubeconfig": kubeconfig},
	}); err != nil {
		t.Fatal(err)
	}

	// 4. The hub in the host.
	workload := byTarget["host"]
	hostObjs := render(t, workload.chart, workload.namespace, workload.sets)
	for _, u := range hostObjs {
		if !slices.Contains([]string{"Deployment", "ServiceAccount", "PodDisruptionBudget", "Service"}, u.GetKind()) {
			t.Errorf("%s rendered for the host, which gets only the hub's workload", describe(u))
		}
	}
	install(ctx, t, host, workload, hostObjs)
	for _, u := range hostObjs {
		mustExist(ctx, t, host, u)
	}
	// Nothing of the API side reached the host, nor the workload Karmada;
	// the ServiceAccount ctrlmesh-hub is in both, by design: the pods'
	// in the host, the hub's identity in Karmada.
	hubSA := func(u *unstructured.Unstructured) bool {
		return u.GetKind() == "ServiceAccount" && u.GetName() == hub.ServiceAccount
	}
	for _, u := range apiObjs {
		if !hubSA(u) {
			mustNotExist(ctx, t, host, u)
		}
	}
	for _, u := range hostObjs {
		if !hubSA(u) {
			mustNotExist(ctx, t, karmada, u)
		}
	}
	var d appsv1.Deployment
	decode(t, mustFind(t, hostObjs, "Deployment", "ctrlmesh-hub"), &d)
	runHubOfDeployment(ctx, t, host, karmada, &d)

	// Karmada propagates a namespace without the label to the members,
	// the hub's namespace, made before, it did not.
	probe := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "propagation-probe"}}
	if err := karmada.Client.Create(ctx, probe); err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		env.Eventually(t, 2*time.Minute, "namespace "+probe.Name+" propagated to "+m.Name, func() error {
			return m.Client.Get(ctx, client.ObjectKeyFromObject(probe), &corev1.Namespace{})
		})
		if err := m.Client.Get(ctx, client.ObjectKey{Name: api.namespace}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
			t.Errorf("namespace %s in %s: %v; want NotFound, Karmada must not propagate the hub's namespace", api.namespace, m.Name, err)
		}
	}

	// 5. The agents, in Karmada mode.
	for _, m := range members {
		agentCmd := byTarget["$M"]
		sets := make([]string, len(agentCmd.sets))
		for i, s := range agentCmd.sets {
			sets[i] = strings.ReplaceAll(s, "$M", m.Name)
		}
		agentCmd.sets = sets
		objs := render(t, agentCmd.chart, agentCmd.namespace, sets)
		var ad appsv1.Deployment
		decode(t, mustFind(t, objs, "Deployment", "ctrlmesh-agent"), &ad)
		args := parseArgs(ad.Spec.Template.Spec.Containers[0].Args)
		if args["--apply-works"] != "false" || args["--cluster-name"] != m.Name {
			t.Errorf("agent of %s: --apply-works=%q --cluster-name=%q, want false (Karmada mode) and %s", m.Name, args["--apply-works"], args["--cluster-name"], m.Name)
		}
		ensureNamespace(ctx, t, m, agentCmd.namespace) // "Install on real clusters" step 3 creates it
		install(ctx, t, m, agentCmd, objs)
		for _, u := range objs {
			mustExist(ctx, t, m, u)
		}
		mustExist(ctx, t, m, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": map[string]any{"name": "shardroutes.ctrlmesh.io"}}})
	}
	if err := karmada.Karmada.Err(); err != nil {
		t.Error(err)
	}
}

// install applies objs, the render of cmd, to cluster server-side for real
// as helm install would create them: the release namespace only with
// --create-namespace, every other namespace must exist.
func install(ctx context.Context, t *testing.T, cluster *env.Cluster, cmd helmInstall, objs []*unstructured.Unstructured) {
	t.Helper()
	failedBefore := t.Failed()
	if cmd.createNamespace {
		ensureNamespace(ctx, t, cluster, cmd.namespace)
	}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.WarningHandler = warnings
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Helm applies in kind order (CRDs before the rest); the render is in
	// that order already.
	serverSideApply(ctx, t, cluster, dc, objs, nil)
	if !failedBefore && t.Failed() {
		t.Fatalf("%q did not apply to %s", cmd.line, cluster.Name)
	}
}

func getObject(ctx context.Context, cluster *env.Cluster, u *unstructured.Unstructured) error {
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(u.GroupVersionKind())
	return cluster.Client.Get(ctx, client.ObjectKey{Namespace: u.GetNamespace(), Name: u.GetName()}, got)
}

func mustExist(ctx context.Context, t *testing.T, cluster *env.Cluster, u *unstructured.Unstructured) {
	t.Helper()
	if err := getObject(ctx, cluster, u); err != nil {
		t.Errorf("%s not in %s: %v", describe(u), cluster.Name, err)
	}
}

func mustNotExist(ctx context.Context, t *testing.T, cluster *env.Cluster, u *unstructured.Unstructured) {
	t.Helper()
	err := getObject(ctx, cluster, u)
	if err == nil {
		t.Errorf("%s is in %s too", describe(u), cluster.Name)
	} else if !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
		t.Errorf("%s in %s: %v", describe(u), cluster.Name, err)
	}
}

// runHubOfDeployment runs the hub as the host's Deployment d would: with
// its container's flags and the kubeconfig of the Secret mounted at
// --kubeconfig's directory, read from the host. It must take its
// leader-election Lease on Karmada and accept a member there, which needs
// every kind of right the Karmada release granted: the Lease in its
// namespace, ManagedClusters and their accept subresource past the
// acceptance policy, their status.
func runHubOfDeployment(ctx context.Context, t *testing.T, host, karmada *env.Cluster, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the host's hub pods mount a host API token; the hub talks to Karmada only")
	}
	ctr := pod.Containers[0]
	opts := hub.Options{MetricsAddress: "0", HealthAddress: "0", Log: testr.New(t)}
	var kubeconfigPath string
	for _, arg := range ctr.Args {
		flag, value, _ := strings.Cut(arg, "=")
		switch flag {
		case "--namespace":
			if value != "$(POD_NAMESPACE)" {
				t.Fatalf("--namespace=%s, want the pod's namespace", value)
			}
			opts.Namespace = d.Namespace
		case "--leader-elect":
			opts.LeaderElection = value == "true"
		case "--auto-accept":
			opts.AutoAccept = true
		case "--karmada-finalizer":
			opts.KarmadaFinalizer = true
		case "--kubeconfig":
			kubeconfigPath = value
		case "--metrics-bind-address", "--health-probe-bind-address", "--zap-log-level":
		default:
			t.Fatalf("the hub's flag %s: this test does not know how to follow it", arg)
		}
	}
	if !opts.KarmadaFinalizer || !opts.LeaderElection || !opts.AutoAccept || kubeconfigPath == "" {
		t.Fatalf("the host's hub flags %v: want --kubeconfig, --karmada-finalizer, --leader-elect=true and (as the README installs) --auto-accept", ctr.Args)
	}
	volume := mountedSecret(t, d, filepath.Dir(kubeconfigPath))
	if volume == nil || len(volume.Items) != 1 || volume.Items[0].Path != filepath.Base(kubeconfigPath) {
		t.Fatalf("--kubeconfig=%s is not a key of a mounted Secret: %+v", kubeconfigPath, volume)
	}
	var secret corev1.Secret
	if err := host.Client.Get(ctx, client.ObjectKey{Namespace: d.Namespace, Name: volume.SecretName}, &secret); err != nil {
		t.Fatalf("the Secret the hub mounts: %v", err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data[volume.Items[0].Key])
	if err != nil {
		t.Fatal(err)
	}
	opts.Config = cfg
	// The hub creates no namespace on Karmada, and may not.
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "create", Resource: "namespaces"}}}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if review, err = clientset.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	} else if review.Status.Allowed {
		t.Error("the hub may create namespaces on Karmada; they are Karmada's")
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- hub.Run(runCtx, opts) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("hub: %v", err)
		}
	}()

	env.Eventually(t, 2*time.Minute, "the hub's Lease on Karmada", func() error {
		var lease coordinationv1.Lease
		if err := karmada.Client.Get(ctx, client.ObjectKey{Namespace: opts.Namespace, Name: hub.LeaderElectionID}, &lease); err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("no holder")
		}
		return nil
	})
	// The ManagedCluster member1's agent would create on joining.
	mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: "member1"}}
	if err := karmada.Client.Create(ctx, mc); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, time.Minute, "member1 accepted by the hub on Karmada", func() error {
		if err := karmada.Client.Get(ctx, client.ObjectKeyFromObject(mc), mc); err != nil {
			return err
		}
		if !mc.Spec.HubAcceptsClient || !meta.IsStatusConditionTrue(mc.Status.Conditions, clusterv1.ManagedClusterConditionHubAccepted) {
			return fmt.Errorf("spec.hubAcceptsClient %v, conditions %+v", mc.Spec.HubAcceptsClient, mc.Status.Conditions)
		}
		return nil
	})
}

func mapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
