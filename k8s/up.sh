#!/usr/bin/env bash
# `make k8s-up`: a local control plane for tests on 127.0.0.1 only: etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler built by k8s/build.sh, and one Node whose kubelet the pod runner plays (tests/k8s/podrunner.py).
# Generates a CA, the serving pairs, client pairs (admin in system:masters, each component, the Node's
# system:node:<name>, the API server's kubelet client) and the ServiceAccount signing key with openssl; starts etcd,
# then kube-apiserver with RBAC and the Node authorizer, the default admission chain plus NodeRestriction,
# ServiceAccount token issuance and an audit log (logs/audit.log: who did what, read by the least-privilege test);
# waits until /readyz answers; then starts kube-controller-manager with the controllers tests need (garbage
# collection, namespace deletion, ServiceAccounts, aggregated ClusterRoles, quota, jobs, node lifecycle) and the
# scheduler, and the pod runner, which registers the Node; each is waited on (/healthz).
# Writes $state/admin.kubeconfig. `make k8s-down` (k8s/down.sh) stops them.
# Nothing listens on or dials an address other than 127.0.0.1: etcd's client and peer URLs are loopback, the API
# server binds and advertises 127.0.0.1, and with no endpoint reconciler it never publishes an address for the
# `kubernetes` Service (its cluster IP is allocated, never connected to).
# Settings: ATTUNE_K8S_STATE (state folder, default runs/k8s), ATTUNE_K8S_API_PORT (default 26443), ATTUNE_K8S_KCM_PORT,
# ATTUNE_K8S_SCHED_PORT, ATTUNE_K8S_KUBELET_PORT, ATTUNE_K8S_ETCD_PORT (and the next port for etcd's peer URL),
# ATTUNE_K8S_NODE (runner, or none for no Node), ATTUNE_K8S_NODE_NAME, ATTUNE_K8S_PYTHON (the pod runner's Python;
# default .venv/bin/python); $state/images.json maps image names to local folders for the pod runner;
# ATTUNE_K8S_READY_TIMEOUT (seconds, default 180), ATTUNE_K8S_CACHE as for k8s/build.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=k8s/env.sh
. "$here/env.sh"

if [ -n "$(running_pids)" ]; then
  echo "k8s-up: already running (pids $(running_pids)); run 'make k8s-down' first" >&2
  exit 1
fi
bash "$here/build.sh" etcd kube-apiserver kube-controller-manager kube-scheduler

for port in "$api_port" "$kcm_port" "$sched_port" "$kubelet_port" "$etcd_port" "$etcd_peer_port"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "k8s-up: 127.0.0.1:$port is already in use; free it or choose other ports" \
      "(ATTUNE_K8S_API_PORT, ATTUNE_K8S_KCM_PORT, ATTUNE_K8S_SCHED_PORT, ATTUNE_K8S_KUBELET_PORT, ATTUNE_K8S_ETCD_PORT)" >&2
    exit 1
  fi
done

if [ -e "$state" ] && [ ! -d "$state/pki" ] && [ -n "$(ls -A "$state")" ]; then
  echo "k8s-up: $state is not empty and holds no earlier control plane; choose an empty folder (ATTUNE_K8S_STATE)" >&2
  exit 2
