# pulse — see README.md. Every target runs from a fresh clone; .ci/run installs
# what a fresh machine lacks (protoc for `proto`/`verify`).
GO        ?= go
BIN       := bin
TOOLS     := $(BIN)/tools
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
TAGS      := grpcnotrace
LDFLAGS   := -X github.com/pulse-io/pulse/pkg/version.Version=$(VERSION)
PKGS      := ./...
# The generated code in proto/ names the protoc that made it.
PROTOC_VERSION := 3.21.12
FUZZTIME  ?= 20s

.PHONY: all build demo-bins run test e2e e2e-node e2e-tools bench agent-cost fuzz lint fmt proto verify verify-no-binaries verify-layout helm-lint chart-docs clean fleet fleet-test images sim-suite gpu-check

# helm, built from the module proxy and cached outside the repository.
HELM = $(shell test/e2e/tools/build.sh helm)/helm

all: build

build: demo-bins
	@echo "== building pulse-relay, pulse-sim and pulsectl (first build: a few minutes)"
	$(GO) build -tags $(TAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/pulse-relay ./cmd/relay
	$(GO) build -tags $(TAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/pulse-sim ./cmd/pulse-sim
	$(GO) build -tags $(TAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/pulsectl ./cmd/pulsectl

# What the local demo runs, and nothing else.
demo-bins:
	@echo "== building pulse-agent (cgo, for NVML: needs gcc), pulse-aggregator, vllm-sim and pulse-demo into $(BIN)/"
	@echo "   the first build downloads the modules and compiles client-go and gRPC: about 2½ minutes on 2 idle cores, up to 15 on busy ones; later ones seconds"
	CGO_ENABLED=1 $(GO) build -tags $(TAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/pulse-agent ./cmd/agent
	$(GO) build -tags $(TAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/pulse-aggregator ./cmd/aggregator
	$(GO) build -o $(BIN)/vllm-sim ./test/vllmsim/cmd/vllm-sim
	$(GO) build -o $(BIN)/pulse-demo ./test/demo

# The local demo: an aggregator, a static-mode agent and five simulated vLLM
# pods on loopback. Ctrl-C stops all of it. Its addresses, for when a port is
# taken: make run DEMO_HTTP=127.0.0.1:18080 ...
DEMO_HTTP   ?= 127.0.0.1:8080
DEMO_SCALER ?= 127.0.0.1:9090
DEMO_INGEST ?= 127.0.0.1:9091
DEMO_AGENT  ?= 127.0.0.1:8081
run: demo-bins
	$(BIN)/pulse-demo --bin=$(BIN) --http-addr=$(DEMO_HTTP) --scaler-addr=$(DEMO_SCALER) \
	  --ingest-addr=$(DEMO_INGEST) --agent-http-addr=$(DEMO_AGENT)

test: helm-lint
	@echo "== go vet, then every package's unit and integration tests with -race (first run compiles with -race: about 10 minutes on 2 idle cores, up to 28 on busy ones)"
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 $(PKGS)
	@echo "== the allocation counts the race detector changes (skipped under it), without it"
	$(GO) test -count=1 -run '^TestCodecReusesABatchsColumns$$' ./pkg/ingest/
	cd tools/images && $(GO) vet ./... && $(GO) test -count=1 ./...

# Lint and render each chart with each of its ci/*-values.yaml (the defaults
# and every optional part on).
helm-lint:
	@test -x $(HELM) || { echo "helm was not built: run test/e2e/tools/build.sh helm to see why"; exit 1; }
	@for c in deploy/daemonset deploy/aggregator; do \
	  for f in $$c/ci/*-values.yaml; do \
	    echo "helm lint/template $$c -f $$f"; \
	    $(HELM) lint --quiet $$c -f $$f >/dev/null || { $(HELM) lint $$c -f $$f; exit 1; }; \
	    out=$$($(HELM) template $$(sed -n "s/^name: //p" $$c/Chart.yaml) $$c --namespace pulse-system -f $$f) || exit 1; \
	    if echo "$$out" | grep -q -- '--owner-cluster-role' && ! echo "$$out" | grep -q '^kind: ClusterRole$$'; then \
	      echo "$$f: --owner-cluster-role names a ClusterRole the chart does not render"; exit 1; fi; \
	  done; \
	done
	@echo "helm template deploy/aggregator -f deploy/aggregator/ci/tls-files-rbac-values.yaml: no managed certificates' RBAC"
	@out=$$($(HELM) template pulse-aggregator deploy/aggregator --namespace pulse-system -f deploy/aggregator/ci/tls-files-rbac-values.yaml) || exit 1; \
	  ! echo "$$out" | grep -E 'clustertriggerauthentications|resources: \["secrets"\]'

# OCI image tarballs, bin/images/<name>.tar (pulse-agent, pulse-aggregator, pulse-relay,
# vllm-sim, pause), built without a Docker engine by tools/images: the same
# digest for the same source. Each prints `name reference digest path`;
# `ctr images import` names it REGISTRY/<name>:VERSION. The agent's glibc
# comes from Debian's libc6, pinned in tools/images/debian-packages.lock.
# IMAGES_FLAGS: e.g. --only pulse-agent, --update-lock (docs: README.md, Images).
REGISTRY     ?= ghcr.io/pulse-io
IMAGES_FLAGS ?=
images:
	$(GO) run -C tools/images . --repo $(CURDIR) --out $(CURDIR)/$(BIN)/images \
	  --version $(VERSION) --registry $(REGISTRY) $(IMAGES_FLAGS)

# Each chart's README.md, generated from its values.yaml comments and
# README.md.gotmpl by helm-docs, pinned in tools/helm-docs/go.mod.
chart-docs:
	$(GO) tool -modfile=tools/helm-docs/go.mod helm-docs --chart-search-root deploy --sort-values-order file

# The e2e test on a real kube-apiserver with the real KEDA operator; the
# first run builds the tools (about 20 minutes on 2 cores), later runs reuse them.
e2e-tools:
	test/e2e/tools/build.sh all

e2e: build e2e-tools
	tools=$$(test/e2e/tools/build.sh all) || exit 1; PULSE_E2E_TOOLS=$$tools PULSE_E2E_BIN=$(CURDIR)/$(BIN) \
	  $(GO) test -tags e2e -count=1 -timeout 30m -v ./test/e2e/

# The real-node e2e (test/e2e/README.md): as root, one Kubernetes node on
# this machine (containerd, kubelet, kube-proxy, CoreDNS), both charts
# installed from the images make images builds. The host is restored after.
e2e-node: build images
	tools=$$(test/e2e/tools/build.sh node) || exit 1; PULSE_E2E_TOOLS=$$tools PULSE_E2E_BIN=$(CURDIR)/$(BIN) \
	  PULSE_E2E_IMAGES=$(CURDIR)/$(BIN)/images test/e2e/node/run.sh

bench:
	$(GO) test -run='^$$' -bench=. -benchmem -count=1 $(PKGS)

# The agent's CPU and memory beside Debian's Prometheus scraping the same 8
# simulated vLLM pods at the same interval (docs/performance.md).
# AGENT_COST_FLAGS: e.g. --interval 15s, --perf DIR.
AGENT_COST_FLAGS ?=
agent-cost: build
	$(GO) run ./test/agentcost --bin $(BIN) $(AGENT_COST_FLAGS)

# A fleet on one box (test/fleet): a real pulse-aggregator driven by N agent
# streams and K ScaledObjects on loopback, measured, with faults on request.
# FLEET_ARGS: e.g. --agents 1000 --pods-per-agent 8 --scaledobjects 500 --duration 60s
FLEET_ARGS ?=
fleet: build
	$(GO) run ./test/fleet --bin $(BIN) $(FLEET_ARGS)

# Each fault scenario of the fleet harness as a test that asserts its
# behaviour (build tag fleet; about 2 minutes).
fleet-test: build
	PULSE_FLEET_BIN=$(CURDIR)/$(BIN) $(GO) test -race -tags fleet -count=1 -timeout 20m -v ./test/fleet/

# pulse-sim's shipped benchmark suite: the clairvoyant frontier must bound
# every pipeline of every case (docs/simulation.md, "The benchmark").
# GOGC as pulse-sim sets it (cmd/pulse-sim/main.go) unless given.
sim-suite:
	GOGC=$${GOGC:-400} $(GO) test -tags suite -count=1 -timeout 30m -run TestShippedSuiteClairvoyantBounds -v ./pkg/sim/bench/

# On a machine with an NVIDIA driver and PyTorch: the agent reads the real GPU
# through NVML, attributed through a kubelet (pod-resources) fake, idle and
# under test/integration/gpuload.py (build tag nvml; about a minute).
gpu-check:
	$(GO) test -tags nvml -count=1 -run TestRealDriver -bench BenchmarkRealRead -benchmem -v ./pkg/gpu
	PULSE_GPU_LOAD='python3 $(CURDIR)/test/integration/gpuload.py 60' \
	  $(GO) test -tags nvml -count=1 -run TestRealGPUThroughTheAgent -v ./test/integration

# Each fuzz target runs for FUZZTIME.
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzExtract$$' -fuzztime=$(FUZZTIME) ./pkg/vllm
	$(GO) test -run='^$$' -fuzz='^FuzzDecode$$' -fuzztime=$(FUZZTIME) ./pkg/wire
	$(GO) test -run='^$$' -fuzz='^FuzzReport$$' -fuzztime=$(FUZZTIME) ./pkg/ingest
	$(GO) test -run='^$$' -fuzz='^FuzzParseTrigger$$' -fuzztime=$(FUZZTIME) ./pkg/scaler
	$(GO) test -run='^$$' -fuzz='^FuzzMetricName$$' -fuzztime=$(FUZZTIME) ./pkg/scaler
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=$(FUZZTIME) ./pkg/provision
	$(GO) test -run='^$$' -fuzz='^FuzzMake$$' -fuzztime=$(FUZZTIME) ./pkg/planner
	$(GO) test -run='^$$' -fuzz='^FuzzServeConn$$' -fuzztime=$(FUZZTIME) ./pkg/framed
	$(GO) test -run='^$$' -fuzz='^FuzzServeConnReadOnReady$$' -fuzztime=$(FUZZTIME) ./pkg/framed

# golangci-lint (.golangci.yml), pinned in tools/golangci-lint/go.mod: its dependencies
# cannot share the main module's.
lint:
	$(GO) vet $(PKGS)
	$(GO) tool -modfile=tools/golangci-lint/go.mod golangci-lint run $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

# vtprotobuf: UnmarshalVT and pools for the agent's messages and batches,
# which the aggregator's ingest codec reuses (pkg/ingest/codec.go).
VTPOOL := ,pool=github.com/pulse-io/pulse/proto/pulse/v1.AgentMessage,pool=github.com/pulse-io/pulse/proto/pulse/v1.SampleBatch

proto:
	@protoc --version | grep -qx 'libprotoc $(PROTOC_VERSION)' || \
	  { echo "make proto needs protoc $(PROTOC_VERSION) (Debian bookworm protobuf-compiler); found: $$(protoc --version)"; exit 1; }
	$(GO) build -o $(TOOLS)/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	$(GO) build -o $(TOOLS)/protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc
	$(GO) build -o $(TOOLS)/protoc-gen-go-vtproto github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto
	protoc --plugin=protoc-gen-go=$(TOOLS)/protoc-gen-go \
	  --plugin=protoc-gen-go-grpc=$(TOOLS)/protoc-gen-go-grpc \
	  --plugin=protoc-gen-go-vtproto=$(TOOLS)/protoc-gen-go-vtproto \
	  --go_out=. --go_opt=paths=source_relative \
	  --go-grpc_out=. --go-grpc_opt=paths=source_relative \
	  --go-vtproto_out=. --go-vtproto_opt=paths=source_relative,features=unmarshal+pool$(VTPOOL) \
	  proto/pulse/v1/ingest.proto

# Tidy modules, regenerate code, format: each must leave the tree unchanged;
# and no tracked file is a compiled binary (ELF) or an executable that is not
# a script.
verify: verify-no-binaries verify-layout
	$(GO) mod tidy && git diff --exit-code go.mod go.sum
	for m in tools/*/; do (cd $$m && $(GO) mod tidy) && git diff --exit-code $$m || exit 1; done
	$(MAKE) proto && git diff --exit-code proto/
	$(MAKE) fmt && git diff --exit-code
	$(MAKE) chart-docs && git diff --exit-code deploy/
	@# A file generated anew (not in git) is no diff: none may be left.
	@test -z "$$(git status --porcelain --untracked-files=all -- go.mod go.sum tools proto deploy pkg cmd)" || \
		{ git status --porcelain --untracked-files=all -- go.mod go.sum tools proto deploy pkg cmd; echo "verify: files made or changed above that git does not have"; exit 1; }

verify-no-binaries:
	@bad=$$(git ls-files -s | while read -r mode _ _ f; do \
	  [ -f "$$f" ] || continue; \
	  magic=$$(head -c 4 "$$f" | od -An -tx1 | tr -d ' \n'); \
	  if [ "$$magic" = "7f454c46" ]; then echo "$$f (ELF)"; \
	  elif [ "$$mode" = "100755" ] && [ "$$(head -c 2 "$$f")" != "#!" ]; then echo "$$f (executable, not a script)"; fi; \
	done); \
	if [ -n "$$bad" ]; then echo "tracked binaries (remove them; build outputs are ignored):"; echo "$$bad"; exit 1; fi

# The README's layout section names every directory of cmd, pkg, pkg/sim,
# test and deploy.
verify-layout:
	@layout=$$(sed -n '/^## Layout/,/^## [^L]/p' README.md); bad=; \
	for d in cmd/* pkg/* test/* deploy/*; do [ -d "$$d" ] || continue; \
	  printf '%s' "$$layout" | grep -qF "\`$$d\`" || bad="$$bad $$d"; done; \
	for d in pkg/sim/*; do [ -d "$$d" ] && [ "$${d##*/}" != testdata ] || continue; \
	  printf '%s' "$$layout" | grep -qF "\`$${d##*/}\`" || bad="$$bad $$d"; done; \
	if [ -n "$$bad" ]; then echo "README.md's layout section does not name:$$bad"; exit 1; fi

clean:
	rm -rf $(BIN)
