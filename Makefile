# ctrlmesh Makefile. Every target builds what it needs; nothing is expected
# to be installed beforehand except Go.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

BIN           := $(CURDIR)/bin
GO            ?= go
CONTROLLER_GEN := $(GO) tool controller-gen

# The control-plane binaries the envtest suites run, built from source by the
# tools module in test/tools.
KUBE_VERSION  := v1.36.3
KUBE_APISERVER := $(BIN)/kube-apiserver
ETCD          := $(BIN)/etcd
KUBE_LDFLAGS  := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=36 \
	-X k8s.io/component-base/version.gitTreeState=clean \
	-X k8s.io/component-base/version.buildDate=2026-01-01T00:00:00Z \
	-X k8s.io/client-go/pkg/version.gitVersion=$(KUBE_VERSION)

# The node components of member clusters with real nodes, built from the
# same k8s.io/kubernetes version as kube-apiserver. The stamp names the
# version, so a version change rebuilds them.
KUBE_NODE_COMPONENTS := kubelet kube-controller-manager kube-scheduler kube-proxy
KUBE_NODE_STAMP      := $(BIN)/.kube-node-$(KUBE_VERSION)

# The Debian packages a real node runs on (containerd, runc, the CNI plugins
# in /usr/lib/cni, iptables and conntrack for the kubelet and kube-proxy, ip
# for the node's bridge).
NODE_PACKAGES := containerd runc containernetworking-plugins iptables conntrack iproute2

COMMANDS := ctrlmesh-hub ctrlmesh-agent ctrlmesh-proxy ctrlmeshctl
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X github.com/ctrlmesh/ctrlmesh/pkg/version.Version=$(VERSION)
# The four commands are built as their images build them
# (deploy/docker/Dockerfile; test/images.BuildStatic for the images of
# tests): static, paths trimmed, without symbol table and DWARF — so that
# the local fleet and its benchmarks run, and measure, what ships (a cgo,
# unstripped sidecar holds about 1 MiB more). test/images' TestBuildAsShipped
# holds the three to the same flags.
SHIPPED_BUILD := CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)'

# Karmada's own components, built from source by the tools module in
# test/tools/karmada (Karmada's Kubernetes libraries, v0.34, differ from
# kube-apiserver's): the Karmada control plane of the test environment and
# the local fleet is kube-apiserver with Karmada's CRDs plus these. The
# version must be the one the main module requires (its CRDs are read from
# there); the stamp file names it, so a version change rebuilds them.
KARMADA_VERSION    := v1.16.0
KARMADA_COMPONENTS := aggregated-apiserver controller-manager agent
KARMADA_STAMP      := $(BIN)/.karmada-$(KARMADA_VERSION)
KARMADA_LDFLAGS    := -s -w \
	-X github.com/karmada-io/karmada/pkg/version.gitVersion=$(KARMADA_VERSION) \
	-X github.com/karmada-io/karmada/pkg/version.gitTreeState=clean \
	-X github.com/karmada-io/karmada/pkg/version.buildDate=2026-01-01T00:00:00Z

# helm, built from source by go install (only the Go module proxy is needed),
# for rendering the charts in deploy/charts. The stamp file names the
# version, so changing HELM_VERSION rebuilds it.
HELM_VERSION := v3.22.0
HELM         := $(BIN)/helm
HELM_STAMP   := $(BIN)/.helm-$(HELM_VERSION)
HELM_LDFLAGS := -s -w \
	-X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=36 \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=36

# promtool, Prometheus' rule checker and rule unit-test runner, built from
# source by go install (only the Go module proxy is needed) for the alert
# tests of deploy/monitoring. remove_all_sd leaves out Prometheus' service
# discovery plugins, which promtool's rule commands never use. The stamp
# file names the version, so changing PROMETHEUS_VERSION rebuilds it.
PROMETHEUS_VERSION := v0.316.0
PROMTOOL_STAMP     := $(BIN)/.promtool-$(PROMETHEUS_VERSION)

# Container images (make images, needs Docker).
IMAGE_REGISTRY ?= ghcr.io/ctrlmesh
IMAGE_TAG      ?= $(VERSION)
DOCKER         ?= docker

# Third-party CRDs the hub serves when no Karmada/OCM control plane provides
# them, copied from the exact module versions go.mod pins.
KARMADA_DIR = $(shell $(GO) list -m -f '{{.Dir}}' github.com/karmada-io/karmada)
OCM_DIR     = $(shell $(GO) list -m -f '{{.Dir}}' open-cluster-management.io/api)

.PHONY: all
all: build

