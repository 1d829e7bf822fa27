# kvmesh — build, test, benchmark and demo.
# `make demo` and `make test` are the two commands a newcomer needs.

GO        ?= go
PKGS      ?= ./...
BENCHTIME ?= 1s
BIN       := bin/kvmesh

.PHONY: all build demo test deps fmt-check tidy-check vet staticcheck unit unit-norace bench fuzz chaos clean kube-bins image-rootfs

all: build

# deps installs what cgo needs (libzmq for github.com/pebbe/zmq4) and the tools some tests drive (node and npm
# for the openai client and k6 script checks, Debian's nats-server for the README's install path, kubectl with kustomize v4+ (1.21+) for the
# manifests (built from the Go module proxy when none is installed), Python's httpx and aiohttp for the
# Python client test, Python's Jinja2 for the chat-template reference) when they are missing. With CI=true a
# test whose tool is missing fails instead of skipping (internal/testutil.RequireTool).
deps:
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	apt() { $$SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq "$$@" >/dev/null; }; \
	skipped() { echo "WARNING: could not install $$1: the tests that need it skip (and fail with CI=true)"; }; \
	if ! pkg-config --exists libzmq 2>/dev/null; then \
		echo "installing libzmq3-dev and pkg-config (apt-get)"; apt libzmq3-dev pkg-config || exit 1; \
	fi; \
	command -v gcc >/dev/null || { echo "installing gcc (apt-get; cgo builds github.com/pebbe/zmq4)"; apt gcc libc6-dev || exit 1; }; \
	command -v node >/dev/null || { echo "installing nodejs (apt-get)"; apt nodejs || skipped node; }; \
	command -v npm >/dev/null || { echo "installing npm (apt-get)"; apt npm || skipped npm; }; \
	command -v nats-server >/dev/null || { echo "installing nats-server (apt-get)"; apt nats-server || skipped nats-server; }; \
	kubectl_ok() { m=$$(kubectl version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -1); \
		k=$$(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9]*\).*/\1/p'); \
		{ [ -n "$$m" ] && [ "$$m" -ge 21 ]; } || { [ -n "$$k" ] && [ "$$k" -ge 4 ]; }; }; \
	command -v kubectl >/dev/null || { echo "installing kubectl (apt-get)"; apt kubectl || true; }; \
	kubectl_ok || { echo "building kubectl from the Go module proxy (none installed renders the manifests' kustomizations: Debian's newest is 1.20)"; \
		d=$$(KVMESH_KUBECTL=1 bash hack/kube-bins.sh) && $$SUDO ln -sf "$$d/kubectl" /usr/local/bin/kubectl && kubectl_ok || skipped kubectl; }; \
	pyclients() { "$$1" -c 'import httpx, aiohttp' 2>/dev/null; }; \
	pyclients python3 || pyclients /usr/bin/python3 || { echo "installing python3-httpx and python3-aiohttp (apt-get)"; \
		apt python3-httpx python3-aiohttp || skipped "python3-httpx and python3-aiohttp"; }; \
	python3 -c 'import jinja2' 2>/dev/null || /usr/bin/python3 -c 'import jinja2' 2>/dev/null || { echo "installing python3-jinja2 (apt-get)"; \
		apt python3-jinja2 || skipped python3-jinja2; }

build: deps
	$(GO) build -o $(BIN) ./cmd/kvmesh

demo: build
	./$(BIN) demo

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# tidy-check fails when go.mod or go.sum is not what `go mod tidy` writes, or a module in the cache was altered.
tidy-check:
	@out=$$($(GO) mod tidy -diff) || { echo "go mod tidy needed:"; echo "$$out"; exit 1; }
	$(GO) mod verify

vet: deps
	$(GO) vet $(PKGS)

# staticcheck runs honnef.co/go/tools at a pinned version (fetched from the module proxy into the module cache,
# not into go.mod), every default check. A deliberate exception carries a //lint:ignore with its reason.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
staticcheck: deps
	$(GO) run $(STATICCHECK) $(PKGS)

unit: deps
	$(GO) test -race -count=1 -timeout 15m $(PKGS)

# unit-norace runs what -race hides: allocation guards (sync.Pool drops items under the race detector, so
# TestScheduleNoAlloc and friends are built only without it), the long golden and tiktoken-conversion cases
# skipped under -race, and the tokenizer's reference comparisons (-race runs a quarter of their cases). A test that skips or is left out under -race belongs in NORACE_RUN.
NORACE_RUN ?= NoAlloc|Golden|Tiktoken|ComponentsMatchReference|ReferenceModels
unit-norace: deps
	$(GO) test -count=1 -timeout 10m -run '$(NORACE_RUN)' $(PKGS)

# kube-bins builds (once; cached in $$HOME/.cache/kvmesh/kube) the real kube-apiserver and etcd that the
# Kubernetes integration tests (internal/kubetest) run against. Cold: 6-8 min on 2 cores, so a cold
# `make test` takes ~15-20 min; warm it adds nothing.
kube-bins:
	@bash hack/kube-bins.sh

test: deps kube-bins fmt-check tidy-check vet staticcheck unit unit-norace

# chaos runs the whole mesh as processes on loopback under load and kills each
# part in turn (SIGKILL), partitions NATS from one ingress and drops ZMQ
# batches; it prints the report kept in docs/RELIABILITY.md. Not part of test.
CHAOS_SOAK ?= 60s
chaos: deps
	mkdir -p bin && CHAOS_SOAK=$(CHAOS_SOAK) CHAOS_REPORT=$${CHAOS_REPORT:-$(CURDIR)/bin/chaos-report.md} $(GO) test -tags chaos -run '^TestChaos$$' -count=1 -timeout 15m -v ./test/mesh/

bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(PKGS)

# fuzz runs every native fuzz target for FUZZTIME each (hack/fuzz.sh: a crasher fails it; Go 1.26's bare
# "context deadline exceeded" at the deadline, go.dev/issue/75804, is reported and passed over).
FUZZTIME ?= 20s
fuzz: deps
	@bash hack/fuzz.sh $(GO) $(FUZZTIME) $(PKGS)

# image-rootfs assembles the runtime image's filesystem from the Dockerfile's Debian packages (no container daemon
# needed) and runs the binary in it as the image's non-root user (hack/image-rootfs.sh; needs root for chroot).
image-rootfs: build
	bash hack/image-rootfs.sh $(BIN) bin/rootfs

clean:
	rm -rf bin
