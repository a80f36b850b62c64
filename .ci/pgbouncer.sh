#!/usr/bin/env bash
# PgBouncer 1.18+ in transaction pooling in front of the local PostgreSQL, on 127.0.0.1:6432.
#   bash .ci/pgbouncer.sh        start it (installing Debian's package if missing)
#   bash .ci/pgbouncer.sh stop   stop it
# Trust auth, as the PostgreSQL it fronts; its files live in /tmp/rheo-pgbouncer.
set -euo pipefail
DIR=/tmp/rheo-pgbouncer
PORT="${RHEO_PGBOUNCER_PORT:-6432}"

if [[ "${1:-start}" == "stop" ]]; then
  [[ -f "$DIR/pgbouncer.pid" ]] && kill "$(cat "$DIR/pgbouncer.pid")" 2>/dev/null || true
  exit 0
fi

if ! command -v pgbouncer >/dev/null 2>&1 && [[ ! -x /usr/sbin/pgbouncer ]]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q pgbouncer >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q pgbouncer >/dev/null; }
fi
BIN="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"

ready() { pg_isready -q -h 127.0.0.1 -p "$PORT" -d test; }
if ready; then
  echo "PgBouncer already listening on $PORT"
  exit 0
fi

mkdir -p "$DIR"
cat > "$DIR/userlist.txt" <<USERS
"postgres" ""
"root" ""
USERS
cat > "$DIR/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
logfile = $DIR/pgbouncer.log
pidfile = $DIR/pgbouncer.pid
admin_users = postgres
INI
# PgBouncer refuses to run as root; Debian's package ships the postgres user.
chown -R postgres "$DIR"
if [[ "$(id -u)" == 0 ]]; then
  su postgres -s /bin/sh -c "$BIN -d $DIR/pgbouncer.ini"
else
  "$BIN" -d "$DIR/pgbouncer.ini"
fi
for _ in $(seq 1 60); do
  ready && { echo "PgBouncer is ready on $PORT"; exit 0; }
  sleep 0.25
done
echo "error: PgBouncer did not start; see $DIR/pgbouncer.log" >&2
exit 1