.PHONY: build
build: ## Build the ctrlmesh binaries (and kubectl-ctrlmesh, the kubectl plugin: a link to ctrlmeshctl), the demo operator and localfleet (the demo's fleet) into bin/.
	@mkdir -p $(BIN)
	$(SHIPPED_BUILD) -o $(BIN)/ $(addprefix ./cmd/,$(COMMANDS))
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./scenarios/demo-operator ./test/cmd/localfleet
	ln -sf ctrlmeshctl $(BIN)/kubectl-ctrlmesh

.PHONY: generate
generate: ## Generate deepcopy code and CRDs; copy third-party CRDs.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./apis/...
	$(CONTROLLER_GEN) crd paths=./apis/... output:crd:artifacts:config=deploy/crds
	@mkdir -p deploy/crds/third-party
	install -m 0644 $(KARMADA_DIR)/charts/karmada/_crds/bases/work/work.karmada.io_works.yaml deploy/crds/third-party/
	install -m 0644 $(OCM_DIR)/cluster/v1/0000_00_clusters.open-cluster-management.io_managedclusters.crd.yaml deploy/crds/third-party/

.PHONY: tools
tools: $(KUBE_APISERVER) $(ETCD) $(KUBE_NODE_STAMP) $(HELM_STAMP) $(KARMADA_STAMP) $(PROMTOOL_STAMP) ## Build kube-apiserver, etcd, the node components, helm, Karmada's components and promtool from source (once).

$(KUBE_APISERVER): test/tools/go.mod test/tools/go.sum
	@mkdir -p $(BIN)
	@echo "building kube-apiserver $(KUBE_VERSION) from source (a few minutes the first time)"
	cd test/tools && $(GO) build -trimpath -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/kube-apiserver

$(KUBE_NODE_STAMP): test/tools/go.mod test/tools/go.sum
	@mkdir -p $(BIN)
	@echo "building $(KUBE_NODE_COMPONENTS) $(KUBE_VERSION) from source (several minutes the first time)"
	cd test/tools && for c in $(KUBE_NODE_COMPONENTS); do \
		$(GO) build -trimpath -ldflags '$(KUBE_LDFLAGS)' -o $(BIN)/$$c k8s.io/kubernetes/cmd/$$c || exit 1; \
	done
	@rm -f $(BIN)/.kube-node-*
	@touch $@

