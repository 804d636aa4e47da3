#!/usr/bin/env bash
# Start a throw-away single-node SLURM cluster on this machine (tests, demos). Needs root.
#
#   tests/slurm/start.sh STATE_DIR
#
# Everything SLURM writes lives in STATE_DIR (config, state, logs, PID files). The one thing outside
# it: /etc/slurm/slurm.conf becomes a symlink to STATE_DIR/slurm.conf, because the executor plugin's
# job step drops SLURM_CONF from the environment of the `srun` it runs inside each job, so clients
# inside jobs only find the default path. An existing /etc/slurm/slurm.conf that is not such a
# symlink is never touched: start.sh exits 3 instead. Clients outside jobs may also use
#   source STATE_DIR/env.sh      # exports SLURM_CONF=STATE_DIR/slurm.conf
# Stop it with tests/slurm/stop.sh STATE_DIR (kills exactly the PIDs recorded in STATE_DIR/pids/,
# removes the symlink).
#
# Environment (all optional):
#   SLURMCTLD_PORT  (6817)   SLURMD_PORT (6818)   ports on 127.0.0.1; pick free ones if busy
#   SLURM_PARTITION (local)  name of the single, default partition
#   SLURM_WAIT_S    (60)     seconds to wait for the node to become idle
#   MIN_JOB_AGE     (300)    seconds a finished job stays visible to squeue (MinJobAge)
#   FAKE_GPUS       (1)      GPUs the node advertises (see below)
#   ACCOUNTING      (0)      1: also run a private MariaDB + slurmdbd (needs mariadb-server slurmdbd),
#                            so that sacct/sacctmgr work as on a production cluster, with account
#                            ACCOUNT_NAME (precswitch) for user root; DB_PORT (3307), SLURMDBD_PORT (6819)
#
# The node advertises FAKE_GPUS fake GPUs (gres "gpu", no device files) so that jobs asking for
# `--gpus=1` are accepted on a machine without a GPU; at most FAKE_GPUS of them run at once, on the CPU.
# Exit status: 0 = cluster idle and accepting jobs; 1 = usage/environment error; 2 = daemon failed
# (its log is printed); 3 = a real SLURM configuration (or another running cluster) is present.
set -euo pipefail

die() { echo "slurm-start: $*" >&2; exit "${2:-1}"; }
# On any failure after daemons were started, stop exactly those again.
on_exit() { rc=$?; if [ "$rc" != 0 ] && [ -n "${STATE:-}" ] && [ -d "$STATE/pids" ]; then
  "$(dirname "$0")/stop.sh" "$STATE" >&2 || true; fi; }

[ $# -eq 1 ] || die "usage: $0 STATE_DIR"
[ "$(id -u)" = 0 ] || die "must run as root (munged, slurmctld and slurmd are started here)"
for b in munged slurmctld slurmd sinfo sbatch squeue scontrol; do
  command -v "$b" >/dev/null || die "'$b' not found: apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
done
ACCOUNTING=${ACCOUNTING:-0}
if [ "$ACCOUNTING" = 1 ]; then
  for b in mariadbd mariadb-install-db mariadb slurmdbd sacctmgr; do
    command -v "$b" >/dev/null || die "ACCOUNTING=1: '$b' not found: apt-get install -y --no-install-recommends mariadb-server slurmdbd"
  done
fi

STATE=$(mkdir -p "$1" && cd "$1" && pwd)
ETC_CONF=/etc/slurm/slurm.conf
if [ -e "$ETC_CONF" ] || [ -L "$ETC_CONF" ]; then
  other=$(dirname "$(readlink "$ETC_CONF" 2>/dev/null || echo /nonexistent/x)")
  [ -L "$ETC_CONF" ] && [ -f "$other/pids/.started-by-precswitch" ] \
    || die "$ETC_CONF exists and was not made by this script; refusing to touch a real SLURM setup" 3
  pid=$(cat "$other/pids/slurmctld.pid" 2>/dev/null || true)
  if [ "$other" != "$STATE" ] && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    die "another local test cluster is running (state in $other); stop it first" 3
  fi
fi
CTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
PARTITION=${SLURM_PARTITION:-local}
WAIT_S=${SLURM_WAIT_S:-60}
MIN_JOB_AGE=${MIN_JOB_AGE:-300}
FAKE_GPUS=${FAKE_GPUS:-1}
DB_PORT=${DB_PORT:-3307}
DBD_PORT=${SLURMDBD_PORT:-6819}
ACCOUNT_NAME=${ACCOUNT_NAME:-precswitch}
NODE=$(hostname -s)
CPUS=$(nproc)
# Advertise 80% of total memory (slurmd refuses a node that claims more than it has).
MEM_MB=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)

mkdir -p "$STATE"/{state,spool,log,pids}
touch "$STATE/pids/.started-by-precswitch"
trap on_exit EXIT
chmod 755 "$STATE"

# ---- munge: reuse a running munged (e.g. the system's), else start one as user munge -------------
if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  echo "slurm-start: munged already answers on its default socket; reusing it (not recorded for stop)"
else
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 600 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 755 /run/munge
  rm -f /run/munge/munged.pid
  runuser -u munge -- munged --pid-file=/run/munge/munged.pid --log-file=/var/log/munge/munged.log \
    || { tail -n 20 /var/log/munge/munged.log >&2 || true; die "munged failed to start" 2; }
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
  cp /run/munge/munged.pid "$STATE/pids/munged.pid"
  for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null | unmunge >/dev/null || die "munged started but does not answer" 2
fi

