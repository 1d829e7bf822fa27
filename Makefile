# kvmesh — build, test, benchmark and demo.
# `make demo` and `make test` are the two commands a newcomer needs.

GO        ?= go
PKGS      ?= ./...
BENCHTIME ?= 1s
BIN       := bin/kvmesh

.PHONY: all build demo test deps fmt-check vet unit bench fuzz chaos clean kube-bins

all: build

# deps installs what cgo needs (libzmq for github.com/pebbe/zmq4) when it is missing.
deps:
	@if ! pkg-config --exists libzmq 2>/dev/null; then \
		echo "installing libzmq3-dev and pkg-config (apt-get)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libzmq3-dev pkg-config >/dev/null; \
	fi

build: deps
	$(GO) build -o $(BIN) ./cmd/kvmesh

demo: build
	./$(BIN) demo

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet: deps
	$(GO) vet $(PKGS)

unit: deps
	$(GO) test -race -count=1 -timeout 15m $(PKGS)

# kube-bins builds (once; cached in $$HOME/.cache/kvmesh/kube) the real kube-apiserver and etcd that the
# Kubernetes integration tests (internal/kubetest) run against. Cold: 6-8 min on 2 cores, so a cold
# `make test` takes ~15-20 min; warm it adds nothing.
kube-bins:
	@bash hack/kube-bins.sh

test: deps kube-bins fmt-check vet unit

# chaos runs the whole mesh as processes on loopback under load and kills each
# part in turn (SIGKILL), partitions NATS from one ingress and drops ZMQ
# batches; it prints the report kept in docs/RELIABILITY.md. Not part of test.
CHAOS_SOAK ?= 60s
chaos: deps
	mkdir -p bin && CHAOS_SOAK=$(CHAOS_SOAK) CHAOS_REPORT=$${CHAOS_REPORT:-$(CURDIR)/bin/chaos-report.md} $(GO) test -tags chaos -run '^TestChaos$$' -count=1 -timeout 15m -v ./test/mesh/

bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(PKGS)

# fuzz runs every native fuzz target for FUZZTIME each.
FUZZTIME ?= 20s
fuzz: deps
	@for pkg in $$($(GO) list $(PKGS)); do \
		for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

clean:
	rm -rf bin
