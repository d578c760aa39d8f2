package deploy_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ctrlmesh/ctrlmesh/agent"
	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
)

// TestChartsServerSideDryRun renders both charts with several value
// combinations and dry-runs every object against a real API server (strict
// field validation, no warnings allowed); each combination must render the
// objects it is about and not the ones it turns off.
func TestChartsServerSideDryRun(t *testing.T) {
	cases := []struct {
		name, chart, namespace string
		sets                   []string
		want, notWant          []string // Kind/name
	}{{
		name: "hub defaults", chart: hubChart, namespace: "ctrlmesh",
		want: []string{
			"CustomResourceDefinition/shardingconfigs.ctrlmesh.io", "ServiceAccount/ctrlmesh-hub",
			"ClusterRole/ctrlmesh-hub", "ClusterRole/ctrlmesh-hub-auto-accept", "Role/ctrlmesh-hub-leader-election",
			"Deployment/ctrlmesh-hub", "Service/ctrlmesh-hub-metrics", "PodDisruptionBudget/ctrlmesh-hub",
			"ClusterRole/ctrlmesh-agent-execution",
			"ValidatingAdmissionPolicy/ctrlmesh-managedcluster-accept", "ValidatingAdmissionPolicyBinding/ctrlmesh-managedcluster-accept",
		},
		notWant: []string{
			"CustomResourceDefinition/works.work.karmada.io", "CustomResourceDefinition/managedclusters.cluster.open-cluster-management.io",
			"Namespace/ctrlmesh",
		},
	}, {
		name: "hub on a plain API server with members, admin acceptance", chart: hubChart, namespace: "ctrlmesh-system",
		sets: []string{
			"crds.work=true", "crds.managedCluster=true", "autoAccept=false", "createNamespace=true",
			"members[0].name=member1", "members[1].name=member2", "members[1].tokenSecret=false",
		},
		want: []string{
			"Namespace/ctrlmesh-system",
			"CustomResourceDefinition/shardingconfigs.ctrlmesh.io",
			"CustomResourceDefinition/works.work.karmada.io", "CustomResourceDefinition/managedclusters.cluster.open-cluster-management.io",
			"Namespace/member1", "Namespace/karmada-es-member1", "ServiceAccount/agent-member1", "Secret/agent-member1-token",
			"ClusterRole/ctrlmesh-agent-hub:member1", "ClusterRoleBinding/ctrlmesh-agent-hub:member1",
			"Namespace/karmada-es-member2", "ServiceAccount/agent-member2", "ClusterRole/ctrlmesh-agent-hub:member2",
			"RoleBinding/ctrlmesh-agent",
		},
		notWant: []string{
			"ClusterRole/ctrlmesh-hub-auto-accept", "ClusterRoleBinding/ctrlmesh-hub-auto-accept", "Secret/agent-member2-token",
			"Secret/ctrlmesh-hub-token", "ResourceInterpreterCustomization/ctrlmesh-shardroute",
		},
	}, {
		name: "hub's API objects for a Karmada API server", chart: hubChart, namespace: "ctrlmesh",
		sets: []string{"target=karmada", "crds.managedCluster=true", "members[0].name=member1"},
		want: []string{
			"CustomResourceDefinition/shardingconfigs.ctrlmesh.io", "CustomResourceDefinition/managedclusters.cluster.open-cluster-management.io",
			"ServiceAccount/ctrlmesh-hub", "Secret/ctrlmesh-hub-token",
			"ClusterRole/ctrlmesh-hub", "ClusterRoleBinding/ctrlmesh-hub", "ClusterRole/ctrlmesh-hub-auto-accept", "Role/ctrlmesh-hub-leader-election",
			"ClusterRole/ctrlmesh-agent-execution", "ValidatingAdmissionPolicy/ctrlmesh-managedcluster-accept",
			"ServiceAccount/agent-member1", "Secret/agent-member1-token", "ClusterRole/ctrlmesh-agent-hub:member1", "RoleBinding/ctrlmesh-agent",
			"ResourceInterpreterCustomization/ctrlmesh-shardroute",
		},
		notWant: []string{
			"CustomResourceDefinition/works.work.karmada.io", "Namespace/karmada-es-member1",
			"Deployment/ctrlmesh-hub", "PodDisruptionBudget/ctrlmesh-hub", "Service/ctrlmesh-hub-metrics",
		},
	}, {
		name: "hub's workload in a Karmada host cluster", chart: hubChart, namespace: "ctrlmesh",
		sets: []string{"target=host", "members[0].name=member1", "crds.managedCluster=true"},
		want: []string{"Deployment/ctrlmesh-hub", "ServiceAccount/ctrlmesh-hub", "PodDisruptionBudget/ctrlmesh-hub", "Service/ctrlmesh-hub-metrics"},
		notWant: []string{
			"CustomResourceDefinition/shardingconfigs.ctrlmesh.io", "CustomResourceDefinition/managedclusters.cluster.open-cluster-management.io",
			"ClusterRole/ctrlmesh-hub", "Role/ctrlmesh-hub-leader-election", "ClusterRole/ctrlmesh-agent-execution",
			"ValidatingAdmissionPolicy/ctrlmesh-managedcluster-accept", "ServiceAccount/agent-member1", "Namespace/karmada-es-member1",
			"Secret/ctrlmesh-hub-token", "ResourceInterpreterCustomization/ctrlmesh-shardroute",
		},
	}, {
		name: "hub without CRDs, policy or PDB", chart: hubChart, namespace: "ctrlmesh",
		sets: []string{"crds.shardingConfig=false", "crds.circuitBreaker=false", "crds.faultInjection=false", "acceptPolicy.enabled=false", "replicas=1", "metrics.service.enabled=false"},
		want: []string{"Deployment/ctrlmesh-hub", "ClusterRole/ctrlmesh-hub"},
		notWant: []string{
			"CustomResourceDefinition/shardingconfigs.ctrlmesh.io", "ValidatingAdmissionPolicy/ctrlmesh-managedcluster-accept",
			"PodDisruptionBudget/ctrlmesh-hub", "Service/ctrlmesh-hub-metrics",
		},
	}, {
		name: "agent defaults (certificate generated by helm)", chart: agentChart, namespace: "ctrlmesh",
		sets: []string{"clusterName=member1"},
		want: []string{
			"CustomResourceDefinition/shardroutes.ctrlmesh.io", "ServiceAccount/ctrlmesh-agent",
			"ClusterRole/ctrlmesh-agent", "Role/ctrlmesh-agent-leader-election", "Deployment/ctrlmesh-agent",
			"Service/ctrlmesh-agent", "Service/ctrlmesh-agent-metrics", "Secret/ctrlmesh-agent-webhook-cert",
			"PodDisruptionBudget/ctrlmesh-agent",
		},
		notWant: []string{"Certificate/ctrlmesh-agent-webhook", "Issuer/ctrlmesh-agent-ca"},
	}, {
		name: "agent with cert-manager and its own CA", chart: agentChart, namespace: "ctrlmesh",
		sets: []string{"clusterName=member1", "webhook.certificate.mode=certManager"},
		want: []string{
			"Issuer/ctrlmesh-agent-selfsigned", "Certificate/ctrlmesh-agent-webhook-ca", "Issuer/ctrlmesh-agent-ca",
			"Certificate/ctrlmesh-agent-webhook", "Deployment/ctrlmesh-agent",
		},
		notWant: []string{"Secret/ctrlmesh-agent-webhook-cert"},
	}, {
		name: "agent with cert-manager and a ClusterIssuer", chart: agentChart, namespace: "ctrlmesh",
		sets: []string{
			"clusterName=member1", "webhook.certificate.mode=certManager",
			"webhook.certificate.certManager.issuerRef.kind=ClusterIssuer", "webhook.certificate.certManager.issuerRef.name=corp-ca",
		},
		want:    []string{"Certificate/ctrlmesh-agent-webhook"},
		notWant: []string{"Issuer/ctrlmesh-agent-selfsigned", "Issuer/ctrlmesh-agent-ca", "Secret/ctrlmesh-agent-webhook-cert"},
	}, {
		name: "agent in Karmada mode with an existing certificate Secret, no CRDs", chart: agentChart, namespace: "member-system",
		sets: []string{
			"clusterName=edge-7", "webhook.certificate.mode=secret", "webhook.certificate.secretName=my-cert",
			"applyWorks=false", "crds.install=false", "createNamespace=true",
		},
		want: []string{"Namespace/member-system", "Deployment/ctrlmesh-agent", "Service/ctrlmesh-agent"},
		notWant: []string{
			"CustomResourceDefinition/shardroutes.ctrlmesh.io", "Secret/ctrlmesh-agent-webhook-cert", "Secret/my-cert",
			"Certificate/ctrlmesh-agent-webhook",
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.chart, tc.namespace, tc.sets)
			for _, w := range tc.want {
				kind, name, _ := strings.Cut(w, "/")
				if find(objs, kind, name) == nil {
					t.Errorf("%s %s not rendered", kind, name)
				}
			}
			for _, w := range tc.notWant {
				kind, name, _ := strings.Cut(w, "/")
				if find(objs, kind, name) != nil {
					t.Errorf("%s %s rendered, but these values turn it off", kind, name)
				}
			}
			dryRunApply(t, objs)
		})
	}
}

