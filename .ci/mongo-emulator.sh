#!/usr/bin/env bash
# Start the MongoDB test server for rheo_flow's MongoDB backend, idempotently.
#
# No MongoDB server is packaged for the CI machine, so the tests run against
# SecantusDB, an embeddable server speaking the MongoDB wire protocol (with
# transactions and change streams). It pins its own dependencies, so it lives in
# its own virtualenv under the cache directory, never in the project's.
#
# It is an emulator: fine for checking semantics, never a measure of MongoDB's speed.
# It starts through .ci/secantus-launch.py, which repairs one quadratic cost of the
# emulator (see there); the version is pinned because that repair names its internals.
#
# Environment (all optional):
#   RHEO_CACHE            cache directory (default ~/.cache/rheo-flow)
#   RHEO_MONGO_PORT       port on 127.0.0.1 (default 37017)
#   RHEO_MONGO_STORAGE    storage path or :memory: (default :memory:)
#   RHEO_MONGO_WAIT_S     seconds to wait for the server to answer ping (default 60)
#
# On success it prints the URL to use as RHEO_MONGO_URL on its last line.
# `mongo-emulator.sh stop` stops the server this script started (by its pid file).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SECANTUS_VERSION="0.7.0b3"
CACHE="${RHEO_CACHE:-$HOME/.cache/rheo-flow}"
VENV="$CACHE/secantus-venv"
PORT="${RHEO_MONGO_PORT:-37017}"
STORAGE="${RHEO_MONGO_STORAGE:-:memory:}"
WAIT_S="${RHEO_MONGO_WAIT_S:-60}"
LOG="$CACHE/secantus-$PORT.log"
PIDFILE="$CACHE/secantus-$PORT.pid"
URL="mongodb://127.0.0.1:$PORT/"
PYTHON="${PYTHON:-python3}"

die() { echo "mongo-emulator: error: $*" >&2; exit 1; }
say() { echo "mongo-emulator: $*" >&2; }

mkdir -p "$CACHE"

if [[ "${1:-}" == "stop" ]]; then
  if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    pid="$(cat "$PIDFILE")"
    kill "$pid"
    for _ in $(seq 1 100); do  # wait up to 10 s for the port to be free again
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    say "stopped secantusd-py (pid $pid)"
  fi
  rm -f "$PIDFILE"
  exit 0
elif [[ -n "${1:-}" ]]; then
  die "unknown argument ${1}; usage: mongo-emulator.sh [stop]"
fi

# ping answers with {ok: 1}: use the emulator venv's own pymongo (a SecantusDB dependency).
ping() {
  "$VENV/bin/python" - "$URL" <<'PY' >/dev/null 2>&1
import sys
from pymongo import MongoClient
client = MongoClient(sys.argv[1], serverSelectionTimeoutMS=1000, connectTimeoutMS=1000)
try:
    assert client.admin.command("ping").get("ok") == 1
finally:
    client.close()
PY
}

# 1. The virtualenv, reinstalled only when missing or at another version.
installed="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("SecantusDB"))' \
  2>/dev/null || true)"
if [[ "$installed" != "$SECANTUS_VERSION" ]]; then
  say "installing SecantusDB $SECANTUS_VERSION into $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" || die "cannot create a virtualenv with $PYTHON"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --pre \
    "SecantusDB==$SECANTUS_VERSION" || die "pip could not install SecantusDB==$SECANTUS_VERSION"
fi
[[ -x "$VENV/bin/secantusd-py" ]] || die "$VENV/bin/secantusd-py is missing after the install"
"$VENV/bin/python" -c 'import pymongo' 2>/dev/null \
  || "$VENV/bin/pip" install --quiet --disable-pip-version-check pymongo \
  || die "cannot install pymongo into $VENV for the readiness check"

# 2. Already running (ours or anyone's on that port): nothing to do.
if ping; then
  say "a server already answers on 127.0.0.1:$PORT"
  echo "$URL"
  exit 0
fi

# 3. Start it in the background, detached from this shell, logging to a file. A process
#    from an earlier run that is still starting (or stopping) gets the deadline to settle.
alive() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
started=0
start_server() {
  say "starting secantusd-py on 127.0.0.1:$PORT (storage $STORAGE, log $LOG)"
  if [[ "$STORAGE" != ":memory:" ]]; then
    mkdir -p "$STORAGE"
  fi
  nohup setsid "$VENV/bin/python" "$HERE/secantus-launch.py" --host 127.0.0.1 --port "$PORT" \
    --storage-path "$STORAGE" >"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  started=1
}
alive || start_server

# 4. Wait for ping, with a deadline; fail loudly with the log when it never answers.
deadline=$((SECONDS + WAIT_S))
until ping; do
  if ! alive; then
    if ((started)); then
      echo "---- $LOG ----" >&2
      tail -n 50 "$LOG" >&2 || true
      die "secantusd-py exited before answering ping on 127.0.0.1:$PORT"
    fi
    start_server
  fi
  if ((SECONDS >= deadline)); then
    echo "---- $LOG ----" >&2
    tail -n 50 "$LOG" >&2 || true
    die "secantusd-py did not answer ping on 127.0.0.1:$PORT within ${WAIT_S}s"
  fi
  sleep 0.5
done
say "SecantusDB is ready at $URL (pid $(cat "$PIDFILE"))"
echo "$URL"
