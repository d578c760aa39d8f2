package main

import (
	"os/exec"
	"strings"
	"testing"
)

// forbiddenDeps are packages the sidecar must not link, each with why: a
// proxy runs in every operator pod, and what it links it pays for in
// memory (the code and data of every package, and what their init
// functions build) whether it uses it or not. A prefix ending in "/" forbids
// the packages under it.
var forbiddenDeps = []struct{ prefix, why string }{
	{"sigs.k8s.io/controller-runtime/", "its manager, cache, client and webhook server; the proxy watches one ShardRoute with client-go's informer (pkg/log/zap, for the logging flags every ctrlmesh command shares, is allowed)"},
	{"github.com/karmada-io/", "Karmada's APIs are the hub's and the agent's"},
	{"open-cluster-management.io/", "OCM's APIs are the hub's"},
	{"k8s.io/apiextensions-apiserver/", "CRD types"},
	{"github.com/ctrlmesh/ctrlmesh/pkg/scheme", "a scheme of every API ctrlmesh speaks; the proxy decodes only lock kinds and ShardRoutes"},
	{"k8s.io/client-go/kubernetes", "the typed clientset and its scheme of every built-in API"},
	{"k8s.io/client-go/discovery", "pulls in OpenAPI; the proxy reads discovery documents as plain JSON (proxy/discovery.go)"},
	{"k8s.io/client-go/informers", "informers of every built-in API"},
	{"k8s.io/kube-openapi/", "OpenAPI documents the proxy never reads"},
	{"github.com/google/gnostic-models/", "OpenAPI protobuf models, registered at init"},
	{"k8s.io/apiserver/", "its feature gates and metrics registries; the proxy parses requests with its copy of RequestInfoFactory (proxy/internal/request)"},
	{"k8s.io/component-base/", "feature gates and metrics of Kubernetes' own components"},
	{"github.com/spf13/cobra", "a command framework (and text/template) for one command; the flags are pflag's"},
	{"k8s.io/api/", "typed APIs, each registering its protobuf types at start: the proxy renames lock bodies field by field (proxy/lock.go), decoding no typed object, and reads AdmissionReviews as plain JSON (proxy/webhook)"},
	{"github.com/prometheus/", "Prometheus' client (and its data model, procfs, database/sql through its collectors): the proxy writes its metrics as text (proxy/internal/metrics)"},
	{"google.golang.org/protobuf/proto", "Google's protobuf runtime, through Prometheus' client (4.6 MB of the binary with it)"},
	{"google.golang.org/protobuf/reflect/", "Google's protobuf descriptors and registry, through Prometheus' client"},
	{"database/sql", "through Prometheus' client's collectors"},
}

// allowedDeps are exceptions to forbiddenDeps.
var allowedDeps = []string{"sigs.k8s.io/controller-runtime/pkg/log", "sigs.k8s.io/controller-runtime/pkg/log/zap", "sigs.k8s.io/controller-runtime/pkg/internal/log"}

// TestNoForbiddenDeps fails when ctrlmesh-proxy links a package it must
// not (forbiddenDeps), naming the chain of imports that brought it in.
func TestNoForbiddenDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	imports := map[string][]string{}
	var order []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, ": ")
		imports[pkg] = strings.Fields(deps)
		order = append(order, pkg)
	}
	t.Logf("ctrlmesh-proxy links %d packages", len(order))
	for _, pkg := range order {
		if isAllowed(pkg) {
			continue
		}
		for _, f := range forbiddenDeps {
			if pkg == strings.TrimSuffix(f.prefix, "/") || strings.HasPrefix(pkg, f.prefix) {
				t.Errorf("ctrlmesh-proxy links %s (%s), through %s", pkg, f.why, strings.Join(importChain(imports, order[len(order)-1], pkg), " -> "))
				break
			}
		}
	}
}

func isAllowed(pkg string) bool {
	for _, a := range allowedDeps {
		if pkg == a {
			return true
		}
	}
	return false
}

// importChain returns a shortest chain of imports from root to pkg.
func importChain(imports map[string][]string, root, pkg string) []string {
	from := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == pkg {
			var chain []string
			for p := pkg; p != ""; p = from[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, next := range imports[cur] {
			if _, seen := from[next]; !seen {
				from[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return []string{pkg}
}
