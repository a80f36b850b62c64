#!/usr/bin/env bash
# A real Redis Cluster on loopback: three primaries, each with one replica.
#   bash .ci/redis-cluster.sh        start it (ports 7000-7005 unless RHEO_CLUSTER_PORT is set)
#   bash .ci/redis-cluster.sh stop   stop it and forget its state
# Nothing is kept on disk beyond the cluster's node files in /tmp/rheo-redis-cluster.
set -euo pipefail
DIR=/tmp/rheo-redis-cluster
BASE="${RHEO_CLUSTER_PORT:-7000}"
PORTS=()
for i in 0 1 2 3 4 5; do PORTS+=($((BASE + i))); done

if [[ "${1:-start}" == "stop" ]]; then
  for port in "${PORTS[@]}"; do redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$DIR"
  exit 0
fi

healthy() {
  redis-cli -p "$BASE" cluster info 2>/dev/null | grep -q "cluster_state:ok" &&
    [[ "$(redis-cli -p "$BASE" cluster nodes 2>/dev/null | grep -c slave)" -ge 3 ]]
}
if healthy; then
  echo "Redis Cluster already up on ${PORTS[0]}-${PORTS[5]}"
  exit 0
fi

for port in "${PORTS[@]}"; do redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; done
rm -rf "$DIR"
for port in "${PORTS[@]}"; do
  mkdir -p "$DIR/$port"
  redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "$DIR/$port/nodes.conf" --cluster-node-timeout 2000 \
    --save "" --appendonly no --dir "$DIR/$port" --daemonize yes \
    --logfile "$DIR/$port/redis.log"
done
for port in "${PORTS[@]}"; do
  for _ in $(seq 1 40); do
    [[ "$(redis-cli -p "$port" ping 2>/dev/null)" == "PONG" ]] && break
    sleep 0.25
  done
done
hosts=()
for port in "${PORTS[@]}"; do hosts+=("127.0.0.1:$port"); done
redis-cli --cluster create "${hosts[@]}" --cluster-replicas 1 --cluster-yes >"$DIR/create.log"
for _ in $(seq 1 80); do
  if healthy; then echo "Redis Cluster is ready on ${PORTS[0]}-${PORTS[5]}"; exit 0; fi
  sleep 0.25
done
echo "error: the Redis Cluster did not become healthy; see $DIR" >&2
exit 1