// TestRBACMatchesCode keeps the charts' RBAC equal to the functions the
// binaries' RBAC is defined by (and deploy/rbac rendered from): hub.RBAC,
// agent.MemberRBAC and membership.AgentHubRBAC. Every object of the function must
// be rendered with the same rules, role reference and subjects (and its
// labels), and the chart's RBAC templates may render nothing more.
func TestRBACMatchesCode(t *testing.T) {
	for _, ns := range []string{"ctrlmesh", "ctrlmesh-system"} {
		for _, target := range []string{"standalone", "karmada"} {
			for _, autoAccept := range []bool{true, false} {
				t.Run("hub.RBAC/"+ns+"/"+target+"/autoAccept="+strconv.FormatBool(autoAccept), func(t *testing.T) {
					sets := []string{"target=" + target, "autoAccept=" + strconv.FormatBool(autoAccept)}
					objs := render(t, hubChart, ns, sets, "--show-only", "templates/rbac.yaml")
					want := hub.RBAC(ns, autoAccept)
					if target == "karmada" {
						want = hub.KarmadaRBAC(ns, autoAccept)
					}
					compareObjects(t, objs, want)
				})
			}
		}
		t.Run("agent.MemberRBAC/"+ns, func(t *testing.T) {
			objs := render(t, agentChart, ns, []string{"clusterName=member1"}, "--show-only", "templates/rbac.yaml")
			compareObjects(t, objs, agent.MemberRBAC(ns))
		})
	}
	// membership.AgentHubRBAC binds the agents' ServiceAccounts in
	// membership.AgentNamespace; the chart in its release namespace.
	for target, extraKinds := range map[string][]string{
		// Besides the function's objects, the template renders what the
		// function leaves to the hub admin: the ServiceAccount, with its
		// token Secret, the cluster namespace and, on a standalone hub, the
		// execution namespace (Karmada's on Karmada; TestAgentsTemplateNamespaces).
		"standalone": {"Namespace", "ServiceAccount", "Secret"},
		"karmada":    {"Namespace", "ServiceAccount", "Secret"},
	} {
		t.Run("membership.AgentHubRBAC/"+target, func(t *testing.T) {
			objs := render(t, hubChart, membership.AgentNamespace, []string{"target=" + target, "members[0].name=member1", "members[1].name=member2"},
				"--show-only", "templates/agents.yaml")
			var want []client.Object
			for _, m := range []string{"member1", "member2"} {
				for _, o := range membership.AgentHubRBAC(m) {
					// The shared objects come once.
					if !slices.ContainsFunc(want, func(w client.Object) bool {
						return w.GetObjectKind().GroupVersionKind() == o.GetObjectKind().GroupVersionKind() &&
							w.GetNamespace() == o.GetNamespace() && w.GetName() == o.GetName()
					}) {
						want = append(want, o)
					}
				}
			}
			compareObjects(t, objs, want, extraKinds...)
		})
	}
	// With target=host the release renders none of it.
	for _, u := range render(t, hubChart, "ctrlmesh", []string{"target=host", "members[0].name=member1"}) {
		if slices.Contains([]string{"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "FlowSchema", "ValidatingAdmissionPolicy"}, u.GetKind()) {
			t.Errorf("target=host renders %s", describe(u))
		}
	}
}

// TestNoWildcardRBAC: no rule of any ctrlmesh RBAC has a "*" — the code's
// renderings in deploy/rbac (hub, agent member and hub, proxy), the plain
// manifests, and the charts rendered with several values. The labeler's
// rights come per ShardingConfig on named resources (routework.NewLabelerRBAC),
// which pkg/routework's tests check.
func TestNoWildcardRBAC(t *testing.T) {
	var objs []*unstructured.Unstructured
	files, err := filepath.Glob("rbac/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	manifests, err := filepath.Glob("manifests/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 || len(manifests) != 4 {
		t.Fatalf("found %v and %v, want the four RBAC renderings and the four manifests", files, manifests)
	}
	for _, f := range append(files, manifests...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := parseYAML(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		objs = append(objs, parsed...)
	}
	for _, target := range []string{"standalone", "karmada"} {
		for _, autoAccept := range []string{"true", "false"} {
			objs = append(objs, render(t, hubChart, "ctrlmesh", []string{"target=" + target, "autoAccept=" + autoAccept, "members[0].name=member1"})...)
		}
	}
	objs = append(objs, render(t, agentChart, "ctrlmesh-system", []string{"clusterName=member1"})...)

	roles := 0
	for _, u := range objs {
		if u.GetKind() != "ClusterRole" && u.GetKind() != "Role" {
			continue
		}
		roles++
		var role rbacv1.ClusterRole // a Role's rules decode the same
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &role); err != nil {
			t.Fatalf("%s: %v", describe(u), err)
		}
		if role.AggregationRule != nil {
			t.Errorf("%s aggregates other roles", describe(u))
		}
		for i, r := range role.Rules {
			for _, field := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.ResourceNames, r.NonResourceURLs} {
				if slices.ContainsFunc(field, func(v string) bool { return strings.Contains(v, "*") }) {
					t.Errorf("%s, rule %d has a wildcard: %+v", describe(u), i, r)
				}
			}
		}
	}
	if roles < 10 {
		t.Fatalf("checked %d roles; the renderings hold more", roles)
	}
}

// compareObjects checks that rendered holds every object of want, equal
// apart from labels and annotations (want's labels must be among the
// rendered ones), and nothing else but objects of the kinds extraKinds.
func compareObjects(t *testing.T, rendered []*unstructured.Unstructured, want []client.Object, extraKinds ...string) {
	t.Helper()
	left := slices.Clone(rendered)
	for _, w := range want {
		gvk := w.GetObjectKind().GroupVersionKind()
		i := slices.IndexFunc(left, func(u *unstructured.Unstructured) bool {
			return u.GroupVersionKind() == gvk && u.GetNamespace() == w.GetNamespace() && u.GetName() == w.GetName()
		})
		if i < 0 {
			t.Errorf("%s %s/%s of the code is not rendered by the chart", gvk.Kind, w.GetNamespace(), w.GetName())
			continue
		}
		u := left[i]
		left = slices.Delete(left, i, i+1)
		for k, v := range w.GetLabels() {
			if got, ok := u.GetLabels()[k]; !ok || got != v {
				t.Errorf("%s: label %s=%q missing (have %v)", describe(u), k, v, u.GetLabels())
			}
		}
		got := reflect.New(reflect.TypeOf(w).Elem()).Interface().(client.Object)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, got, true); err != nil {
			t.Errorf("%s: %v", describe(u), err)
			continue
		}
		exp := w.DeepCopyObject().(client.Object)
		for _, o := range []client.Object{got, exp} {
			o.SetLabels(nil)
			o.SetAnnotations(nil)
		}
		if !equality.Semantic.DeepEqual(exp, got) {
			t.Errorf("%s differs from the code's:\nchart:\n%s\ncode:\n%s", describe(u), toYAML(t, got), toYAML(t, exp))
		}
	}
	for _, u := range left {
		if !slices.Contains(extraKinds, u.GetKind()) {
			t.Errorf("%s is rendered by the chart but not in the code's RBAC", describe(u))
		}
	}
}

