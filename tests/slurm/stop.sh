#!/usr/bin/env bash
# Stop what tests/slurm/start.sh STATE_DIR started: exactly the PIDs recorded in STATE_DIR/pids/
# (slurmd, slurmctld, slurmdbd and mariadbd with ACCOUNTING=1, then munged if start.sh started it) and removes the /etc/slurm/slurm.conf
# symlink if it points into STATE_DIR. Cancels leftover jobs first.
# Waits at most STOP_WAIT_S (10) seconds per daemon before SIGKILL. Safe to run twice.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 STATE_DIR" >&2; exit 1; }
STATE=$1
[ -d "$STATE/pids" ] || { echo "slurm-stop: nothing recorded in $STATE/pids"; exit 0; }
WAIT_S=${STOP_WAIT_S:-10}

if [ -s "$STATE/pids/slurmctld.pid" ] && [ -f "$STATE/slurm.conf" ]; then
  SLURM_CONF="$STATE/slurm.conf" timeout 10 scancel --full --user="$(id -un)" 2>/dev/null || true
fi

stop_pid() {  # name
  local f="$STATE/pids/$1.pid" pid
  [ -s "$f" ] || return 0
  pid=$(tr -dc 0-9 <"$f")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq $((WAIT_S * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "slurm-stop: $1 (pid $pid) ignored SIGTERM; sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "slurm-stop: stopped $1 (pid $pid)"
  fi
  rm -f "$f"
}
stop_pid slurmd
stop_pid slurmctld
stop_pid slurmdbd
stop_pid mariadbd
stop_pid munged
# Remove the /etc/slurm/slurm.conf symlink start.sh made, if it still points here.
if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$(cd "$STATE" && pwd)/slurm.conf" ]; then
  rm -f /etc/slurm/slurm.conf
fi
exit 0
