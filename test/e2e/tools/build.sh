#!/usr/bin/env bash
# Builds the e2e tools from the Go module proxy and caches them by version
# outside the repository: kube-apiserver and kube-controller-manager
# (k8s.io/kubernetes), etcd, the KEDA operator and its metrics adapter (with
# KEDA's CRDs) and helm; for the real-node e2e (`node`), kube-scheduler,
# kubelet and kube-proxy from the same k8s.io/kubernetes, and CoreDNS.
# Prints the cache directory's bin path. A cached tool is not rebuilt.
#
#   PULSE_TOOLS_CACHE   cache root (default ~/.cache/pulse-e2e-tools)
set -euo pipefail

KUBE_VERSION=1.33.13
STAGING_VERSION=0.33.13
ETCD_VERSION=3.5.21
KEDA_VERSION=2.21.0
HELM_VERSION=3.22.0
COREDNS_VERSION=1.14.7

cache="${PULSE_TOOLS_CACHE:-$HOME/.cache/pulse-e2e-tools}"
bin="$cache/bin"
mkdir -p "$bin"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export GOTOOLCHAIN=local

log() { echo "e2e-tools: $*" >&2; }

# scratch MODULE: a throwaway module directory.
scratch() {
  local d
  d=$(mktemp -d)
  (cd "$d" && go mod init "$1" >/dev/null 2>&1)
  echo "$d"
}

# build_kube [node]: kube-apiserver and kube-controller-manager; with node,
# kube-scheduler, kubelet and kube-proxy.
build_kube() {
  local stamp="$bin/.kube-$KUBE_VERSION" cmds=(kube-apiserver kube-controller-manager)
  if [ "${1:-}" = node ]; then
    stamp="$bin/.kube-node-$KUBE_VERSION" cmds=(kube-scheduler kubelet kube-proxy)
  fi
  local missing=0
  for c in "${cmds[@]}"; do [ -x "$bin/$c" ] || missing=1; done
  [ -f "$stamp" ] && [ "$missing" = 0 ] && return
  log "building ${cmds[*]} v$KUBE_VERSION (several minutes)"
  local d
  d=$(scratch pulse.local/e2e/kube)
  cd "$d"
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces
  # them with local paths, which a dependent module cannot see: pin them.
  local staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
    cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api cri-client
    csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
    kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils
    pod-security-admission sample-apiserver)
  local args=()
  for m in "${staging[@]}"; do args+=("-replace=k8s.io/$m=k8s.io/$m@v$STAGING_VERSION"); done
  go mod edit "${args[@]}"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for c in "${cmds[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
    printf ')\n'
  } > tools.go
  go get "k8s.io/kubernetes@v$KUBE_VERSION" >/dev/null 2>&1 || go get "k8s.io/kubernetes@v$KUBE_VERSION"
  go mod tidy -e >/dev/null 2>&1 || go mod tidy -e || true # quiet, but for its errors
  local v="k8s.io/component-base/version"
  local ld="-s -w -X $v.gitVersion=v$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=33 -X $v.gitTreeState=clean"
  for c in "${cmds[@]}"; do
    go build -trimpath -ldflags "$ld" -o "$bin/$c" "k8s.io/kubernetes/cmd/$c"
  done
  cd - >/dev/null
  rm -rf "$d"
  touch "$stamp"
}

build_etcd() {
  local stamp="$bin/.etcd-$ETCD_VERSION"
  [ -f "$stamp" ] && [ -x "$bin/etcd" ] && return
  log "building etcd v$ETCD_VERSION"
  local d
  d=$(scratch pulse.local/e2e/etcd)
  cd "$d"
  cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >/dev/null 2>&1 || go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  go mod tidy >/dev/null 2>&1 || go mod tidy # quiet, but for its errors
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd" .
  cd - >/dev/null
  rm -rf "$d"
  touch "$stamp"
}

