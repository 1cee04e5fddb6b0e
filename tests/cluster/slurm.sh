#!/usr/bin/env bash
# A one-node SLURM for the cluster tests (`make test-cluster`), as root, without systemd:
#   tests/cluster/slurm.sh up DIR     install Debian's slurmctld, slurmd, slurm-client and munge when missing, write
#                                     DIR/slurm.conf (cores and memory from this machine), start munged (if none
#                                     runs), slurmctld and slurmd; prints `export SLURM_CONF=DIR/slurm.conf`
#   tests/cluster/slurm.sh down DIR   stop the daemons it started, by their pid files
# Every SLURM command reads the configuration from $SLURM_CONF, so nothing under /etc/slurm is touched. Its daemons
# listen on $SLURM_TEST_PORT and the port after it (default 6817, SLURM's own): another port lets a second one run.
set -euo pipefail
cmd=${1:?usage: slurm.sh up|down DIR}
dir=$(realpath -m "${2:?usage: slurm.sh up|down DIR}")

stop() {  # a daemon by its pid file, then wait for it to go
  local pidfile=$1
  [ -f "$pidfile" ] || return 0
  local pid; pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  rm -f "$pidfile"
}

if [ "$cmd" = down ]; then
  if [ -f "$dir/slurmctld.pid" ]; then  # its jobs first: their processes would outlive slurmd
    SLURM_CONF=$dir/slurm.conf squeue -h -o %i 2>/dev/null | xargs -r env SLURM_CONF="$dir/slurm.conf" scancel || true
  fi
  stop "$dir/slurmd.pid"; stop "$dir/slurmctld.pid"; stop "$dir/munged.pid"
  exit 0
fi
[ "$cmd" = up ] || { echo "usage: slurm.sh up|down DIR" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "slurm.sh: the one-node SLURM runs as root (it starts slurmd)" >&2; exit 2; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
    || ! command -v munged >/dev/null; then
  echo "installing slurmctld slurmd slurm-client munge (apt)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >&2
fi

mkdir -p "$dir/state" "$dir/spool"
host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))  # 80% of it for jobs
port=${SLURM_TEST_PORT:-6817}
cat > "$dir/slurm.conf" <<CONF
ClusterName=phasekv
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
DefMemPerCPU=$(( mem_mb / cpus / 2 ))
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
echo "# not read: proctrack/linuxproc and task/none use no cgroups" > "$dir/cgroup.conf"
export SLURM_CONF=$dir/slurm.conf

if ! pgrep -x munged >/dev/null; then  # one munged serves every SLURM on the machine
  [ -f /etc/munge/munge.key ] || { mungekey -c 2>/dev/null || create-munge-key -f; chown munge:munge /etc/munge/munge.key; }
  mkdir -p /run/munge && chown munge:munge /run/munge
  su -s /bin/sh munge -c munged
  pgrep -x -n munged > "$dir/munged.pid"
fi
slurmctld 2>>"$dir/slurmctld.log"
slurmd 2>>"$dir/slurmd.log"
for _ in $(seq 60); do  # the node idle within seconds
  sinfo -h -o %T 2>/dev/null | grep -q idle && break
  sleep 1
done
sinfo -h -o %T | grep -q idle || { echo "slurm.sh: the node did not come up; see $dir/slurmctld.log, $dir/slurmd.log" >&2; exit 1; }
echo "export SLURM_CONF=$dir/slurm.conf"
