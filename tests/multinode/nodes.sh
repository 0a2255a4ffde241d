#!/usr/bin/env bash
# nodes.sh — several "nodes" on one machine: each a network namespace with its own hostname (UTS
# namespace), its own /dev/shm (mount namespace) and its own veth link into one bridge. Needs root.
#
#   tests/multinode/nodes.sh up N [--rate RATE]   create nodes 1..N (RATE e.g. 10gbit: tc tbf on every link)
#   tests/multinode/nodes.sh down                 remove every node, the bridge and the addresses (idempotent)
#   tests/multinode/nodes.sh exec NODE CMD...     run CMD on node NODE (1..N), in all its namespaces
#   tests/multinode/nodes.sh rsh-agent-path       print the path of the rsh agent for mpirun -mca plm_rsh_agent
#   tests/multinode/nodes.sh status               list the nodes: address, hostname, link rate, veth bytes
#   tests/multinode/nodes.sh addr NODE            print node NODE's address (0 = the bridge, in the root namespace)
#   tests/multinode/nodes.sh veth NODE            print the root-namespace end of node NODE's link
#   tests/multinode/nodes.sh count                print how many nodes exist (0 when none)
#
# Layout (PREFIX=braid, NET=10.231.0 by default): node i is network namespace PREFIX-n$i with `lo` and
# `eth0` = NET.i/24; eth0's peer PREFIX-v$i sits in the root namespace on bridge PREFIX-br, which holds
# NET.254/24, so the root namespace reaches every node (an HTTP server inside node 1 is at NET.1:PORT).
# The addresses exist only inside these namespaces and on the bridge, and go with `down`.
# Each node also has a persistent mount + UTS namespace (bind-mounted under /run/braid-nodes/): its
# hostname is PREFIX-n$i and its /dev/shm a private tmpfs, so shared-memory transports (Open MPI's
# vader, UCX's posix/sysv) cannot join processes of different nodes; bytes between nodes cross the
# veths, whose counters are /sys/class/net/PREFIX-v$i/statistics/{rx,tx}_bytes in the root namespace.
# Environment: BRAID_NODES_PREFIX (default braid, at most 9 characters: interface names are short)
# and BRAID_NODES_NET (default 10.231.0, a /24 that must not exist on this machine) let two sets of
# nodes coexist. `up` refuses when nodes of this prefix exist already (run `down` first).
set -euo pipefail
prefix=${BRAID_NODES_PREFIX:-braid}
net=${BRAID_NODES_NET:-10.231.0}
bridge=$prefix-br
state=/run/braid-nodes
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "nodes.sh: $*" >&2; exit 1; }
node_ns() { echo "$prefix-n$1"; }
node_veth() { echo "$prefix-v$1"; }
node_dir() { echo "$state/$prefix-n$1"; }
# the node numbers that exist now (from the network namespaces)
existing_nodes() {
  ip netns list 2> /dev/null | awk '{print $1}' | sed -n "s/^$prefix-n\([0-9][0-9]*\)\$/\1/p" | sort -n
}
check_node() {
  case "$1" in ''|*[!0-9]*) die "NODE must be a node number (1..N), got '$1'" ;; esac
  [ -e "/run/netns/$(node_ns "$1")" ] && [ -e "$(node_dir "$1")/mnt" ] || die "node $1 does not exist (nodes.sh up N first)"
}

# The state directory must be a private mount so that the namespace files bind-mounted into it
# are not propagated elsewhere (unshare(1) refuses otherwise on shared mounts).
prepare_state_dir() {
  mkdir -p "$state"
  if ! grep -q " $state " /proc/self/mountinfo; then
    mount --bind "$state" "$state"
    mount --make-private "$state"
  fi
}

up_node() {  # up_node I RATE
  local i=$1 rate=$2 ns veth dir
  ns=$(node_ns "$i"); veth=$(node_veth "$i"); dir=$(node_dir "$i")
  ip netns add "$ns"
  ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip link set "$veth" master "$bridge" up
  ip -n "$ns" addr add "$net.$i/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  if [ -n "$rate" ]; then
    # Both directions: the node's egress on eth0, its ingress as the bridge side's egress.
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 1mbit latency 50ms
    tc qdisc add dev "$veth" root tbf rate "$rate" burst 1mbit latency 50ms
  fi
  # Persistent mount + UTS namespaces for the node: private /dev/shm, its own hostname, and /sys
  # mounted afresh from inside its network namespace (so /sys/class/net lists the node's links).
  # unshare binds the namespace files from the root mount namespace, where nsenter --net leaves us.
  mkdir -p "$dir"
  : > "$dir/mnt"; : > "$dir/uts"
  nsenter --net="/run/netns/$ns" unshare --mount="$dir/mnt" --uts="$dir/uts" --propagation private \
    sh -c "umount -l /sys && mount -t sysfs sysfs /sys && mount -t tmpfs -o size=1g,mode=1777 braid-shm /dev/shm && hostname $ns"
}

