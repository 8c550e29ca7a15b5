#!/usr/bin/env bash
# `make k8s-down`: stops what k8s/up.sh started (the API server first, then etcd), SIGTERM then SIGKILL after 20 s,
# and fails if any of them still runs. Only the recorded pids whose executable is one of our binaries are signalled.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=k8s/env.sh
. "$here/env.sh"
stop() { # name
  local f=$state/pids/$1.pid pid
  [ -e "$f" ] || return 0
  pid=$(cat "$f")
  ours "$pid" || { rm -f "$f"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "k8s-down: $1 ($pid) ignored SIGTERM for 20 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true; sleep 0.5
  fi
  rm -f "$f"
}
for name in pod-runner kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$name"; done
left=$(running_pids)
[ -z "$left" ] || { echo "k8s-down: still running: $left" >&2; exit 1; }
echo "k8s-down: stopped"