func toYAML(t *testing.T, o any) string {
	t.Helper()
	b, err := yaml.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDeploymentsHardened checks both Deployments with default values:
// two replicas electing a leader, namespace from the downward API, probes
// on the health port, metrics port behind its Service, non-root read-only
// containers without capabilities, and the ServiceAccount the RBAC binds.
func TestDeploymentsHardened(t *testing.T) {
	for _, c := range []struct {
		chart, name, container string
		sets                   []string
	}{
		{hubChart, "ctrlmesh-hub", "hub", nil},
		{hubChart, "ctrlmesh-hub", "hub", []string{"target=host"}},
		{agentChart, "ctrlmesh-agent", "agent", []string{"clusterName=member1"}},
	} {
		t.Run(strings.Join(append([]string{c.name}, c.sets...), ","), func(t *testing.T) {
			objs := render(t, c.chart, "ctrlmesh", c.sets)
			var d appsv1.Deployment
			decode(t, mustFind(t, objs, "Deployment", c.name), &d)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
				t.Errorf("replicas %v, want 2", d.Spec.Replicas)
			}
			pod := d.Spec.Template
			for k, v := range d.Spec.Selector.MatchLabels {
				if pod.Labels[k] != v {
					t.Errorf("the selector's %s=%s is not a pod label", k, v)
				}
			}
			if len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != c.container {
				t.Fatalf("want one container %q, have %d", c.container, len(pod.Spec.Containers))
			}
			ctr := pod.Spec.Containers[0]
			args := parseArgs(ctr.Args)
			for flag, want := range map[string]string{
				"--leader-elect":              "true",
				"--namespace":                 "$(POD_NAMESPACE)",
				"--metrics-bind-address":      ":8080",
				"--health-probe-bind-address": ":8081",
			} {
				if args[flag] != want {
					t.Errorf("%s=%q, want %q", flag, args[flag], want)
				}
			}
			if !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool {
				return e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
			}) {
				t.Error("POD_NAMESPACE does not come from the downward API (metadata.namespace)")
			}
			ports := map[string]int32{}
			for _, p := range ctr.Ports {
				ports[p.Name] = p.ContainerPort
			}
			if ports["metrics"] != 8080 || ports["health"] != 8081 {
				t.Errorf("container ports %v, want metrics 8080 and health 8081", ports)
			}
			for name, probe := range map[string]*corev1.Probe{"liveness": ctr.LivenessProbe, "readiness": ctr.ReadinessProbe} {
				if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Port.String() != "health" {
					t.Errorf("%s probe %+v, want an HTTP GET on the health port", name, probe)
				}
			}
			if ctr.LivenessProbe != nil && ctr.LivenessProbe.HTTPGet != nil && ctr.LivenessProbe.HTTPGet.Path != "/healthz" ||
				ctr.ReadinessProbe != nil && ctr.ReadinessProbe.HTTPGet != nil && ctr.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Error("probes must be /healthz (liveness) and /readyz (readiness)")
			}
			if ctr.Resources.Requests.Cpu().IsZero() || ctr.Resources.Requests.Memory().IsZero() || ctr.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v: want CPU and memory requests and a memory limit", ctr.Resources)
			}
			psc, sc := pod.Spec.SecurityContext, ctr.SecurityContext
			if psc == nil || !ptrTrue(psc.RunAsNonRoot) || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
				t.Errorf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", psc)
			}
			if sc == nil || !ptrTrue(sc.ReadOnlyRootFilesystem) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("container securityContext %+v: want a read-only root, no privilege escalation, capabilities drop ALL", sc)
			}
			if pod.Spec.ServiceAccountName != c.name {
				t.Errorf("serviceAccountName %q, want %q", pod.Spec.ServiceAccountName, c.name)
			}
			mustFind(t, objs, "ServiceAccount", c.name)
			var svc corev1.Service
			decode(t, mustFind(t, objs, "Service", c.name+"-metrics"), &svc)
			checkServiceSelects(t, &svc, pod.Labels)
			if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
				t.Errorf("metrics Service ports %+v, want one targeting the metrics port", svc.Spec.Ports)
			}
		})
	}
}

