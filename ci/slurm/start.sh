#!/usr/bin/env bash
# A one-node SLURM on this machine for the tests marked `slurm`: Debian's slurm-wlm and munge,
# slurmctld and slurmd both on 127.0.0.1, with enough virtual CPUs for a driver job and four
# one-thread worker jobs. Installs the packages where they are missing (needs root and the
# package registry), writes /etc/slurm/slurm.conf unless one is there, starts munged, slurmctld and
# slurmd unless they run, and waits until the node takes jobs. Safe to run again.
#
#   sudo bash ci/slurm/start.sh        # then: pytest -m slurm
#   bash ci/slurm/stop.sh              # stops the daemons this script started
#
# The same shape as dask-jobqueue's own CI (ci/slurm/ in its repository), without docker.
set -euo pipefail

CPUS="${DASKANN_SLURM_CPUS:-8}"         # virtual CPUs of the node (config_overrides lets it exceed the cores)
MEMORY_MB="${DASKANN_SLURM_MEMORY_MB:-16000}"
WAIT_S="${DASKANN_SLURM_WAIT:-120}"
CONF=/etc/slurm/slurm.conf
RUN_DIR=/run/daskann-slurm                # pid files of the daemons started here
LOG_DIR=/var/log/slurm

say() { echo "ci/slurm/start.sh: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (it installs packages and starts daemons as root)"

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return
  say "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_config() {
  [ -f "$CONF" ] && grep -q '^# written by daskann ci/slurm/start.sh' "$CONF" && return
  [ -f "$CONF" ] && die "$CONF exists and was not written by this script: refusing to replace it"
  local host
  host="$(hostname -s)"
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOG_DIR"
  cat >"$CONF" <<CONF
# written by daskann ci/slurm/start.sh: one node on 127.0.0.1 for the tests marked slurm
ClusterName=daskann-ci
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=${RUN_DIR}/slurmctld.pid
SlurmdPidFile=${RUN_DIR}/slurmd.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
# the node declares more CPUs than the machine has: a driver and four one-thread workers fit
SlurmdParameters=config_overrides
# a job killed at its walltime is signalled and then killed after this many seconds
KillWait=5
MinJobAge=60
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEMORY_MB} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  say "starting munged"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  [ -f /etc/munge/munge.key ] || /usr/sbin/mungekey --create --keyfile=/etc/munge/munge.key
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  chmod 0700 /etc/munge
  chmod 0400 /etc/munge/munge.key
  /usr/sbin/munged --force
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.2; done
  die "munged does not answer (munge -n | unmunge)"
}

start_daemon() {  # name, command...
  local name="$1"; shift
  if pgrep -x "$name" >/dev/null; then return; fi
  say "starting $name"
  "$@"
}

wait_for_node() {
  local state=""
  for _ in $(seq "$WAIT_S"); do
    state="$(sinfo -h -N -o %t 2>/dev/null | head -n 1 || true)"
    case "$state" in
      idle|mix|alloc) say "node $(hostname -s) is $state ($CPUS CPUs)"; return ;;
      down*|drain*) scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
  done
  tail -n 20 "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" >&2 2>/dev/null || true
  die "the node did not become idle within ${WAIT_S}s (last state: '${state:-no answer}')"
}

install_packages
write_config
mkdir -p "$RUN_DIR"
start_munge
start_daemon slurmctld /usr/sbin/slurmctld
start_daemon slurmd /usr/sbin/slurmd
wait_for_node
