package inject

import (
	"encoding/json"
	"path"
	"regexp"
	"slices"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "k8s.io/apimachinery/pkg/util/json"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

const fuzzCertDir = "/certs"

// FuzzPodPatch checks, for any pod and each interception, that the patch
// only adds (or, for the annotations, overwrites; under the in-cluster
// interceptions it also removes the operator containers' service-account
// mounts), that applied it gives exactly the injected pod, that a second
// pass adds nothing, and that no pod ends with two proxies, a container
// with two KUBECONFIGs, or an injected operator container that reads
// another service-account directory than the proxy's.
//
// The patch is applied to the pod as encoded by this module's Pod type: the
// API server sends an encoding of its own Pod type, never what arbitrary
// bytes decode from (null list elements, say); that a patch applies to a
// real API server's pods is what the end-to-end tests show.
func FuzzPodPatch(f *testing.F) {
	pods := []corev1.Pod{
		fuzzPod(nil),
		fuzzPod(map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true"}),
		fuzzPod(map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true", "app": "op"}),
		fuzzPod(map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true", "app": "other"}),
	}
	withCerts := fuzzPod(map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true", "app": "op"})
	withCerts.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cert", MountPath: fuzzCertDir + "/"}}
	withKubeconfig := fuzzPod(map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true", "app": "op"})
	withKubeconfig.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "KUBECONFIG", Value: "/etc/other"}}
	withProxy := fuzzPod(map[string]string{ctrlmeshv1alpha1.EnableProxyLabel: "true", "app": "op"})
	withProxy.Spec.Containers = append(withProxy.Spec.Containers, corev1.Container{Name: ctrlmeshv1alpha1.ProxyContainerName})
	pods = append(pods, withCerts, withKubeconfig, withProxy)
	for _, p := range pods {
		data, err := json.Marshal(&p)
		if err != nil {
			f.Fatal(err)
		}
		for mode := range uint8(len(fuzzInterceptions)) {
			f.Add(data, false, mode)
			f.Add(data, true, mode)
		}
	}
	f.Add([]byte(`{"metadata":{"annotations":{"a/b~c":"x"},"labels":{"app":"op","ctrlmesh.io/enable-proxy":"true"}},"spec":{"containers":[{"name":"m","env":[{"name":"X"}]}],"initContainers":[],"volumes":null}}`), true, uint8(0))
	f.Add([]byte(`{"Metadata":{"labels":{"app":"op","ctrlmesh.io/enable-proxy":"true"}}}`), false, uint8(1))
	f.Add([]byte(`{"metadata":{"labels":{"app":"op","ctrlmesh.io/enable-proxy":"true"}},"spec":{"containers":[{"name":"m","env":[{"name":"https_proxy","value":"http://corp:3128"},{"name":"NO_PROXY"}]}]}}`), false, uint8(1))
	f.Add([]byte(`{"metadata":{"labels":{"app":"op","ctrlmesh.io/enable-proxy":"true"}},"spec":{"containers":[{"name":"m","volumeMounts":[{"name":"kube-api-access-x","mountPath":"/var/run/secrets/kubernetes.io/serviceaccount/"},{"name":"a","mountPath":"/a"}]}]}}`), false, uint8(2))

	opts, err := Options{Image: "proxy"}.withDefaults()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, podJSON []byte, webhook bool, modeIndex uint8) {
		mode := fuzzInterceptions[int(modeIndex)%len(fuzzInterceptions)]
		route := fuzzRoute("op", webhook)
		route.Spec.Interception = mode
		routes := []ctrlmeshv1alpha1.ShardRoute{route, fuzzRoute("unrelated", false)}
		ops, err := podPatch(podJSON, "ns", routes, opts)
		if err != nil {
			return // refused, never patched
		}
		for _, op := range ops {
			if op.Operation == "remove" && (mode == "" || !mountPathPattern.MatchString(op.Path)) {
				t.Fatalf("the patch removes %s", op.Path)
			}
		}
		var want corev1.Pod
		if err := kjson.Unmarshal(podJSON, &want); err != nil {
			t.Fatalf("podPatch decoded what kjson does not: %v", err)
		}
		encoded, err := json.Marshal(&want)
		if err != nil {
			t.Fatal(err)
		}
		mutate(&want, "ns", routes, opts)

		patchJSON, err := json.Marshal(ops)
		if err != nil {
			t.Fatal(err)
		}
		patch, err := jsonpatch.DecodePatch(patchJSON)
		if err != nil {
			t.Fatalf("decoding the patch %s: %v", patchJSON, err)
		}
		patched, err := patch.Apply(encoded)
		if err != nil {
			t.Fatalf("applying the patch %s to %s: %v", patchJSON, encoded, err)
		}
		var got corev1.Pod
		if err := kjson.Unmarshal(patched, &got); err != nil {
			t.Fatalf("decoding the patched pod: %v", err)
		}
		if !equality.Semantic.DeepEqual(got, want) {
			t.Fatalf("the patched pod differs from the injected one:\npatched  %s\ninjected %+v", patched, want)
		}

		again, err := podPatch(patched, "ns", routes, opts)
		if err != nil || len(again) != 0 {
			t.Fatalf("a second pass: %v, %+v", err, again)
		}
		proxies := 0
		for _, c := range slices.Concat(got.Spec.InitContainers, got.Spec.Containers) {
			if c.Name == ctrlmeshv1alpha1.ProxyContainerName {
				proxies++
			}
		}
		if proxies > 1 {
			t.Fatalf("%d proxies", proxies)
		}
		for _, c := range got.Spec.Containers {
			for _, name := range []string{"KUBECONFIG", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"} {
				n := 0
				for _, e := range c.Env {
					if e.Name == name {
						n++
					}
				}
				if n > 1 {
					t.Fatalf("container %q has %d %ss", c.Name, n, name)
				}
			}
		}
		if mode == "" || got.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation] != ctrlmeshv1alpha1.ProxyInjected {
			return
		}
		for _, c := range got.Spec.Containers {
			var sa []string
			for _, m := range c.VolumeMounts {
				if path.Clean(m.MountPath) == ServiceAccountMountPath {
					sa = append(sa, m.Name)
				}
			}
			if !slices.Equal(sa, []string{ServiceAccountVolume}) {
				t.Fatalf("container %q mounts %v at the service-account directory, want only %s", c.Name, sa, ServiceAccountVolume)
			}
		}
	})
}

// fuzzInterceptions are the routes' interceptions FuzzPodPatch picks from.
var fuzzInterceptions = []ctrlmeshv1alpha1.Interception{"", ctrlmeshv1alpha1.InterceptEnvironment, ctrlmeshv1alpha1.InterceptIptables}

// mountPathPattern matches the JSON pointer of an operator container's
// volume mount, or of a field of one.
var mountPathPattern = regexp.MustCompile(`^/spec/containers/[0-9]+/volumeMounts/[0-9]+(/.*)?$`)

func fuzzPod(labels map[string]string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "op-", Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "op"}, {Name: "other", Image: "x"}}},
	}
}

func fuzzRoute(app string, webhook bool) ctrlmeshv1alpha1.ShardRoute {
	r := ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: app},
		Spec:       ctrlmeshv1alpha1.ShardRouteSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
	}
	if webhook {
		r.Spec.Webhook = &ctrlmeshv1alpha1.WebhookConfig{CertDir: fuzzCertDir, Port: 9443}
	}
	return r
}