// TestHubKubeconfigWiring: with target=host the hub reaches Karmada with
// --kubeconfig, the key of the Secret karmada.kubeconfigSecret mounted
// read-only, puts Karmada's finalizer on its Works, and mounts no API token
// of the host (neither its ServiceAccount nor its pods); standalone it uses
// its in-cluster credentials and no finalizer.
func TestHubKubeconfigWiring(t *testing.T) {
	for _, c := range []struct {
		sets        []string
		secret, key string
		finalizer   bool
		noHostAuth  bool
	}{
		{nil, "", "", false, false},
		{[]string{"target=host"}, "ctrlmesh-hub-karmada-kubeconfig", "kubeconfig", true, true},
		{[]string{"target=host", "karmada.kubeconfigSecret.name=karmada-kubeconfig", "karmada.kubeconfigSecret.key=config"}, "karmada-kubeconfig", "config", true, true},
	} {
		t.Run(strings.Join(c.sets, ","), func(t *testing.T) {
			objs := render(t, hubChart, "ctrlmesh", c.sets)
			var d appsv1.Deployment
			decode(t, mustFind(t, objs, "Deployment", "ctrlmesh-hub"), &d)
			args := parseArgs(d.Spec.Template.Spec.Containers[0].Args)
			if _, ok := args["--karmada-finalizer"]; ok != c.finalizer {
				t.Errorf("--karmada-finalizer rendered %v, want %v", ok, c.finalizer)
			}
			path, ok := args["--kubeconfig"]
			switch {
			case c.secret == "" && ok:
				t.Errorf("--kubeconfig=%s on a standalone hub, which uses its in-cluster credentials", path)
			case c.secret != "":
				v := mountedSecret(t, &d, filepath.Dir(path))
				if v == nil || v.SecretName != c.secret || len(v.Items) != 1 || v.Items[0].Key != c.key || v.Items[0].Path != filepath.Base(path) {
					t.Errorf("--kubeconfig=%q is not the key %s of Secret %s mounted: %+v", path, c.key, c.secret, v)
				}
			}
			var sa corev1.ServiceAccount
			decode(t, mustFind(t, objs, "ServiceAccount", "ctrlmesh-hub"), &sa)
			noToken := func(b *bool) bool { return b != nil && !*b }
			if noToken(sa.AutomountServiceAccountToken) != c.noHostAuth || noToken(d.Spec.Template.Spec.AutomountServiceAccountToken) != c.noHostAuth {
				t.Errorf("automountServiceAccountToken of the ServiceAccount %v and the pods %v; want them false: %v",
					sa.AutomountServiceAccountToken, d.Spec.Template.Spec.AutomountServiceAccountToken, c.noHostAuth)
			}
		})
	}
}

