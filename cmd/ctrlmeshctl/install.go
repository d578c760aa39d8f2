package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
)

// The agent chart's hub kubeconfig Secret (its values hub.kubeconfigSecret)
// and release name.
const (
	hubKubeconfigSecret = "ctrlmesh-hub-kubeconfig"
	hubKubeconfigKey    = "kubeconfig"
	agentRelease        = "ctrlmesh-agent"
)

// agentInstall is join's install of the agent chart (--agent-chart): the
// steps of the README's "Install on real clusters" step 3 in one command.
type agentInstall struct {
	// chart is the agent chart's directory; helm the helm binary.
	chart, helm string
	// namespace ctrlmesh runs in, on the hub and in the member.
	namespace string
	// sets are helm --set values beyond clusterName.
	sets []string
	// print prints the install instead of running it.
	print bool
}

// run installs the agent of cluster: it reads the token of the member's
// hub ServiceAccount agent-<cluster> from its Secret agent-<cluster>-token
// on the hub (the hub chart's members value makes both), builds the
// agent's hub kubeconfig from it (the server of hubConfig, the Secret's
// ca.crt), puts it into the member as the chart's Secret and installs the
// chart with helm; then it waits until the agent has joined (its
// ManagedCluster claims the agent's namespace). With print it writes the
// kubeconfig to hub-<cluster>.kubeconfig and prints the commands instead.
func (a agentInstall) run(ctx context.Context, out io.Writer, hubConfig, memberConfig *rest.Config, memberKubeconfig, cluster string) error {
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		return err
	}
	hub, err := client.New(hubConfig, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("hub client: %w", err)
	}
	kubeconfig, err := a.agentKubeconfig(ctx, hub, hubConfig.Host, cluster)
	if err != nil {
		return err
	}
	helmArgs := []string{"upgrade", "--install", agentRelease, a.chart, "--namespace", a.namespace, "--set", "clusterName=" + cluster}
	for _, s := range a.sets {
		helmArgs = append(helmArgs, "--set", s)
	}
	if a.print {
		file := "hub-" + cluster + ".kubeconfig"
		if err := os.WriteFile(file, kubeconfig, 0o600); err != nil {
			return err
		}
		kubectl := "kubectl"
		if memberKubeconfig != "" {
			kubectl += " --kubeconfig " + shellJoin([]string{memberKubeconfig})
			helmArgs = append(helmArgs, "--kubeconfig", memberKubeconfig)
		}
		_, err := fmt.Fprintf(out, `# the agent's hub kubeconfig (token of ServiceAccount %s/%s on the hub) is in %s; install the agent with:
%s create namespace %s
%s -n %s create secret generic %s --from-file=%s=%s
%s %s
`, a.namespace, membership.AgentServiceAccount(cluster), file, kubectl, a.namespace, kubectl, a.namespace, hubKubeconfigSecret, hubKubeconfigKey, file,
			a.helm, shellJoin(helmArgs))
		return err
	}

	member, err := client.New(memberConfig, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("member client: %w", err)
	}
	if err := member.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: a.namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s in the member: %w", a.namespace, err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: a.namespace, Name: hubKubeconfigSecret}}
	if err := member.Get(ctx, client.ObjectKeyFromObject(secret), secret); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading Secret %s/%s in the member: %w", a.namespace, hubKubeconfigSecret, err)
	}
	secret.Data = map[string][]byte{hubKubeconfigKey: kubeconfig}
	if secret.ResourceVersion == "" {
		err = member.Create(ctx, secret)
	} else {
		err = member.Update(ctx, secret)
	}
	if err != nil {
		return fmt.Errorf("writing Secret %s/%s in the member: %w", a.namespace, hubKubeconfigSecret, err)
	}

	// helm (with the member's kubeconfig as ctrlmeshctl has it: --kubeconfig
	// or helm's own default, $KUBECONFIG or ~/.kube/config) keeps its own
	// state in a directory of its own: nothing of the user's helm
	// configuration (repositories, plugins) is needed.
	helmHome, err := os.MkdirTemp("", "ctrlmeshctl-helm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(helmHome)
	if memberKubeconfig != "" {
		helmArgs = append(helmArgs, "--kubeconfig", memberKubeconfig)
	}
	cmd := exec.CommandContext(ctx, a.helm, helmArgs...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(helmHome, "config"),
		"HELM_CACHE_HOME="+filepath.Join(helmHome, "cache"), "HELM_DATA_HOME="+filepath.Join(helmHome, "data"))
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", a.helm, shellJoin(helmArgs), err, output)
	}
	fmt.Fprintf(out, "agent chart %s installed into namespace %s of %s; waiting for the agent to join the hub\n", a.chart, a.namespace, cluster)

	var last error
	if err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		var mc clusterv1.ManagedCluster
		if last = hub.Get(ctx, client.ObjectKey{Name: cluster}, &mc); last != nil {
			return false, nil
		}
		if got := membership.ClaimedAgentNamespace(&mc); got != a.namespace {
			last = fmt.Errorf("ManagedCluster %s claims agent namespace %q", cluster, got)
			return false, nil
		}
		return true, nil
	}); err != nil {
		return fmt.Errorf("the agent of %s did not join the hub (kubectl -n %s get pods in the member tells why): %w (last: %v)", cluster, a.namespace, err, last)
	}
	return nil
}

// agentKubeconfig builds the kubeconfig of the agent of cluster from the
// token Secret of its hub ServiceAccount, waiting until the token
// controller has filled it.
func (a agentInstall) agentKubeconfig(ctx context.Context, hub client.Client, server, cluster string) ([]byte, error) {
	key := client.ObjectKey{Namespace: a.namespace, Name: membership.AgentServiceAccount(cluster) + "-token"}
	var secret corev1.Secret
	var last error
	if err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if last = hub.Get(ctx, key, &secret); last != nil {
			if apierrors.IsNotFound(last) || apierrors.IsForbidden(last) {
				return false, nil
			}
			return false, last
		}
		if len(secret.Data[corev1.ServiceAccountTokenKey]) == 0 {
			last = errors.New("no token in it yet")
			return false, nil
		}
		return true, nil
	}); err != nil {
		return nil, fmt.Errorf("the agent's hub token: Secret %s on the hub (the hub chart makes it for each of its members value; the hub kubeconfig must be able to read it): %w (last: %v)", key, err, last)
	}
	user := membership.AgentServiceAccount(cluster)
	return clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"hub": {Server: server, CertificateAuthorityData: secret.Data[corev1.ServiceAccountRootCAKey]}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{user: {Token: string(secret.Data[corev1.ServiceAccountTokenKey])}},
		Contexts:       map[string]*clientcmdapi.Context{"hub": {Cluster: "hub", AuthInfo: user}},
		CurrentContext: "hub",
	})
}

// shellJoin joins args for printing, quoting those a shell would split.
func shellJoin(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$`\\*?[]{}()<>|&;#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		quoted[i] = a
	}
	return strings.Join(quoted, " ")
}