cmd_up() {
  local n=${1:-} rate=""
  shift || true
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) rate=${2:?--rate needs a value, e.g. 10gbit}; shift 2 ;;
      --rate=*) rate=${1#*=}; shift ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  case "$n" in ''|*[!0-9]*) die "usage: nodes.sh up N [--rate RATE]" ;; esac
  [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "N must be 1..250"
  [ "$(id -u)" = 0 ] || die "needs root (network and mount namespaces)"
  [ -z "$(existing_nodes)" ] && ! ip link show "$bridge" > /dev/null 2>&1 ||
    die "nodes of prefix '$prefix' exist already (nodes.sh down first)"
  case "$(ip -o -4 addr show)" in *" inet $net."*) die "$net.0/24 is in use on this machine (set BRAID_NODES_NET)" ;; esac
  prepare_state_dir
  # Anything half made is removed when a step fails.
  trap 'echo "nodes.sh: up failed; removing what was made" >&2; cmd_down' ERR
  ip link add "$bridge" type bridge
  ip addr add "$net.254/24" dev "$bridge"
  ip link set "$bridge" up
  local i
  for i in $(seq 1 "$n"); do up_node "$i" "$rate"; done
  trap - ERR
  echo "nodes.sh: $n node(s) up: ${net}.1..${net}.$n (bridge $bridge $net.254${rate:+, links $rate})" >&2
}

cmd_down() {
  local i ns dir pids
  for i in $(existing_nodes); do
    ns=$(node_ns "$i"); dir=$(node_dir "$i")
    # Processes still running on the node (mpirun daemons, ranks) would keep its namespaces alive.
    pids=$(ip netns pids "$ns" 2> /dev/null || true)
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086
      kill -KILL $pids 2> /dev/null || true
    fi
    ip netns del "$ns" 2> /dev/null || true
  done
  # A namespace file may outlive its network namespace (a failed up): unmount them all.
  if [ -d "$state" ]; then
    for dir in "$state/$prefix"-n*; do
      [ -d "$dir" ] || continue
      umount "$dir/mnt" 2> /dev/null || true
      umount "$dir/uts" 2> /dev/null || true
      rm -rf "$dir"
    done
  fi
  # veths go with their namespaces; the root ends too. Remove strays and the bridge.
  for i in $(ip -o link show 2> /dev/null | sed -n "s/^[0-9]*: \($prefix-v[0-9]*\)[@:].*/\1/p"); do
    ip link del "$i" 2> /dev/null || true
  done
  ip link del "$bridge" 2> /dev/null || true
  # The private bind mount of the state directory goes when no set of nodes uses it.
  if [ -d "$state" ] && [ -z "$(ls -A "$state")" ]; then
    umount "$state" 2> /dev/null || true
    rmdir "$state" 2> /dev/null || true
  fi
  return 0
}

# exec_on NODE CMD...: every namespace of the node (network, mount with /dev/shm, UTS).
cmd_exec() {
  local i=${1:-}
  shift || true
  check_node "$i"
  [ $# -gt 0 ] || die "usage: nodes.sh exec NODE CMD..."
  local dir; dir=$(node_dir "$i")
  exec nsenter --net="/run/netns/$(node_ns "$i")" --mount="$dir/mnt" --uts="$dir/uts" -- "$@"
}

cmd_status() {
  local i ns veth rate
  for i in $(existing_nodes); do
    ns=$(node_ns "$i"); veth=$(node_veth "$i")
    rate=$(tc qdisc show dev "$veth" 2> /dev/null | sed -n 's/.* rate \([^ ]*\).*/\1/p')
    printf '%s %s.%s hostname=%s link=%s rate=%s rx_bytes=%s tx_bytes=%s\n' "$i" "$net" "$i" \
      "$(nsenter --uts="$(node_dir "$i")/uts" hostname 2> /dev/null || echo '?')" "$veth" "${rate:-unlimited}" \
      "$(cat "/sys/class/net/$veth/statistics/rx_bytes" 2> /dev/null || echo '?')" \
      "$(cat "/sys/class/net/$veth/statistics/tx_bytes" 2> /dev/null || echo '?')"
  done
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  exec) shift; cmd_exec "$@" ;;
  rsh-agent-path) echo "$here/netns-rsh" ;;
  status) cmd_status ;;
  count) existing_nodes | wc -l ;;
  addr) case "${2:-}" in 0) echo "$net.254" ;; ''|*[!0-9]*) die "usage: nodes.sh addr NODE" ;; *) echo "$net.$2" ;; esac ;;
  veth) case "${2:-}" in ''|*[!0-9]*) die "usage: nodes.sh veth NODE" ;; *) node_veth "$2" ;; esac ;;
  -h|--help|help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) sed -n '4,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