// TestAgentWebhookWiring follows the agent's webhook from its flags to the
// Service, the container port and the mounted certificate: the agent
// writes MutatingWebhookConfigurations for --webhook-service with the
// caBundle ca.crt of --webhook-cert-dir, so the serving certificate must be
// valid for that Service's DNS name under that CA.
func TestAgentWebhookWiring(t *testing.T) {
	const ns = "ctrlmesh"
	wiring := func(t *testing.T, objs []*unstructured.Unstructured) (*appsv1.Deployment, string) {
		t.Helper()
		var d appsv1.Deployment
		decode(t, mustFind(t, objs, "Deployment", "ctrlmesh-agent"), &d)
		ctr := d.Spec.Template.Spec.Containers[0]
		args := parseArgs(ctr.Args)
		if args["--webhook-service"] != ns+"/ctrlmesh-agent" {
			t.Errorf("--webhook-service=%q, want %s/ctrlmesh-agent", args["--webhook-service"], ns)
		}
		var svc corev1.Service
		decode(t, mustFind(t, objs, "Service", "ctrlmesh-agent"), &svc)
		checkServiceSelects(t, &svc, d.Spec.Template.Labels)
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.String() != "webhook" {
			t.Errorf("webhook Service ports %+v, want 443 to the webhook port", svc.Spec.Ports)
		}
		if !slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool { return p.Name == "webhook" && p.ContainerPort == 9443 }) ||
			args["--webhook-port"] != "9443" {
			t.Errorf("want container port webhook 9443 and --webhook-port=9443: %+v, %q", ctr.Ports, args["--webhook-port"])
		}
		for flag, want := range map[string]string{
			"--cluster-name": "member1",
			"--proxy-image":  "ghcr.io/ctrlmesh/ctrlmesh-proxy:0.1.0",
			"--identity":     "$(POD_NAME)",
		} {
			if args[flag] != want {
				t.Errorf("%s=%q, want %q", flag, args[flag], want)
			}
		}
		// The hub kubeconfig comes from the Secret hub.kubeconfigSecret.
		if secret := mountedSecret(t, &d, filepath.Dir(args["--hub-kubeconfig"])); secret == nil || secret.SecretName != "ctrlmesh-hub-kubeconfig" ||
			len(secret.Items) != 1 || secret.Items[0].Key != "kubeconfig" || secret.Items[0].Path != filepath.Base(args["--hub-kubeconfig"]) {
			t.Errorf("--hub-kubeconfig=%s is not the key kubeconfig of Secret ctrlmesh-hub-kubeconfig: %+v", args["--hub-kubeconfig"], secret)
		}
		secret := mountedSecret(t, &d, args["--webhook-cert-dir"])
		if secret == nil {
			t.Fatalf("--webhook-cert-dir=%s is not a mounted Secret", args["--webhook-cert-dir"])
		}
		return &d, secret.SecretName
	}

	t.Run("helm certificate", func(t *testing.T) {
		objs := render(t, agentChart, ns, []string{"clusterName=member1"})
		d, secretName := wiring(t, objs)
		var s corev1.Secret
		decode(t, mustFind(t, objs, "Secret", secretName), &s)
		ca, crt, key := s.Data["ca.crt"], s.Data["tls.crt"], s.Data["tls.key"]
		pair, err := tls.X509KeyPair(crt, key)
		if err != nil {
			t.Fatalf("tls.crt and tls.key: %v", err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(ca) {
			t.Fatal("ca.crt holds no PEM certificate")
		}
		for _, name := range []string{"ctrlmesh-agent." + ns + ".svc", "ctrlmesh-agent." + ns + ".svc.cluster.local"} {
			if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				t.Errorf("the serving certificate does not verify for %s under ca.crt: %v", name, err)
			}
		}
		sum := sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(ca)))
		if got := d.Spec.Template.Annotations["checksum/webhook-ca"]; got != hex.EncodeToString(sum[:]) {
			t.Errorf("checksum/webhook-ca %q is not that of ca.crt: a new CA would not restart the agents", got)
		}
	})

	t.Run("cert-manager", func(t *testing.T) {
		objs := render(t, agentChart, ns, []string{"clusterName=member1", "webhook.certificate.mode=certManager"})
		_, secretName := wiring(t, objs)
		cert := mustFind(t, objs, "Certificate", "ctrlmesh-agent-webhook")
		if got, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName"); got != secretName {
			t.Errorf("the Certificate writes Secret %q, the agent mounts %q", got, secretName)
		}
		dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		if !slices.Contains(dnsNames, "ctrlmesh-agent."+ns+".svc") {
			t.Errorf("dnsNames %v lack ctrlmesh-agent.%s.svc", dnsNames, ns)
		}
		// Serving certificate <- Issuer ctrlmesh-agent-ca <- CA Certificate
		// (isCA) <- self-signed Issuer.
		issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
		caIssuer := mustFind(t, objs, "Issuer", issuer)
		caSecret, _, _ := unstructured.NestedString(caIssuer.Object, "spec", "ca", "secretName")
		caCert := mustFind(t, objs, "Certificate", "ctrlmesh-agent-webhook-ca")
		if got, _, _ := unstructured.NestedString(caCert.Object, "spec", "secretName"); got != caSecret || caSecret == "" {
			t.Errorf("Issuer %s signs with Secret %q, the CA Certificate writes %q", issuer, caSecret, got)
		}
		if isCA, _, _ := unstructured.NestedBool(caCert.Object, "spec", "isCA"); !isCA {
			t.Error("the CA Certificate is not isCA")
		}
		root, _, _ := unstructured.NestedString(caCert.Object, "spec", "issuerRef", "name")
		if _, ok, _ := unstructured.NestedMap(mustFind(t, objs, "Issuer", root).Object, "spec", "selfSigned"); !ok {
			t.Errorf("Issuer %s is not selfSigned", root)
		}
	})
}