# ---- slurm.conf / gres.conf ----------------------------------------------------------------------
cat >"$STATE/slurm.conf" <<CONF
# Generated by tests/slurm/start.sh: one node, one partition.
ClusterName=precswitch-test
SlurmctldHost=${NODE}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=${STATE}/state
SlurmdSpoolDir=${STATE}/spool/slurmd-%n
SlurmctldPidFile=${STATE}/pids/slurmctld.pid
SlurmdPidFile=${STATE}/pids/slurmd.pid
SlurmctldLogFile=${STATE}/log/slurmctld.log
SlurmdLogFile=${STATE}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# Containers: no cgroups, no systemd.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$(if [ "$ACCOUNTING" = 1 ]; then printf '%s\n' \
  "AccountingStorageType=accounting_storage/slurmdbd" "AccountingStorageHost=127.0.0.1" \
  "AccountingStoragePort=${DBD_PORT}"
else
  printf '%s\n' "AccountingStorageType=accounting_storage/none"
fi)
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
# Finished jobs stay visible to squeue this long (the executor's squeue status checks need it).
MinJobAge=${MIN_JOB_AGE}
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEM_MB} Gres=gpu:${FAKE_GPUS} State=UNKNOWN
PartitionName=${PARTITION} Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP
CONF
# Fake GPUs: empty regular files stand in for /dev/nvidia*, so --gpus=N is schedulable here.
mkdir -p "$STATE/dev"
for i in $(seq 0 $((FAKE_GPUS - 1))); do : >"$STATE/dev/fakegpu$i"; done
cat >"$STATE/gres.conf" <<CONF
NodeName=${NODE} Name=gpu File=${STATE}/dev/fakegpu[0-$((FAKE_GPUS - 1))]
CONF
printf 'export SLURM_CONF=%s\n' "$STATE/slurm.conf" >"$STATE/env.sh"
mkdir -p /etc/slurm
ln -sfn "$STATE/slurm.conf" "$ETC_CONF"
export SLURM_CONF="$STATE/slurm.conf"

# ---- daemons (they fork; their PID files land in STATE/pids) -------------------------------------
start_daemon() {  # name, command...
  local name=$1; shift
  rm -f "$STATE/pids/$name.pid"
  "$@" || { tail -n 30 "$STATE/log/$name.log" >&2 2>/dev/null || true; die "$name failed to start" 2; }
  for _ in $(seq 100); do [ -s "$STATE/pids/$name.pid" ] && return 0; sleep 0.1; done
  tail -n 30 "$STATE/log/$name.log" >&2 2>/dev/null || true
  die "$name wrote no PID file" 2
}
# ---- optional accounting: MariaDB (data in STATE/mysql, TCP on 127.0.0.1) and slurmdbd -----------
if [ "$ACCOUNTING" = 1 ]; then
  if [ ! -d "$STATE/mysql/mysql" ]; then
    mariadb-install-db --user=root --datadir="$STATE/mysql" --auth-root-authentication-method=normal \
      --skip-test-db >"$STATE/log/mariadb-install.log" 2>&1 \
      || { tail -n 20 "$STATE/log/mariadb-install.log" >&2; die "mariadb-install-db failed" 2; }
  fi
  setsid mariadbd --no-defaults --user=root --datadir="$STATE/mysql" --bind-address=127.0.0.1 \
    --port="$DB_PORT" --socket="$STATE/mysql.sock" --pid-file="$STATE/pids/mariadbd.pid" \
    --log-error="$STATE/log/mariadbd.log" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 300); do mariadb --no-defaults --socket="$STATE/mysql.sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
  mariadb --no-defaults --socket="$STATE/mysql.sock" -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" \
    || { tail -n 20 "$STATE/log/mariadbd.log" >&2; die "MariaDB did not start" 2; }
  cat >"$STATE/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=${NODE}
DbdAddr=127.0.0.1
DbdPort=${DBD_PORT}
SlurmUser=root
LogFile=${STATE}/log/slurmdbd.log
PidFile=${STATE}/pids/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=${DB_PORT}
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
CONF
  chmod 600 "$STATE/slurmdbd.conf"
  # slurmdbd reads slurmdbd.conf from the directory of SLURM_CONF
  start_daemon slurmdbd slurmdbd
  for _ in $(seq 100); do sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.2; done
  sacctmgr -i add cluster precswitch-test >/dev/null 2>&1 || true
  sacctmgr -i add account "$ACCOUNT_NAME" Description=test Organization=test >/dev/null
  sacctmgr -i add user "$(id -un)" Account="$ACCOUNT_NAME" DefaultAccount="$ACCOUNT_NAME" >/dev/null
  sacctmgr -n show assoc user="$(id -un)" format=account | grep -qw "$ACCOUNT_NAME" \
    || die "slurmdbd: account $ACCOUNT_NAME not set up" 2
fi

start_daemon slurmctld slurmctld -f "$STATE/slurm.conf" -i
start_daemon slurmd slurmd -f "$STATE/slurm.conf"

# ---- wait for the node to be idle ----------------------------------------------------------------
deadline=$(( $(date +%s) + WAIT_S ))
while :; do
  st=$(sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null || true)
  [ "$st" = idle ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "slurm-start: node state '${st:-?}' after ${WAIT_S}s" >&2
    tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
    die "cluster did not become idle" 2
  fi
  case "$st" in down*|drain*|fail*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;; esac
  sleep 0.5
done
echo "slurm-start: node $NODE idle in partition $PARTITION (SLURM_CONF=$STATE/slurm.conf)"
