#!/usr/bin/env bash
# A single-node SLURM on localhost for the tests of profiles/slurm (tests/test_slurm.py), or to try the profile:
# slurmctld + slurmd, partitions "cpu" (default) and "gpu", the node declaring one fake GPU as a generic resource.
#   scripts/local_slurm.sh start | stop | status
# Needs root and Debian's slurm-wlm and munge (apt-get install slurm-wlm munge). Without slurmdbd there is no
# accounting, so sacct cannot report jobs: run snakemake with --slurm-status-command squeue (MinJobAge below
# keeps finished jobs visible to squeue long enough). The fake GPU: a gres needs a device file, so /dev/knnlm-gpu0
# is a character device (mknod c 1 3, i.e. /dev/null's numbers); nothing runs on it.
# The node declares CPUS (default 32) and MEM_MB (default 262144) whatever the machine has (config_overrides), so
# requests are checked against the config, not the hardware.
# start records the pid of every daemon it launched itself in $STATE; stop ends exactly those, by pid (never a daemon
# it did not start, such as a real cluster node's slurmd), and only while the pid is still that daemon.
set -euo pipefail
CONF=${SLURM_CONF_DIR:-/etc/slurm}
STATE=${LOCAL_SLURM_STATE:-/run/knnlm-local-slurm.pids}
HOST=$(hostname -s)
CPUS=${CPUS:-32}
MEM_MB=${MEM_MB:-262144}
GPU_DEV=/dev/knnlm-gpu0

record() {  # record NAME PIDFILE: the pid of a daemon this script just launched (its pid file, once written)
  local name=$1 pidfile=$2 pid=""
  for _ in $(seq 1 50); do
    pid=$(cat "$pidfile" 2>/dev/null || true)
    [ -n "$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$name" ] && break
    pid=$(pgrep -n -x "$name" || true)
    [ -n "$pid" ] && break
    sleep 0.1
  done
  [ -n "$pid" ] && echo "$name $pid" >> "$STATE"
}

start() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null || {
    echo "local_slurm: slurmctld/munged not installed (apt-get install slurm-wlm munge)" >&2; exit 2; }
  [ "$(id -u)" = 0 ] || { echo "local_slurm: needs root" >&2; exit 2; }
  mkdir -p "$CONF" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /etc/munge
  [ -e "$GPU_DEV" ] || mknod "$GPU_DEV" c 1 3
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  chown -R munge:munge /etc/munge /run/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  if ! pgrep -x munged >/dev/null; then
    su -s /bin/sh munge -c "munged" 2>/dev/null || munged --force
    record munged /run/munge/munged.pid
  fi
  cat > "$CONF/slurm.conf" <<CONF
ClusterName=knnlm-local
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
GresTypes=gpu
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:1 State=UNKNOWN
PartitionName=cpu Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$HOST MaxTime=INFINITE State=UP
CONF
  echo "NodeName=$HOST Name=gpu File=$GPU_DEV" > "$CONF/gres.conf"
  # -c: start without the saved state. A run killed with its daemons (a CI machine stopped mid-test) leaves jobs in
  # StateSaveLocation that slurmctld would recover as RUNNING on the next start, holding the one GPU until it finds
  # their batch scripts missing (~30 min): every GPU job waited, and the tiny DAG timed out.
  if ! pgrep -x slurmctld >/dev/null; then slurmctld -c; record slurmctld /run/slurmctld.pid; fi
  if ! pgrep -x slurmd >/dev/null; then slurmd -c; record slurmd /run/slurmd.pid; fi
  for _ in $(seq 1 30); do
    if sinfo -h -o "%T" 2>/dev/null | grep -qE "^(idle|mixed|allocated)"; then
      sinfo; exit 0
    fi
    scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  echo "local_slurm: the node did not become idle:" >&2; sinfo -R >&2 || true; exit 1
}

stop() {  # end the daemons that start launched (their pids in $STATE), slurmd first, munged last
  [ -f "$STATE" ] || { echo "local_slurm: no daemons started by this script ($STATE missing): nothing to stop"; return 0; }
  local pids=()
  for name in slurmd slurmctld munged; do
    while read -r n pid; do
      if [ "$n" = "$name" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$name" ]; then
        kill "$pid" 2>/dev/null || true
        pids+=("$pid")
      fi
    done < "$STATE"
  done
  for _ in $(seq 1 60); do
    local alive=0
    for pid in "${pids[@]}"; do [ -d /proc/"$pid" ] && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  rm -f "$STATE"
}

case "${1:-status}" in
  start) start ;;
  stop) stop ;;
  status) sinfo ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
