# Shared by k8s/build.sh, k8s/up.sh and k8s/down.sh (sourced, with $here = k8s/): the pinned Kubernetes release, where
# the binaries and the control plane's state are, and its ports.
root=$(cd "$here/.." && pwd)
k8s_version=$(awk '$1 == "require" { $1 = ""; $0 = $0 } $1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' \
  "$here/modules/kubernetes/go.mod")
if ! [[ $k8s_version =~ ^v1\.([0-9]+)\.[0-9]+$ ]]; then
  echo "k8s: no k8s.io/kubernetes release in k8s/modules/kubernetes/go.mod" >&2
  exit 2
fi
k8s_minor=${BASH_REMATCH[1]}
cache=${ATTUNE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/attune/k8s}
bin=$cache/$k8s_version/bin
state=${ATTUNE_K8S_STATE:-$root/runs/k8s}
pki=$state/pki
api_port=${ATTUNE_K8S_API_PORT:-26443}
kcm_port=${ATTUNE_K8S_KCM_PORT:-26444}
etcd_port=${ATTUNE_K8S_ETCD_PORT:-22379}
etcd_peer_port=$((etcd_port + 1))
ready_timeout=${ATTUNE_K8S_READY_TIMEOUT:-180}
for setting in api_port kcm_port etcd_port ready_timeout; do
  if ! [[ ${!setting} =~ ^[1-9][0-9]*$ ]]; then
    echo "k8s: ATTUNE_K8S_${setting^^}='${!setting}' is not a positive whole number (a port, or seconds);" \
      "unset it for the default" >&2
    exit 2
  fi
done

running_pids() { # the pids recorded in $state/pids that still run one of our binaries
  local f pid
  for f in "$state"/pids/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    case $(readlink "/proc/$pid/exe" 2>/dev/null) in "$bin"/*) printf '%s ' "$pid" ;; esac
  done
}
