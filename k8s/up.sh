#!/usr/bin/env bash
# `make k8s-up`: a local control plane for tests, etcd, kube-apiserver and kube-controller-manager built by
# k8s/build.sh, on 127.0.0.1 only.
# Generates a CA, the API server's serving pair, an admin client pair (system:masters) and the ServiceAccount signing
# key with openssl; starts etcd, then kube-apiserver with RBAC, the default admission chain and ServiceAccount token
# issuance; waits until /readyz answers; then starts kube-controller-manager with the controllers tests need (garbage
# collection, namespace deletion, ServiceAccounts, aggregated ClusterRoles, quota, jobs) and waits on its /healthz;
# writes $state/admin.kubeconfig. `make k8s-down` (k8s/down.sh) stops them.
# Nothing listens on or dials an address other than 127.0.0.1: etcd's client and peer URLs are loopback, the API
# server binds and advertises 127.0.0.1, and with no endpoint reconciler it never publishes an address for the
# `kubernetes` Service (its cluster IP is allocated, never connected to).
# Settings: ATTUNE_K8S_STATE (state folder, default runs/k8s), ATTUNE_K8S_API_PORT (default 26443), ATTUNE_K8S_KCM_PORT,
# ATTUNE_K8S_ETCD_PORT (and the next port for etcd's peer URL),
# ATTUNE_K8S_READY_TIMEOUT (seconds, default 180), ATTUNE_K8S_CACHE as for k8s/build.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=k8s/env.sh
. "$here/env.sh"

if [ -n "$(running_pids)" ]; then
  echo "k8s-up: already running (pids $(running_pids)); run 'make k8s-down' first" >&2
  exit 1
fi
bash "$here/build.sh" etcd kube-apiserver kube-controller-manager

for port in "$api_port" "$kcm_port" "$etcd_port" "$etcd_peer_port"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "k8s-up: 127.0.0.1:$port is already in use; free it or choose other ports" \
      "(ATTUNE_K8S_API_PORT, ATTUNE_K8S_KCM_PORT, ATTUNE_K8S_ETCD_PORT)" >&2
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
for user in admin kube-controller-manager kube-scheduler; do kubeconfig "$user"; done

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
  --service-account-issuer "https://127.0.0.1:$api_port" --service-account-key-file "$pki/service-account.pub" \
  --service-account-signing-key-file "$pki/service-account.key" \
  --service-cluster-ip-range 10.96.0.0/24 --profiling=false
wait_for kube-apiserver "https://127.0.0.1:$api_port/readyz" \
  --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key"
# the controllers tests need, each with its own ServiceAccount's credentials (as kubeadm runs it); no cloud, node or
# volume controllers: there is no kubelet and no cloud here
controllers=garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller
controllers+=,clusterrole-aggregation-controller,root-ca-certificate-publisher-controller,resourcequota-controller
controllers+=,job-controller,ttl-after-finished-controller,pod-garbage-collector-controller,replicaset-controller
controllers+=,deployment-controller,endpointslice-controller
kcm_kubeconfig=$state/kube-controller-manager.kubeconfig
start kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$kcm_kubeconfig" \
  --authentication-kubeconfig "$kcm_kubeconfig" --authorization-kubeconfig "$kcm_kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" \
  --tls-cert-file "$pki/kube-controller-manager-serving.crt" \
  --tls-private-key-file "$pki/kube-controller-manager-serving.key" \
  --leader-elect=false --use-service-account-credentials=true --controllers "$controllers" \
  --service-account-private-key-file "$pki/service-account.key" --root-ca-file "$pki/ca.crt" --profiling=false
wait_for kube-controller-manager "https://127.0.0.1:$kcm_port/healthz" --cacert "$pki/ca.crt"
echo "k8s-up: ready at https://127.0.0.1:$api_port (KUBECONFIG=$state/admin.kubeconfig)"