// TestAgentCertificateReusedOnUpgrade: in helm mode an existing webhook
// certificate Secret is reused (lookup), not replaced by a new CA that the
// running agents' webhook configurations would not trust. helm template
// --dry-run=server looks it up in the test API server, as an upgrade would.
func TestAgentCertificateReusedOnUpgrade(t *testing.T) {
	const ns = "cert-reuse"
	first := render(t, agentChart, ns, []string{"clusterName=member1"})
	var generated corev1.Secret
	decode(t, mustFind(t, first, "Secret", "ctrlmesh-agent-webhook-cert"), &generated)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ensureNamespace(ctx, t, apiserver, ns)
	existing := generated.DeepCopy()
	existing.TypeMeta = metav1.TypeMeta{}
	existing.Labels = nil
	if err := apiserver.Client.Create(ctx, existing); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = apiserver.Client.Delete(context.Background(), existing) })

	again := render(t, agentChart, ns, []string{"clusterName=member1"}, "--dry-run=server", "--kubeconfig", apiserver.KubeconfigPath)
	var reused corev1.Secret
	decode(t, mustFind(t, again, "Secret", "ctrlmesh-agent-webhook-cert"), &reused)
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if string(reused.Data[k]) != string(generated.Data[k]) {
			t.Errorf("%s was generated anew instead of reused from the existing Secret", k)
		}
	}
	fresh := render(t, agentChart, ns, []string{"clusterName=member1"})
	var other corev1.Secret
	decode(t, mustFind(t, fresh, "Secret", "ctrlmesh-agent-webhook-cert"), &other)
	if string(other.Data["ca.crt"]) == string(generated.Data["ca.crt"]) {
		t.Error("without a cluster to look up, helm template rendered the same CA twice: genCA is not being called")
	}
}

