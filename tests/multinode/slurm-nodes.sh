#!/usr/bin/env bash
# slurm-nodes.sh — a real multi-node Slurm over the "nodes" of tests/multinode/nodes.sh: slurmctld on
# node 1, one slurmd on every node (each in its node's network, mount and UTS namespaces, so a job
# step on node i runs behind node i's veth with node i's hostname and /dev/shm). Needs root.
#
#   tests/multinode/slurm-nodes.sh start DIR   write DIR/slurm.conf and start the daemons (nodes up first)
#   tests/multinode/slurm-nodes.sh stop DIR    stop what `start DIR` started (idempotent)
#
# After `start`, `export SLURM_CONF=DIR/slurm.conf` points sbatch / squeue / scancel at this cluster
# from the root namespace (they reach the controller over the bridge). Everything lives in DIR: the
# configuration, state, spool directories, logs and pid files, so it never touches /etc/slurm or a
# Slurm already running on this machine (its ports are 6917 and 6918, not Slurm's 6817 / 6818; each
# slurmd listens inside its own network namespace). munged is shared: started if none runs (and then
# stopped by `stop`). BRAID_NODES_PREFIX / BRAID_NODES_NET select the set of nodes, as for nodes.sh.
# Slurm's node names are the nodes' hostnames (PREFIX-n1 ...), NodeAddr their addresses.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=${BRAID_NODES_PREFIX:-braid}
net=${BRAID_NODES_NET:-10.231.0}
nodes_sh=$here/nodes.sh
die() { echo "slurm-nodes.sh: $*" >&2; exit 1; }

write_conf() {  # write_conf DIR N
  local dir=$1 n=$2 i cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 / 2 ))
  mkdir -p "$dir/state" "$dir/log" "$dir/run"
  for i in $(seq 1 "$n"); do mkdir -p "$dir/spool-$prefix-n$i"; done
  {
    echo "ClusterName=braidnodes"
    echo "SlurmctldHost=$prefix-n1($net.1)"
    echo "SlurmctldPort=6917"
    echo "SlurmdPort=6918"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "StateSaveLocation=$dir/state"
    # %n: the node's name, so every slurmd keeps its own spool, log and pid file.
    echo "SlurmdSpoolDir=$dir/spool-%n"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
    echo "SlurmctldPidFile=$dir/run/slurmctld.pid"
    echo "SlurmdPidFile=$dir/run/slurmd-%n.pid"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SchedulerType=sched/backfill"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "ReturnToService=2"
    echo "MpiDefault=none"
    echo "SlurmdTimeout=30"
    for i in $(seq 1 "$n"); do
      echo "NodeName=$prefix-n$i NodeAddr=$net.$i CPUs=$cpus RealMemory=$mem State=UNKNOWN"
    done
    echo "PartitionName=nodes Nodes=$prefix-n[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8"
  } > "$dir/slurm.conf"
}

start_munge() {  # start_munge DIR: a munged for the Slurm daemons and clients, unless one runs
  if [ -S /run/munge/munge.socket.2 ] && pgrep -x munged > /dev/null; then return 0; fi
  mkdir -p /run/munge /etc/munge
  [ -f /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2> /dev/null
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2> /dev/null || true
  chmod 400 /etc/munge/munge.key
  runuser -u munge -- munged --force --pid-file=/run/munge/munged.pid
  echo started > "$1/run/munge-started"
}

# A shell script that mounts, under a fresh /sys, the cgroup file systems mounted here (same type,
# options and place), so that slurmd in a node sees the layout the machine has.
cgroup_mount_script() {
  echo 'mountpoint -q /sys/fs/cgroup && exit 0'
  awk '$2 == "/sys/fs/cgroup" && $3 == "tmpfs" { print "mount -t tmpfs -o mode=755 cgroup-root /sys/fs/cgroup" }' /proc/mounts
  awk '$2 ~ "^/sys/fs/cgroup" && ($3 == "cgroup" || $3 == "cgroup2") {
         printf "mkdir -p %s && mount -t %s -o %s %s %s\n", $2, $3, $4, $3, $2 }' /proc/mounts
}

cmd_start() {
  local dir=${1:?usage: slurm-nodes.sh start DIR} n i
  [ "$(id -u)" = 0 ] || die "needs root"
  for tool in slurmctld slurmd munged sinfo; do command -v "$tool" > /dev/null || die "$tool not found (apt-get install slurmd slurmctld slurm-client munge; scripts/setup.sh does this)"; done
  n=$("$nodes_sh" count)
  [ "$n" -ge 1 ] || die "no nodes of prefix $prefix (tests/multinode/nodes.sh up N first)"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  write_conf "$dir" "$n"
  start_munge "$dir"
  # A node's /sys is its own sysfs (nodes.sh), without the cgroup file systems slurmd's start-up
  # reads: mount the same hierarchies there as this namespace has (v1, v2 or both), once.
  local cgroup_mounts
  cgroup_mounts=$(cgroup_mount_script)
  for i in $(seq 1 "$n"); do
    "$nodes_sh" exec "$i" sh -c "$cgroup_mounts" || die "cannot mount the cgroup file systems on node $i"
  done
  # The daemons fork into the background inside the node's namespaces and stay there.
  "$nodes_sh" exec 1 slurmctld -f "$dir/slurm.conf"
  for i in $(seq 1 "$n"); do "$nodes_sh" exec "$i" slurmd -f "$dir/slurm.conf"; done
  export SLURM_CONF=$dir/slurm.conf
  for i in $(seq 1 60); do
    [ "$(sinfo -h -N -o '%T' 2> /dev/null | grep -cE '^(idle|mix|alloc)')" = "$n" ] && { sinfo -N; return 0; }
    sleep 1
  done
  sinfo -N >&2 || true
  die "the $n slurmd(s) did not all come up idle within 60 s (logs in $dir/log)"
}

cmd_stop() {
  local dir=${1:?usage: slurm-nodes.sh stop DIR} f
  [ -d "$dir" ] || return 0
  for f in "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid"; do
    [ -f "$f" ] && kill "$(cat "$f")" 2> /dev/null || true
  done
  if [ -f "$dir/run/munge-started" ]; then
    [ -f /run/munge/munged.pid ] && kill "$(cat /run/munge/munged.pid)" 2> /dev/null || true
    rm -f "$dir/run/munge-started"
  fi
  return 0
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
