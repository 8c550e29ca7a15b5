#!/usr/bin/env bash
# Builds the real control plane's components from the pinned wrapper modules in k8s/modules/ into a cache outside the
# checkout, ~/.cache/attune/k8s/<kubernetes version>/bin, and reuses a binary there while its module files, Go version
# and flags are unchanged. Components are built one after another (two cores, 24 GiB: a link of kube-apiserver takes a
# few GiB); one that fails is reported with its error and the next one is still built; the exit status is 1 if any
# failed. Usage: k8s/build.sh [component ...]   (default: all, in the order below)
# Settings: ATTUNE_K8S_CACHE (the cache folder), ATTUNE_K8S_GOMODCACHE and ATTUNE_K8S_GOCACHE (Go's module and build
# caches, by default inside it), ATTUNE_K8S_BUILD_JOBS (go build -p, default 2).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# component -> wrapper module folder and main package; order = build order (etcd first: k8s-up needs it first)
declare -A module=(
  [etcd]=etcd [kube-apiserver]=kubernetes [kube-controller-manager]=kubernetes [kube-scheduler]=kubernetes [kubectl]=kubernetes
  [training-operator]=training-operator [kueue]=kueue [jobset]=jobset [trainer]=trainer
)
declare -A package=(
  [etcd]=go.etcd.io/etcd/server/v3
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
  [training-operator]=attune.local/k8s/modules/training-operator/cmd/attune-training-operator  # ours: see its main.go
  [kueue]=sigs.k8s.io/kueue/cmd/kueue
  [jobset]=sigs.k8s.io/jobset
  [trainer]=github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager
)
all=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl training-operator kueue jobset trainer)

# shellcheck source=k8s/env.sh
. "$here/env.sh"  # k8s_version, k8s_minor, cache, bin
logs=$cache/$k8s_version/logs
jobs=${ATTUNE_K8S_BUILD_JOBS:-2}
if ! [[ $jobs =~ ^[1-9][0-9]*$ ]]; then
  echo "k8s-build: ATTUNE_K8S_BUILD_JOBS='$jobs' is not a number of parallel compiles; unset it or set e.g. 2" >&2
  exit 2
fi

# GOTOOLCHAIN=local: never fetch another Go toolchain. -mod=readonly with the committed go.sum files: every module is
# checked against the sums in the repository and nothing rewrites them (the checksum database is only consulted when
# go.sum is regenerated with `go mod tidy`). CGO_ENABLED=0 as Kubernetes' and etcd's own release builds: static, no gcc.
# Our own module and build caches under the cache folder, so that the whole build state is in one place.
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
export GOMODCACHE=${ATTUNE_K8S_GOMODCACHE:-$cache/gomod} GOCACHE=${ATTUNE_K8S_GOCACHE:-$cache/go-build}
if ! command -v go >/dev/null; then
  echo "k8s-build: no 'go' on PATH: install Go 1.26 (the wrapper modules need go >= 1.26.0)" >&2
  exit 2
fi

# the version the API server reports (kubectl and helm read it); otherwise it says v0.0.0-master
version_ldflags=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  version_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  version_ldflags+=" -X $pkg.gitTreeState=clean"
done

ldflags_for() { # the -ldflags of one component
  case ${module[$1]} in kubernetes) echo "-s -w$version_ldflags" ;; *) echo "-s -w" ;; esac
}
stamp_for() { # what the binary was built from: reused only while this is unchanged (the module files and our own Go
  # sources in the wrapper module, each with its path)
  local dir=$here/modules/${module[$1]}
  { go version; echo "${package[$1]} $(ldflags_for "$1") -trimpath CGO_ENABLED=0"; cat "$dir/go.mod" "$dir/go.sum"
    (cd "$dir" && find . -name '*.go' -type f | LC_ALL=C sort | xargs -r sha256sum); } | sha256sum | cut -d' ' -f1
}

cpu_now() { # sets $cpu_used: CPU seconds of the commands this script has waited for (unlike the wall time, the same
  # on a busy machine); `times` runs in this shell, as in a pipeline or $(...) it would count only a subshell's children
  times > "$logs/.times"  # its last line: children's user and system time, as 1m2.345s 0m6.789s
  cpu_used=$(tail -n 1 "$logs/.times" | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2])
    t += a[1] * 60 + a[2] }; printf "%d", t }')
}

mkdir -p "$bin" "$logs"
# one build at a time into this cache (test workers starting control planes at once wait for the first)
exec 9>"$cache/.build.lock"
flock 9
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for name in "${targets[@]}"; do
  [ -n "${package[$name]:-}" ] || { echo "k8s-build: no component '$name'; the components are: ${all[*]}" >&2; exit 2; }
done

declare -A downloaded=()
failed=()
for name in "${targets[@]}"; do
  dir=$here/modules/${module[$name]}
  stamp=$(stamp_for "$name")
  if [ -x "$bin/$name" ] && [ "$(cat "$bin/.$name.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "k8s-build: $name: reused $bin/$name"
    continue
  fi
  log=$logs/$name.log
  : > "$log"
  if [ -z "${downloaded[${module[$name]}]:-}" ]; then
    start=$SECONDS
    if ! (cd "$dir" && go mod download -x) >>"$log" 2>&1; then
      echo "k8s-build: $name: FAILED to download the modules of k8s/modules/${module[$name]} (log: $log):" >&2
      grep -v '^# get ' "$log" | tail -n 20 >&2
      failed+=("$name"); continue
    fi
    downloaded[${module[$name]}]=1
    echo "k8s-build: $name: modules of k8s/modules/${module[$name]} present in $((SECONDS - start)) s"
  fi
  start=$SECONDS; cpu_now; cpu=$cpu_used
  echo "k8s-build: $name: building ${package[$name]} (go build -p $jobs; log: $log)"
  if (cd "$dir" && go build -p "$jobs" -trimpath -ldflags="$(ldflags_for "$name")" -o "$bin/.$name.tmp" \
      "${package[$name]}") >>"$log" 2>&1; then
    cpu_now; mv -f "$bin/.$name.tmp" "$bin/$name" && echo "$stamp" > "$bin/.$name.stamp"
    echo "k8s-build: $name: built in $((SECONDS - start)) s ($((cpu_used - cpu)) s of CPU)," \
      "$(du -m "$bin/$name" | cut -f1) MiB"
  else
    rm -f "$bin/.$name.tmp"
    echo "k8s-build: $name: FAILED after $((SECONDS - start)) s (log: $log):" >&2
    grep -v "^# get " "$log" | tail -n 20 >&2
    failed+=("$name")
  fi
done
# not built, only downloaded: the releases whose CRDs the tests install (modules/crds)
if [ $# -eq 0 ]; then
  if (cd "$here/modules/crds" && go mod download github.com/prometheus-operator/prometheus-operator \
      github.com/kubeflow/trainer/v2) >"$logs/crds.log" 2>&1
  then echo "k8s-build: crds: the Prometheus Operator's and Kubeflow Trainer's modules are in $GOMODCACHE"
  else echo "k8s-build: crds: FAILED to download (log: $logs/crds.log):" >&2; tail -n 20 "$logs/crds.log" >&2
    failed+=(crds)
  fi
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "k8s-build: failed: ${failed[*]}; the others are in $bin" >&2
  exit 1
fi
echo "k8s-build: all in $bin"