// TestChartCRDs keeps the charts' CRD copies equal to deploy/crds (make
// generate writes those; make manifests copies them), and checks that the
// CRDs the charts render are those files, with the keep policy.
func TestChartCRDs(t *testing.T) {
	copies := map[string]string{
		"crds/ctrlmesh.io_shardingconfigs.yaml": hubChart + "/files/crds/ctrlmesh.io_shardingconfigs.yaml",
		"crds/ctrlmesh.io_circuitbreakers.yaml": hubChart + "/files/crds/ctrlmesh.io_circuitbreakers.yaml",
		"crds/ctrlmesh.io_faultinjections.yaml": hubChart + "/files/crds/ctrlmesh.io_faultinjections.yaml",
		"crds/ctrlmesh.io_shardroutes.yaml":     agentChart + "/files/crds/ctrlmesh.io_shardroutes.yaml",
	}
	thirdParty, err := filepath.Glob("crds/third-party/*.yaml")
	if err != nil || len(thirdParty) == 0 {
		t.Fatalf("no third-party CRDs in crds/third-party: %v", err)
	}
	for _, f := range thirdParty {
		copies[f] = hubChart + "/files/crds/third-party/" + filepath.Base(f)
	}
	// Not a CRD, but copied the same way: the ShardRoute interpreter the
	// hub chart installs on Karmada.
	copies["karmada/shardroute-interpreter.yaml"] = hubChart + "/files/karmada/shardroute-interpreter.yaml"
	ours, _ := filepath.Glob("crds/*.yaml")
	for _, f := range ours {
		if _, ok := copies[f]; !ok {
			t.Errorf("%s is in neither chart", f)
		}
	}
	chartFiles, _ := filepath.Glob("charts/*/files/crds/*.yaml")
	more, _ := filepath.Glob("charts/*/files/crds/*/*.yaml")
	interpreters, _ := filepath.Glob("charts/*/files/karmada/*.yaml")
	for _, f := range append(append(chartFiles, more...), interpreters...) {
		if !slices.Contains(mapValues(copies), f) {
			t.Errorf("%s is not a copy of a file in deploy/crds: remove it", f)
		}
	}
	byName := map[string]map[string]any{}
	for src, dst := range copies {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(dst)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s is not a copy of %s: run 'make manifests'", dst, src)
		}
		objs, err := parseYAML(want)
		if err != nil || len(objs) != 1 {
			t.Fatalf("%s: %d objects, %v", src, len(objs), err)
		}
		if objs[0].GetKind() == "CustomResourceDefinition" {
			byName[objs[0].GetName()] = objs[0].Object
		}
	}

	rendered := append(render(t, hubChart, "ctrlmesh", []string{"crds.work=true", "crds.managedCluster=true"}),
		render(t, agentChart, "ctrlmesh", []string{"clusterName=member1"})...)
	seen := 0
	for _, u := range rendered {
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		seen++
		want, ok := byName[u.GetName()]
		if !ok {
			t.Errorf("CRD %s rendered but not in deploy/crds", u.GetName())
			continue
		}
		if !reflect.DeepEqual(normalize(t, u.Object["spec"]), normalize(t, want["spec"])) {
			t.Errorf("CRD %s: the rendered spec differs from deploy/crds", u.GetName())
		}
		if u.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD %s: no helm.sh/resource-policy: keep; an uninstall would delete every custom resource", u.GetName())
		}
	}
	if seen != len(byName) {
		t.Errorf("rendered %d CRDs, deploy/crds has %d", seen, len(byName))
	}
}

// TestManifestsUpToDate renders deploy/manifests afresh (render.sh, as make
// manifests does) and compares; the checked-in files are dry-run too, as
// kubectl apply -f would send them.
func TestManifestsUpToDate(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("bash", "manifests/render.sh", helmBin, dir)
	cmd.Env = helmEnv(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("manifests/render.sh: %v\n%s", err, out)
	}
	fresh, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	checkedIn, _ := filepath.Glob("manifests/*.yaml")
	if len(fresh) != 4 {
		t.Fatalf("render.sh wrote %v, want four manifests (hub standalone, on Karmada and its host, agent)", fresh)
	}
	for _, f := range checkedIn {
		if !slices.Contains(fresh, filepath.Join(dir, filepath.Base(f))) {
			t.Errorf("%s is not rendered any more: remove it", f)
		}
	}
	for _, f := range fresh {
		name := filepath.Join("manifests", filepath.Base(f))
		want, _ := os.ReadFile(f)
		got, err := os.ReadFile(name)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s is not what the charts render: run 'make manifests'", name)
			continue
		}
		objs, err := parseYAML(got)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		mustFind(t, objs, "Namespace", "ctrlmesh")
		if find(objs, "Secret", "ctrlmesh-agent-webhook-cert") != nil {
			t.Errorf("%s holds a generated certificate: plain manifests must render deterministically", name)
		}
		dryRunApply(t, objs)
	}
}