fi
rm -rf "$state"; mkdir -p "$pki" "$state/etcd" "$state/pids" "$state/logs"
# --- certificates (EC P-256; the CA signs the serving pair and the client pairs) ---------------------------------
ossl() { openssl "$@" 2>>"$state/logs/openssl.log"; }
key() { # name -> $pki/<name>.key, PKCS#8 (what every component reads)
  ossl ecparam -name prime256v1 -genkey -noout -out "$pki/$1.key.ec"
  ossl pkcs8 -topk8 -nocrypt -in "$pki/$1.key.ec" -out "$pki/$1.key" && rm "$pki/$1.key.ec"
}
key ca
ossl req -x509 -new -key "$pki/ca.key" -sha256 -days 365 -subj "/CN=attune-k8s-ca" -out "$pki/ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
issue() { # name subject extendedKeyUsage [subjectAltName]
  key "$1"
  ossl req -new -key "$pki/$1.key" -subj "$2" -out "$pki/$1.csr"
  { echo "basicConstraints=critical,CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$3"; [ -z "${4:-}" ] || echo "subjectAltName=$4"; } > "$pki/$1.ext"
  ossl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -sha256 -days 365 \
    -extfile "$pki/$1.ext" -out "$pki/$1.crt"
  rm "$pki/$1.csr" "$pki/$1.ext"
}
apiserver_names="IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
issue apiserver "/CN=kube-apiserver" serverAuth "$apiserver_names,DNS:kubernetes.default.svc.cluster.local"
issue kube-controller-manager-serving "/CN=kube-controller-manager" serverAuth "IP:127.0.0.1,DNS:localhost"
issue admin "/O=system:masters/CN=attune-admin" clientAuth
issue kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
issue kube-scheduler "/CN=system:kube-scheduler" clientAuth
issue kube-scheduler-serving "/CN=kube-scheduler" serverAuth "IP:127.0.0.1,DNS:localhost"
# the Node: its kubelet's client identity (the Node authorizer's system:node:<name>), its serving pair (the API server
# verifies it when it proxies pods/log), and the API server's client pair for the kubelet
issue node "/O=system:nodes/CN=system:node:$node_name" clientAuth
issue kubelet-serving "/CN=$node_name" serverAuth "IP:127.0.0.1"
issue apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client" clientAuth
key service-account && ossl ec -in "$pki/service-account.key" -pubout -out "$pki/service-account.pub"
chmod 600 "$pki"/*.key

kubeconfig() { # user -> $state/<user>.kubeconfig
  cat > "$state/$1.kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: attune
  cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$pki/$1.crt", client-key: "$pki/$1.key"}
contexts:
- name: attune
  context: {cluster: attune, user: $1}
current-context: attune
KUBECONFIG
}
for user in admin kube-controller-manager kube-scheduler node; do kubeconfig "$user"; done
# the audit log: every request's user, verb and resource (metadata only), read by the least-privilege check
cat > "$state/audit-policy.yaml" <<POLICY
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
POLICY

start() { # name command...: runs in the background, its own process group, output to logs/<name>.log
  local name=$1; shift
  setsid "$@" > "$state/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$state/pids/$name.pid"
}
fail() { # name message: says why, shows the component's log, stops what started
  echo "k8s-up: $2 (log: $state/logs/$1.log):" >&2
  tail -n 25 "$state/logs/$1.log" >&2
  bash "$here/down.sh" >&2 || true
  exit 1
}
wait_for() { # name url curl-args...: until the URL answers 200 while the process lives, at most $ready_timeout s
  local name=$1 url=$2; shift 2
  local deadline=$((SECONDS + ready_timeout))
  until curl -fsS -o /dev/null --max-time 5 "$@" "$url" 2>/dev/null; do
    kill -0 "$(cat "$state/pids/$name.pid")" 2>/dev/null || fail "$name" "$name exited before $url answered"
    [ $SECONDS -lt $deadline ] || fail "$name" "$url did not answer in ${ready_timeout} s (ATTUNE_K8S_READY_TIMEOUT)"
    sleep 0.5
  done
}

start etcd "$bin/etcd" --name attune --data-dir "$state/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "attune=http://127.0.0.1:$etcd_peer_port" --unsafe-no-fsync --log-level warn
wait_for etcd "http://127.0.0.1:$etcd_port/health"

start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" --endpoint-reconciler-type none \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --cert-dir "$state/apiserver-certs" \
  --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC --allow-privileged=true \
  --enable-admission-plugins NodeRestriction,OwnerReferencesPermissionEnforcement \
  --service-account-issuer "https://127.0.0.1:$api_port" --service-account-key-file "$pki/service-account.pub" \
  --service-account-signing-key-file "$pki/service-account.key" \
  --service-cluster-ip-range 10.96.0.0/24 --profiling=false \
  --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$pki/apiserver-kubelet-client.key" --kubelet-certificate-authority "$pki/ca.crt" \
  --kubelet-preferred-address-types InternalIP \
  --audit-policy-file "$state/audit-policy.yaml" --audit-log-path "$state/logs/audit.log" --audit-log-format json \
  --audit-log-mode blocking
wait_for kube-apiserver "https://127.0.0.1:$api_port/readyz" \
  --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key"
# the controllers tests need, each with its own ServiceAccount's credentials (as kubeadm runs it); no cloud, node or
# volume controllers: there is no kubelet and no cloud here
controllers=garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller
controllers+=,clusterrole-aggregation-controller,root-ca-certificate-publisher-controller,resourcequota-controller
controllers+=,job-controller,ttl-after-finished-controller,pod-garbage-collector-controller,replicaset-controller
controllers+=,deployment-controller,endpointslice-controller,node-lifecycle-controller
kcm_kubeconfig=$state/kube-controller-manager.kubeconfig
start kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$kcm_kubeconfig" \
  --authentication-kubeconfig "$kcm_kubeconfig" --authorization-kubeconfig "$kcm_kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" \
  --tls-cert-file "$pki/kube-controller-manager-serving.crt" \
  --tls-private-key-file "$pki/kube-controller-manager-serving.key" \
  --leader-elect=false --use-service-account-credentials=true --controllers "$controllers" \
  --service-account-private-key-file "$pki/service-account.key" --root-ca-file "$pki/ca.crt" --profiling=false
sched_kubeconfig=$state/kube-scheduler.kubeconfig
start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$sched_kubeconfig" \
  --authentication-kubeconfig "$sched_kubeconfig" --authorization-kubeconfig "$sched_kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$sched_port" \
  --tls-cert-file "$pki/kube-scheduler-serving.crt" --tls-private-key-file "$pki/kube-scheduler-serving.key" \
  --leader-elect=false --profiling=false
wait_for kube-controller-manager "https://127.0.0.1:$kcm_port/healthz" --cacert "$pki/ca.crt"
wait_for kube-scheduler "https://127.0.0.1:$sched_port/healthz" --cacert "$pki/ca.crt"
# the Node: tests/k8s/podrunner.py plays its kubelet (registers the Node at 127.0.0.1, runs bound pods' commands as
# local processes, serves their logs to the API server; its /healthz answers once the Node is registered and Ready);
# ATTUNE_K8S_NODE=none starts none
if [ "$node_mode" = runner ]; then
  [ -e "$state/images.json" ] || echo '{}' > "$state/images.json"
  PYTHONPATH=$root ATTUNE_K8S_VERSION=$k8s_version start pod-runner "$python" -m tests.k8s.podrunner --kubeconfig "$state/node.kubeconfig" --node "$node_name" \
    --port "$kubelet_port" --cert "$pki/kubelet-serving.crt" --key "$pki/kubelet-serving.key" \
    --client-ca "$pki/ca.crt" --work "$state/pods" --images "$state/images.json"
  wait_for pod-runner "https://127.0.0.1:$kubelet_port/healthz" --cacert "$pki/ca.crt" \
    --cert "$pki/apiserver-kubelet-client.crt" --key "$pki/apiserver-kubelet-client.key"
fi
echo "k8s-up: ready at https://127.0.0.1:$api_port (KUBECONFIG=$state/admin.kubeconfig)"
