#!/usr/bin/env bash
# kube-bins.sh builds the real kube-apiserver and etcd that the Kubernetes integration tests run against,
# from the Go module proxy, and caches them under $KVMESH_KUBE_CACHE (default $HOME/.cache/kvmesh/kube),
# keyed by version. Prints the directory holding both binaries. Idempotent: a cached build is reused.
#   cold: ~6 min for kube-apiserver and ~90 s for etcd on 2 cores.
# With KVMESH_KUBECTL=1 it builds kubectl of the same version there too (make deps does, where no kubectl
# new enough to render the manifests' kustomizations is installed: Debian's newest is 1.20).
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
cache=${KVMESH_KUBE_CACHE:-$HOME/.cache/kvmesh/kube}
out="$cache/k8s-$KUBE_VERSION-etcd-$ETCD_VERSION"
mkdir -p "$out"
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
# Every scratch module directory made here is removed at exit, however the script ends.
scratch=()
trap 'rm -rf "${scratch[@]}"' EXIT

# kubebuild CMD builds k8s.io/kubernetes/cmd/CMD at KUBE_VERSION into $out/CMD, in a scratch module that
# replaces every staging module with its published version.
kubebuild() {
  local cmd=$1 src
  src=$(mktemp -d)
  scratch+=("$src")
  (
    cd "$src"
    go mod init kvmesh.local/kubebins >/dev/null 2>&1
    go mod edit -require "k8s.io/kubernetes@v$KUBE_VERSION"
    go mod download "k8s.io/kubernetes@v$KUBE_VERSION"
    modfile=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$KUBE_VERSION.mod
    minor=${KUBE_VERSION#1.}
    for m in $(grep -E '=> \./staging' "$modfile" | awk '{print $1}'); do
      go mod edit -replace "$m=$m@v0.$minor"
    done
    cat > tools.go <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/CMD"
GO
    sed -i "s#cmd/CMD#cmd/$cmd#" tools.go
    go mod tidy -e >/dev/null 2>&1 || true
    # The version a release build stamps (kubectl version reads it; unstamped it says v0.0.0-master and fails).
    ld=""
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
      ld="$ld -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    go build -trimpath -ldflags "$ld" -o "$out/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
    mv "$out/$cmd.tmp" "$out/$cmd"
  ) >&2
}

if [ ! -x "$out/kube-apiserver" ]; then
  kubebuild kube-apiserver
fi
if [ "${KVMESH_KUBECTL:-}" = 1 ] && [ ! -x "$out/kubectl" ]; then
  kubebuild kubectl
fi

if [ ! -x "$out/etcd" ]; then
  src=$(mktemp -d)
  scratch+=("$src")
  (
    cd "$src"
    go mod init kvmesh.local/etcdbin >/dev/null 2>&1
    cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
    go mod edit -require "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go mod tidy -e >/dev/null 2>&1 || true
    go build -trimpath -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
    mv "$out/etcd.tmp" "$out/etcd"
  ) >&2
fi
echo "$out"