// TestRenderRefusesBadValues: values the binaries would refuse, or that
// would install something broken, fail at render time with a message
// naming the value.
func TestRenderRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		chart string
		sets  []string
		want  string
	}{
		{agentChart, nil, "clusterName is required"},
		{agentChart, []string{"clusterName=Member_1"}, "want a DNS label"},
		{agentChart, []string{"clusterName=member1", "webhook.certificate.mode=selfsigned"}, "webhook.certificate.mode"},
		{agentChart, []string{"clusterName=member1", "webhook.certificate.mode=certManager", "webhook.certificate.certManager.issuerRef.kind=ClusterIssuer"},
			"issuerRef.name is required"},
		{agentChart, []string{"clusterName=member1", "hub.kubeconfigSecret.name="}, "hub.kubeconfigSecret.name is required"},
		{hubChart, []string{"members[0].name=m1", "members[1].name=m1"}, `"m1" listed twice`},
		{hubChart, []string{"members[0].name=M1"}, "want a DNS label"},
		{hubChart, []string{"target=karmada-apiserver"}, "want standalone, host or karmada"},
		{hubChart, []string{"target=karmada", "crds.work=true"}, "Karmada serves works.work.karmada.io itself"},
		{hubChart, []string{"target=host", "karmada.kubeconfigSecret.name="}, "karmada.kubeconfigSecret.name is required"},
	} {
		_, err := helmTemplate(t, c.chart, "ctrlmesh", c.sets)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %v: error %v, want one containing %q", c.chart, c.sets, err, c.want)
		}
	}
}

func decode(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		t.Fatalf("%s: %v", describe(u), err)
	}
}

// parseArgs maps --flag=value arguments to their values ("true" for a bare
// --flag).
func parseArgs(args []string) map[string]string {
	out := map[string]string{}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			v = "true"
		}
		out[k] = v
	}
	return out
}

// mountedSecret is the Secret volume mounted at path in the first
// container, or nil.
func mountedSecret(t *testing.T, d *appsv1.Deployment, path string) *corev1.SecretVolumeSource {
	t.Helper()
	for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
		if m.MountPath != path {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("volume %s at %s is mounted writable", m.Name, path)
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name {
				return v.Secret
			}
		}
	}
	return nil
}

func checkServiceSelects(t *testing.T, svc *corev1.Service, podLabels map[string]string) {
	t.Helper()
	if len(svc.Spec.Selector) == 0 {
		t.Errorf("Service %s selects nothing", svc.Name)
	}
	for k, v := range svc.Spec.Selector {
		if podLabels[k] != v {
			t.Errorf("Service %s selects %s=%s, which the pods do not have", svc.Name, k, v)
		}
	}
}

func ptrTrue(b *bool) bool { return b != nil && *b }

// normalize round-trips through JSON so that values parsed differently
// (integers, nil and empty) compare equal when they mean the same.
func normalize(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// TestHubNotes renders the hub chart's NOTES.txt for each target (helm
// install --dry-run=client against the test API server): each tells where
// the other half of the hub is, or, standalone, what is installed. Without
// the CRD, which other tests created without Helm's ownership, and for a
// member of its own: helm refuses to adopt existing objects even in a dry
// run.
func TestHubNotes(t *testing.T) {
	for target, want := range map[string]string{
		"standalone": "ctrlmesh-hub is installed in namespace ctrlmesh (2 replicas",
		"host":       "manages the Karmada control plane of the kubeconfig in Secret ctrlmesh/ctrlmesh-hub-karmada-kubeconfig",
		"karmada":    "The hub's identity here: ServiceAccount ctrlmesh/ctrlmesh-hub, token in Secret ctrlmesh-hub-token.",
	} {
		t.Run(target, func(t *testing.T) {
			cmd := exec.Command(helmBin, "install", "ctrlmesh-hub", hubChart, "--dry-run=client", "--namespace", "ctrlmesh",
				"--kubeconfig", apiserver.KubeconfigPath, "--set", "target="+target, "--set", "members[0].name=notes1", "--set", "crds.shardingConfig=false", "--set", "crds.circuitBreaker=false", "--set", "crds.faultInjection=false")
			cmd.Env = helmEnv(t)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("helm install --dry-run: %v\n%s", err, out)
			}
			_, notes, ok := strings.Cut(string(out), "\nNOTES:\n")
			if !ok || !strings.Contains(notes, want) {
				t.Errorf("NOTES of target=%s lack %q:\n%s", target, want, notes)
			}
			if target != "host" && !strings.Contains(notes, "notes1: ServiceAccount ctrlmesh/agent-notes1") {
				t.Errorf("NOTES of target=%s do not list the member:\n%s", target, notes)
			}
		})
	}
}
