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
sched_port=${ATTUNE_K8S_SCHED_PORT:-26445}
kubelet_port=${ATTUNE_K8S_KUBELET_PORT:-26450}
node_name=${ATTUNE_K8S_NODE_NAME:-attune-node}
node_mode=${ATTUNE_K8S_NODE:-runner}
python=${ATTUNE_K8S_PYTHON:-$root/.venv/bin/python}
etcd_port=${ATTUNE_K8S_ETCD_PORT:-22379}
etcd_peer_port=$((etcd_port + 1))
ready_timeout=${ATTUNE_K8S_READY_TIMEOUT:-180}
case $node_mode in runner|none) ;; *)
  echo "k8s: ATTUNE_K8S_NODE='$node_mode' is neither 'runner' (the pod runner plays the Node) nor 'none'" >&2; exit 2 ;;
esac
if ! [[ $node_name =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]]; then
  echo "k8s: ATTUNE_K8S_NODE_NAME='$node_name' is not a DNS label (lower-case letters, digits, '-')" >&2; exit 2
fi
for setting in api_port kcm_port sched_port kubelet_port etcd_port ready_timeout; do
  if ! [[ ${!setting} =~ ^[1-9][0-9]*$ ]]; then
    echo "k8s: ATTUNE_K8S_${setting^^}='${!setting}' is not a positive whole number (a port, or seconds);" \
      "unset it for the default" >&2
    exit 2
  fi
done

ours() { # pid: whether it still runs one of our binaries, or the pod runner of this state folder
  local pid=$1
  case $(readlink "/proc/$pid/exe" 2>/dev/null) in "$bin"/*) return 0 ;; esac
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "tests.k8s.podrunner --kubeconfig $state/"
}
running_pids() { # the pids recorded in $state/pids that are still ours
  local f pid
  for f in "$state"/pids/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    if ours "$pid"; then printf '%s ' "$pid"; fi
  done
}
