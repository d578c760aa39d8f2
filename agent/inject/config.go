package inject

import (
	"errors"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// webhookTimeoutSeconds bounds the API server's wait for the Handler, which
// answers from a cache.
const webhookTimeoutSeconds = 5

// WebhookOptions name and locate the webhook for WebhookConfiguration.
type WebhookOptions struct {
	// ConfigurationName names the MutatingWebhookConfiguration.
	ConfigurationName string
	// WebhookName is the webhook's fully qualified name, such as
	// "inject.ctrlmesh.io".
	WebhookName string
	// ClientConfig locates the Handler: a URL or a service, and the caBundle
	// that verifies it.
	ClientConfig admissionregistrationv1.WebhookClientConfig
}

// WebhookConfiguration is the MutatingWebhookConfiguration that sends the
// creation of every pod labeled ctrlmesh.io/enable-proxy=true, outside the
// system namespaces, to the Handler.
//
// It fails closed (failurePolicy Fail): an operator pod started without its
// proxy lists and watches every object of every shard and reconciles them
// alongside their owners, so while the Handler is unreachable opted-in pods
// are not created — their controllers retry — rather than created unsharded.
// Only opted-in pods pay for that; every other pod is filtered out by the
// object selector before any call.
//
// Reinvocation is off: the Handler's patch touches only the proxy, its
// volume and the containers present when it runs; containers a later
// webhook adds are not the operator's.
func WebhookConfiguration(opts WebhookOptions) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	if opts.ConfigurationName == "" || opts.WebhookName == "" {
		return nil, errors.New("inject: the webhook configuration needs a name and a webhook name")
	}
	if (opts.ClientConfig.URL == nil) == (opts.ClientConfig.Service == nil) {
		return nil, errors.New("inject: the webhook needs exactly one of a URL and a service")
	}
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: opts.ConfigurationName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         opts.WebhookName,
			ClientConfig: *opts.ClientConfig.DeepCopy(),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups:   []string{""},
					APIVersions: []string{"v1"},
					Resources:   []string{"pods"},
					Scope:       ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchPolicy:   ptr.To(admissionregistrationv1.Equivalent),
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: ctrlmeshv1alpha1.SystemNamespaces(),
			}}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true"}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To[int32](webhookTimeoutSeconds),
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
		}},
	}, nil
}

// MemberRBACRules are the member-cluster rights the injection needs, for
// the agent's ClusterRole: reading ShardRoutes (Handler), watching pods and
// recording Events on them (EventReconciler, RouteDeletedReconciler), and
// evicting the pods created without the proxy (Replacer) — by the eviction
// subresource only, which PodDisruptionBudgets guard, never by delete —
// and reading the API server's endpoints (Handler, Iptables interception).
func MemberRBACRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{ctrlmeshv1alpha1.GroupVersion.Group}, Resources: []string{"shardroutes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		// The API server's endpoints, for Iptables interception: the one
		// EndpointSlice kube-apiserver keeps for the kubernetes Service.
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, ResourceNames: []string{"kubernetes"}, Verbs: []string{"get"}},
	}
}