.PHONY: node-packages
node-packages: ## Install the Debian packages real nodes run on (needs root; quick when installed).
	@if [ "$$(id -u)" != 0 ]; then echo "make node-packages: installing $(NODE_PACKAGES) needs root (real nodes need root anyway)"; exit 1; fi
	@if [ "$$(dpkg-query -W -f '$${Status}\n' $(NODE_PACKAGES) 2>/dev/null | grep -c '^install ok installed$$')" != $(words $(NODE_PACKAGES)) ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(NODE_PACKAGES); \
	else echo "node packages installed: $(NODE_PACKAGES)"; fi

# Debian's chromium, the headless browser the placement map's test
# (hub/placementmap) drives.
BROWSER_PACKAGES := chromium

.PHONY: browser-packages
browser-packages: ## Install Debian's chromium for the placement map's browser test (needs root; quick when installed).
	@if [ "$$(dpkg-query -W -f '$${Status}\n' $(BROWSER_PACKAGES) 2>/dev/null | grep -c '^install ok installed$$')" != $(words $(BROWSER_PACKAGES)) ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "make browser-packages: installing $(BROWSER_PACKAGES) needs root"; exit 1; fi; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(BROWSER_PACKAGES); \
	else echo "browser packages installed: $(BROWSER_PACKAGES)"; fi

$(ETCD): test/tools/go.mod test/tools/go.sum test/tools/etcd/main.go
	@mkdir -p $(BIN)
	@echo "building etcd from source"
	cd test/tools && $(GO) build -trimpath -ldflags '-s -w' -o $@ ./etcd

$(KARMADA_STAMP): test/tools/karmada/go.mod test/tools/karmada/go.sum
	@mkdir -p $(BIN)
	@echo "building karmada $(KARMADA_VERSION) components from source (several minutes the first time)"
	@test "$$($(GO) list -m -f '{{.Version}}' github.com/karmada-io/karmada)" = $(KARMADA_VERSION) || \
		{ echo "KARMADA_VERSION $(KARMADA_VERSION) is not the karmada version go.mod requires"; exit 1; }
	cd test/tools/karmada && for c in $(KARMADA_COMPONENTS); do \
		$(GO) build -trimpath -ldflags '$(KARMADA_LDFLAGS)' -o $(BIN)/karmada-$$c github.com/karmada-io/karmada/cmd/$$c || exit 1; \
	done
	@rm -f $(BIN)/.karmada-*
	@touch $@

$(HELM_STAMP):
	@mkdir -p $(BIN)
	@echo "building helm $(HELM_VERSION) from source"
	GOBIN=$(BIN) $(GO) install -trimpath -ldflags '$(HELM_LDFLAGS)' helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	@rm -f $(BIN)/.helm-*
	@touch $@

$(PROMTOOL_STAMP):
	@mkdir -p $(BIN)
	@echo "building promtool (prometheus $(PROMETHEUS_VERSION)) from source"
	GOBIN=$(BIN) $(GO) install -trimpath -tags remove_all_sd -ldflags '-s -w' github.com/prometheus/prometheus/cmd/promtool@$(PROMETHEUS_VERSION)
	@rm -f $(BIN)/.promtool-*
	@touch $@

.PHONY: test
test: tools node-packages browser-packages ## Unit, fuzz-seed and envtest suites against real API servers, with -race.
	CTRLMESH_TEST_ASSETS=$(BIN) $(GO) test -race -count=1 -timeout 30m ./...

# The chaos suite (test/chaos) in full; make test runs its short part (with
# -race). Without -race here: its bounds are timings, and the race detector's
# slowdown on 2 cores is no fleet's.
.PHONY: test-chaos
test-chaos: tools ## Chaos suite on the local fleet: partition, deselection, clock skew, API server restart, hub killed mid-handover.
	CTRLMESH_TEST_ASSETS=$(BIN) CTRLMESH_CHAOS=full $(GO) test -count=1 -timeout 30m -v ./test/chaos

# The real-pod suite (test/realpods) alone, verbose, for its measured
# figures; make test runs it too. Needs root (real nodes).
.PHONY: test-realpods
test-realpods: tools node-packages ## Real pods (root): the agent chart, the injected sidecar, no double reconcile through scaling, pod deletion, a rolling update and kubelet restarts.
	CTRLMESH_TEST_ASSETS=$(BIN) $(GO) test -race -count=1 -timeout 30m -v ./test/realpods

# Every fuzz target, as package:Target. Their seed corpora also run in make test.
FUZZ_TARGETS := \
	./pkg/sharding:FuzzParseSet ./pkg/sharding:FuzzShardSelector \
	./pkg/sharding:FuzzParseShardSelector ./pkg/sharding:FuzzOwnershipRanges \
	./proxy:FuzzRenameNameSegment ./proxy:FuzzRenameFieldSelector \
	./proxy:FuzzRenameJSONBody ./proxy:FuzzNarrow \
	./proxy/watchstream:FuzzCopyJSON ./proxy/watchstream:FuzzCopyJSONArbitrary \
	./proxy/watchstream:FuzzCopyProtobuf ./agent/labeler:FuzzHandler \
	./agent/inject:FuzzPodPatch ./proxy:FuzzFence ./proxy:FuzzCheckedBody \
	./pkg/route:FuzzCompile ./pkg/routework:FuzzReadStatus \
	./proxy/policy:FuzzMatch ./proxy/policy:FuzzHostOf \
	./proxy/webhook:FuzzRouteReview ./proxy:FuzzRenameProtobufBody \
	./proxy/redirect:FuzzParseDestination ./proxy/internal/request:FuzzSameAsAPIServer \
	./proxy:FuzzForwardRoute ./proxy:FuzzCheckListGzip \
	./hub/propagation:FuzzLeanDecode ./hub/propagation:FuzzWorkIdentity
FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 30s).
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; echo "== $$pkg $$fn"; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

.PHONY: lint
STATICCHECK_VERSION := v0.6.1

lint: ## gofmt, go vet and staticcheck over both modules.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	cd test/tools && $(GO) vet ./...

.PHONY: manifests
manifests: $(HELM_STAMP) ## Copy the CRDs (and the ShardRoute interpreter) into the charts and render deploy/manifests from them.
	install -m 0644 deploy/crds/ctrlmesh.io_shardingconfigs.yaml deploy/crds/ctrlmesh.io_circuitbreakers.yaml \
		deploy/crds/ctrlmesh.io_faultinjections.yaml deploy/charts/ctrlmesh-hub/files/crds/
	install -m 0644 deploy/crds/third-party/*.yaml deploy/charts/ctrlmesh-hub/files/crds/third-party/
	install -m 0644 deploy/crds/ctrlmesh.io_shardroutes.yaml deploy/charts/ctrlmesh-agent/files/crds/
	install -m 0644 deploy/karmada/shardroute-interpreter.yaml deploy/charts/ctrlmesh-hub/files/karmada/
	install -m 0644 deploy/monitoring/hub-alerts.yaml deploy/monitoring/ctrlmesh-dashboard.json deploy/charts/ctrlmesh-hub/files/monitoring/
	install -m 0644 deploy/monitoring/member-alerts.yaml deploy/charts/ctrlmesh-agent/files/monitoring/
	deploy/manifests/render.sh $(HELM) deploy/manifests

.PHONY: images
images: ## Build the four container images with Docker (needs a Docker engine with BuildKit).
	@for c in $(COMMANDS); do \
		echo "== $(IMAGE_REGISTRY)/$$c:$(IMAGE_TAG)"; \
		$(DOCKER) build -f deploy/docker/Dockerfile --build-arg COMMAND=$$c --build-arg VERSION=$(VERSION) \
			-t $(IMAGE_REGISTRY)/$$c:$(IMAGE_TAG) . || exit 1; \
	done

.PHONY: verify-generate
verify-generate: generate ## Fail when generated files are not checked in.
	@git diff --exit-code -- apis deploy/crds || { echo "generated files are stale: run 'make generate' and commit"; exit 1; }

# make demo and make local-up run on real nodes (root, node-packages);
# DEMO_ARGS=--processes runs the fleet of local processes instead, and
# make demo-karmada is one.
.PHONY: demo
demo: tools node-packages build ## Local fleet on real nodes (hub + 2 members, each with a kubelet; no Docker): the four steps, a canary, a pod deleted and healed.
	$(BIN)/localfleet demo $(DEMO_ARGS)

.PHONY: demo-karmada
demo-karmada: tools build ## The demo on a Karmada control plane: member1 joined push, member2 pull; sync modes beside the placement.
	$(BIN)/localfleet demo --karmada $(DEMO_ARGS)

.PHONY: local-up
local-up: tools node-packages build ## The demo's fleet on real nodes with the ShardingConfig Ready, up until Ctrl-C (DEMO_ARGS=--processes or --karmada: processes).
	$(BIN)/localfleet up $(DEMO_ARGS)

.PHONY: help
help:
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: bench-proxy
bench-proxy: tools ## Proxy overhead vs direct against a real API server (GET, LIST 1k/10k, WATCH), 20 traffic policies loaded; the policy check per request and the range-mode list check per LIST.
	CTRLMESH_TEST_ASSETS=$(BIN) $(GO) run ./test/bench/proxybench $(BENCH_ARGS)
	$(GO) test -run '^$$' -bench BenchmarkCheck -benchmem ./proxy/policy ./proxy

.PHONY: bench-fleet
bench-fleet: tools build ## Local fleet: operator RSS 1 vs 4 pods (20k objects), ShardingConfig edit -> enforced p50/p99 standalone and on Karmada, failover after a pod kill.
	CTRLMESH_TEST_ASSETS=$(BIN) $(GO) run ./test/bench/fleetbench $(BENCH_ARGS)

.PHONY: bench-fleet-heavy
bench-fleet-heavy: tools build ## The fleet benchmark's memory phase on the heavier workload its RSS goal is stated on: 50,000 ConfigMaps of 1 KiB.
	CTRLMESH_TEST_ASSETS=$(BIN) $(GO) run ./test/bench/fleetbench -phases=memory -objects=50000 -payload=1024 -namespaces=512 $(BENCH_ARGS)

# The scales and settings of README's scale table and plot: members heartbeat
# every 60 s, as OCM's klusterlet does; the hub runs under the chart's 1 GiB
# (GOMEMLIMIT 921 MiB), and the hub API server under 13 GiB, which 100,000
# Works need on a 24 GiB machine; the benchmark's own process, which holds the
# simulated members' caches of every Work, under 5 GiB. About 2 h on 2 cores.
SCALE_ARGS ?= -scales=10x10,100x10,10x100,1000x10,100x100,1000x100 -renew=60s -lease=2m -ceiling=0 \
	-hub-gomemlimit=921MiB -apiserver-gomemlimit=13GiB -ready-within=75m -step-within=8m -total=200m \
	-hub-args="--leader-elect-lease-duration=120s --leader-elect-renew-deadline=100s --leader-elect-retry-period=10s"

.PHONY: bench-scale
bench-scale: tools ## The hub at fleet scale (10, 100, 1000 simulated members; 10, 100 configs): apply -> Ready, hub RSS/CPU/requests, pod failure, restart, lost Fleet member; curves into docs/scale.svg; a hub's start with 20,000 Works, lists read whole and streamed; the working model's and the cache's bytes per Work.
	GOMEMLIMIT=5GiB CTRLMESH_TEST_ASSETS=$(BIN) $(GO) run ./test/bench/scalebench -plot docs/scale.svg -startup=20000 $(SCALE_ARGS) $(BENCH_ARGS)
	$(GO) test -run '^$$' -bench BenchmarkModelBytes -benchtime 3x ./hub/state
	CTRLMESH_TEST_ASSETS=$(BIN) $(GO) test -run '^$$' -bench BenchmarkCachedWorkBytes -benchtime 3x ./hub/propagation
