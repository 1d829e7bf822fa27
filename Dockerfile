# syntax=docker/dockerfile:1
# kvmesh image: one binary (ingress, sidecar, orchestrator, epp, sim, ...) on a minimal Debian runtime.
# The runtime stage holds libzmq (the only cgo dependency, via github.com/pebbe/zmq4) and CA certificates,
# runs as a non-root user and has `kvmesh` as its entrypoint:  docker run IMAGE ingress --help
#
# Where no container daemon runs (CI here), `make image-rootfs` assembles the same runtime filesystem from
# the same Debian packages (hack/image-rootfs.sh) and runs the binary in it as the same non-root user.

ARG GO_VERSION=1.26
ARG DEBIAN_RELEASE=bookworm

FROM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
RUN apt-get update && apt-get install -y --no-install-recommends libzmq3-dev pkg-config && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X github.com/kvmesh/kvmesh/ingress.Version=${VERSION}" -o /out/kvmesh ./cmd/kvmesh

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
# The runtime package set is written once, in hack/image-packages.txt, and shared with hack/image-rootfs.sh.
COPY hack/image-packages.txt /tmp/image-packages.txt
RUN apt-get update \
 && apt-get install -y --no-install-recommends $(grep -v '^#' /tmp/image-packages.txt) \
 && rm -rf /var/lib/apt/lists/* /tmp/image-packages.txt \
 && echo 'kvmesh:x:65532:65532:kvmesh:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'kvmesh:x:65532:' >> /etc/group
COPY --from=build /out/kvmesh /usr/local/bin/kvmesh
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kvmesh"]
CMD ["--help"]