build_keda() {
  local stamp="$bin/.keda-$KEDA_VERSION"
  [ -f "$stamp" ] && [ -x "$bin/keda-operator" ] && [ -x "$bin/keda-adapter" ] && [ -d "$cache/keda-crds" ] && return
  log "building the KEDA operator and metrics adapter v$KEDA_VERSION (several minutes)"
  local d
  d=$(scratch pulse.local/e2e/keda)
  cd "$d"
  # KEDA's own go.mod has one replace and one exclude a dependent must repeat.
  go mod edit \
    -replace=github.com/nexus-rpc/nexus-proto-annotations@v0.1.0=github.com/nexus-rpc/nexus-proto-annotations@v0.1.1-0.20260629224316-835bd8d49cb4 \
    -exclude=github.com/go-chi/chi/v5@v5.2.3
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
GO
  go get "github.com/kedacore/keda/v2@v$KEDA_VERSION" >/dev/null 2>&1 || go get "github.com/kedacore/keda/v2@v$KEDA_VERSION"
  go mod tidy -e >/dev/null 2>&1 || go mod tidy -e || true # quiet, but for its errors
  go build -trimpath -ldflags "-s -w -X github.com/kedacore/keda/v2/version.Version=$KEDA_VERSION" \
    -o "$bin/keda-operator" github.com/kedacore/keda/v2/cmd/operator
  go build -trimpath -ldflags "-s -w -X github.com/kedacore/keda/v2/version.Version=$KEDA_VERSION" \
    -o "$bin/keda-adapter" github.com/kedacore/keda/v2/cmd/adapter
  local src
  src=$(go list -m -f '{{.Dir}}' "github.com/kedacore/keda/v2")
  rm -rf "$cache/keda-crds"
  mkdir -p "$cache/keda-crds"
  cp "$src"/config/crd/bases/*.yaml "$cache/keda-crds/"
  chmod -R u+w "$cache/keda-crds"
  cd - >/dev/null
  rm -rf "$d"
  touch "$stamp"
}

build_helm() {
  local stamp="$bin/.helm-$HELM_VERSION"
  [ -f "$stamp" ] && [ -x "$bin/helm" ] && return
  log "building helm v$HELM_VERSION from the module proxy, for the chart checks (first use only: about 10 minutes on 2 cores; cached in $cache)"
  local d
  d=$(scratch pulse.local/e2e/helm)
  cd "$d"
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
GO
  go get "helm.sh/helm/v3@v$HELM_VERSION" >/dev/null 2>&1 || go get "helm.sh/helm/v3@v$HELM_VERSION"
  go mod tidy -e >/dev/null 2>&1 || go mod tidy -e || true # quiet, but for its errors
  local v="helm.sh/helm/v3/internal/version"
  go build -trimpath -ldflags "-s -w -X $v.version=v$HELM_VERSION -X $v.gitTreeState=clean" -o "$bin/helm" helm.sh/helm/v3/cmd/helm
  cd - >/dev/null
  rm -rf "$d"
  touch "$stamp"
}

# CoreDNS with only the plugins the node e2e uses (no forward: the test's
# pods resolve cluster names only), built from external source as CoreDNS's
# README describes: its directives set in main's init.
build_coredns() {
  local stamp="$bin/.coredns-$COREDNS_VERSION"
  [ -f "$stamp" ] && [ -x "$bin/coredns" ] && return
  log "building coredns v$COREDNS_VERSION"
  local d
  d=$(scratch pulse.local/e2e/coredns)
  cd "$d"
  cat > main.go <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "errors", "log", "health", "ready", "kubernetes"}
}

func main() { coremain.Run() }
GO
  go get "github.com/coredns/coredns@v$COREDNS_VERSION" >/dev/null 2>&1 || go get "github.com/coredns/coredns@v$COREDNS_VERSION"
  go mod tidy -e >/dev/null 2>&1 || go mod tidy -e || true # quiet, but for its errors
  go build -trimpath -ldflags "-s -w" -o "$bin/coredns" .
  cd - >/dev/null
  rm -rf "$d"
  touch "$stamp"
}

what="${1:-all}"
case "$what" in
  all) build_helm; build_etcd; build_keda; build_kube ;;
  node) build_helm; build_etcd; build_keda; build_kube; build_kube node; build_coredns ;;
  helm) build_helm ;;
  etcd) build_etcd ;;
  keda) build_keda ;;
  kube) build_kube ;;
  coredns) build_coredns ;;
  *) echo "usage: $0 [all|node|helm|etcd|keda|kube|coredns]" >&2; exit 2 ;;
esac
echo "$bin"
