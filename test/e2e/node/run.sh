#!/usr/bin/env bash
# The real-node e2e (`make e2e-node`, see test/e2e/README.md): prepares the
# host for one Kubernetes node, runs TestNode (test/e2e/node_test.go), and
# leaves the host as it found it — on pass, fail or interrupt.
#
# What it changes, and undoes on exit:
#   - a bridge pulse-node0 with 10.200.0.1/24 (the pod subnet) and a route
#     for the Service range 10.201.0.0/24 over it;
#   - iptables and ip6tables chains PULSE-E2E-NODE in the mangle table's
#     FORWARD chain that drop whatever the bridge would forward to, or take
#     from, any other interface, and (IPv4) PULSE-E2E-NODE-IN in INPUT that
#     drops pod addresses arriving on anything but the bridge or loopback;
#     nothing is masqueraded (the CNI bridge runs with ipMasq false);
#   - cgroups under /sys/fs/cgroup/*/pulse-e2e (the kubelet's cgroup root);
#   - /var/lib/kubelet, /var/log/pods, /var/log/containers, /var/lib/cni
#     (refused if any exists before: another node's, not ours to delete);
#   - the shims' sockets in /run/containerd/s, where containerd 1.6 always
#     puts them (found by the shims' PIDs; another containerd's are left);
#   - the bridge pulse-e2e0 the KEDA metrics adapter listens on (as in make e2e);
#   - the network namespaces of the pods on the bridge, and the mounts under
#     the state directory and /var/lib/kubelet;
#   - the kube-proxy's iptables chains (kube-proxy --cleanup, then any KUBE-*);
#   - sysctls the kubelet, the CNI plugin or kube-proxy set.
# Every process the test starts is recorded in $STATE/pids and stopped by
# PID; the runtime's shims are found by their containerd address, the
# containers' processes by their cgroup. Finally the sysctls, iptables rules
# and the rest are compared with what was recorded first: a difference fails
# the run loudly. A run killed before its cleanup is restored the same way,
# from its records, by the next run (when none of its processes runs).
#
#   PULSE_E2E_NODE_STATE  the state directory, absolute (default /tmp/pulse-e2e-node)
#   PULSE_E2E_LOGS        where the processes' logs go (default $STATE/logs)
#   PULSE_E2E_TOOLS, PULSE_E2E_BIN, PULSE_E2E_IMAGES  set by make e2e-node
set -uo pipefail
cd "$(dirname "$0")/../../.."

STATE=$(realpath -m "${PULSE_E2E_NODE_STATE:-/tmp/pulse-e2e-node}")
MARK=.pulse-e2e-node
BRIDGE=pulse-node0
ADAPTER_BRIDGE=pulse-e2e0
POD_CIDR=10.200.0.0/24
GATEWAY=10.200.0.1
SERVICE_CIDR=10.201.0.0/24
CHAIN=PULSE-E2E-NODE
CGROUP=pulse-e2e
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv4.conf.all.route_localnet net.ipv6.conf.all.forwarding
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables net.netfilter.nf_conntrack_max
  net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait)
HOST_DIRS=(/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni)

log() { echo "e2e-node: $*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root: it brings up a kubelet, containerd and a bridge"
# sysctl too: without it every value read as absent before and after, and
# the host's restore passed unchecked.
for c in containerd ctr runc iptables iptables-save ip6tables ip6tables-save ip ss gcc conntrack realpath sysctl flock sha256sum; do
  command -v "$c" >/dev/null || die "$c is missing (.ci/run installs containerd, runc, containernetworking-plugins, iptables, conntrack, procps)"
done
# The kubelet runs with the cgroupfs driver on a cgroup v1 hierarchy; a
# cgroup v2 host (where the systemd driver is the host's) is not supported.
[ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ] ||
  die "this host has cgroup v2: the node e2e supports only cgroup v1 hosts (cgroupfs driver) so far"
[ -x /usr/lib/cni/bridge ] || die "/usr/lib/cni/bridge is missing (Debian containernetworking-plugins)"
[ -n "${PULSE_E2E_TOOLS:-}" ] && [ -n "${PULSE_E2E_BIN:-}" ] && [ -n "${PULSE_E2E_IMAGES:-}" ] ||
  die "PULSE_E2E_TOOLS, PULSE_E2E_BIN and PULSE_E2E_IMAGES must be set: run make e2e-node"
# The state directory is removed and everything mounted under it unmounted:
# it must be the run's own.
case "$STATE" in
  / | /tmp | /var | /var/* | /run | /run/* | /etc | /etc/* | /usr | /usr/* | "$HOME") die "PULSE_E2E_NODE_STATE=$STATE: not a directory the run may own" ;;
esac
[ "$(dirname "$STATE")" != / ] || die "PULSE_E2E_NODE_STATE=$STATE: too close to /"
if [ -e "$STATE" ] && [ ! -e "$STATE/$MARK" ] && [ -n "$(ls -A "$STATE" 2>/dev/null)" ]; then
  die "$STATE exists and is not a previous run's state directory: choose another PULSE_E2E_NODE_STATE"
fi

# iptables-save of both families, without counters or comments, and without
# tables that hold nothing (listing a table creates it, empty).
rules() {
  { iptables-save; ip6tables-save; } 2>/dev/null | grep -v '^#' | sed 's/ *\[[0-9]*:[0-9]*\]//' | awk '
    /^\*/ { table = $0; body = ""; used = 0; next }
    /^COMMIT/ { if (used) print table body "\nCOMMIT"; next }
    /^:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) ACCEPT$/ { body = body "\n" $0; next }
    { body = body "\n" $0; used = 1 }'
}
# alive PID START: the recorded process is still the one recorded.
alive() { [ -d "/proc/$1" ] && [ "$(awk '{print $22}' "/proc/$1/stat" 2>/dev/null)" = "$2" ]; }
# shims: PIDs of the runtime shims of this run's containerd.
shims() {
  local p
  for p in /proc/[0-9]*; do
    tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q "containerd-shim.* -address $SOCK " && echo "${p#/proc/}"
  done
}
# ours: what is still running of this run (recorded processes and shims).
ours() {
  local pid start name
  while read -r pid start name; do
    [ -n "$pid" ] && alive "$pid" "$start" && echo "$pid ($name)"
  done <"$STATE/pids"
  shims | sed 's/$/ (containerd shim)/'
}
# netns_ours: the network namespaces whose veths are on the bridge.
netns_ours() {
  local ids id
  ids=$(ip -d -o link show master "$BRIDGE" 2>/dev/null | sed -n 's/.*link-netnsid \([0-9]*\).*/\1/p')
  for id in $ids; do
    ip netns list 2>/dev/null | sed -n "s/^\([^ ]*\) (id: $id)$/\1/p"
  done
  ip -d -o link show master "$BRIDGE" 2>/dev/null | sed -n 's/.*link-netns \([^ ]*\).*/\1/p'
}

# task_sockets: the shims' sockets of the tasks in this run's state, named
# as containerd 1.6 names them (runtime/v2/shim/util_unix.go, SocketAddress:
# the sha256 of address/namespace/task ID), whether or not the shims live.
task_sockets() {
  local id
  for id in $(ls "$STATE/containerd/state/io.containerd.runtime.v2.task/k8s.io" 2>/dev/null); do
    echo "/run/containerd/s/$(printf '%s' "$SOCK/k8s.io/$id" | sha256sum | cut -c1-64)"
  done
}

# leftovers: whether anything a run changes is there now.
leftovers() {
  awk '{print $5}' /proc/self/mountinfo | grep -q -e "^$STATE/" -e "^/var/lib/kubelet" && return 0
  local d l c
  for d in "${HOST_DIRS[@]}"; do [ -e "$d" ] && return 0; done
  for l in "$BRIDGE" "$ADAPTER_BRIDGE"; do ip link show "$l" >/dev/null 2>&1 && return 0; done
  for c in /sys/fs/cgroup/*/"$CGROUP"; do [ -e "$c" ] && return 0; done
  iptables-save 2>/dev/null | grep -q -e 'KUBE-' -e "$CHAIN" && return 0
  [ -n "$(shims)" ] && return 0
  # A dead shim's socket (a clean exit leaves the tasks' directories, not
  # their sockets).
  local f
  for f in $(task_sockets); do [ -e "$f" ] && return 0; done
  return 1
}

# stop: the run's processes, by the PID it recorded (each leads its process
# group), then the runtime's shims and every process in the kubelet's
# cgroups. Sets sockets: the shims' sockets, found before the shims go.
stop() {
  local pid start name sig
  for sig in TERM KILL; do
    while read -r pid start name; do
      [ -n "$pid" ] && alive "$pid" "$start" && kill "-$sig" "-$pid" "$pid" 2>/dev/null
    done <"$STATE/pids"
    [ "$sig" = TERM ] && sleep 2
  done
  local shim_pids c
  shim_pids=$(shims)
  # The shims' sockets (in /run/containerd/s, shared with any other
  # containerd), by the shims' PIDs, before they go.
  sockets=$(for pid in $shim_pids; do ss -xlpn 2>/dev/null | grep -F "pid=$pid," | awk '{print $5}'; done | grep '^/run/containerd/s/' | sort -u)
  for pid in $shim_pids; do kill -KILL "$pid" 2>/dev/null; done
  # A killed run's shims may be gone and their sockets left.
  sockets+=" $(task_sockets)"
  for c in /sys/fs/cgroup/*/"$CGROUP"; do
    [ -d "$c" ] || continue
    find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  done
  sleep 1
}

# undo: the network namespaces, mounts, bridges, iptables rules, cgroups,
# directories and sysctls the run changed.
undo() {
  # The pods' network namespaces (those with a veth on the bridge), then
  # mounts under the state directory and the kubelet's, deepest first.
  local n
  for n in $(netns_ours | sort -u); do
    umount "/run/netns/$n" 2>/dev/null
    ip netns delete "$n" 2>/dev/null || rm -f "/run/netns/$n"
  done
  awk '{print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    case "$m" in
      "$STATE"/* | /var/lib/kubelet | /var/lib/kubelet/*) umount -l "$m" 2>/dev/null ;;
    esac
  done
  # The bridges, and any veth left on ours.
  local v
  for v in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip link del "$v" 2>/dev/null
  done
  ip link del "$BRIDGE" 2>/dev/null
  ip link del "$ADAPTER_BRIDGE" 2>/dev/null
  # iptables: kube-proxy's chains, then what --cleanup leaves (its canary
  # chains, the kubelet's KUBE-FIREWALL and KUBE-MARK-MASQ): every KUBE-*
  # chain and the jumps to them (none existed before: the run refuses to
  # start otherwise); then ours.
  if [ -x "$PULSE_E2E_TOOLS/kube-proxy" ]; then
    "$PULSE_E2E_TOOLS/kube-proxy" --cleanup >"$LOGS/kube-proxy-cleanup.log" 2>&1
  fi
  local ipt tbl line c
  for ipt in iptables ip6tables; do
    for tbl in filter nat mangle raw; do
      "$ipt-save" -t "$tbl" 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -vE '^-A KUBE-' | while read -r line; do
        eval "$ipt -w -t $tbl -D ${line#-A }" 2>/dev/null
      done
      for c in $("$ipt-save" -t "$tbl" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do "$ipt" -w -t "$tbl" -F "$c" 2>/dev/null; done
      for c in $("$ipt-save" -t "$tbl" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do "$ipt" -w -t "$tbl" -X "$c" 2>/dev/null; done
    done
  done
  local hook chain
  for hook in iptables:FORWARD:"$CHAIN" ip6tables:FORWARD:"$CHAIN" iptables:INPUT:"$CHAIN-IN"; do
    ipt=${hook%%:*} chain=${hook##*:} hook=${hook#*:} hook=${hook%%:*}
    while "$ipt" -w -t mangle -D "$hook" -j "$chain" 2>/dev/null; do :; done
    "$ipt" -w -t mangle -F "$chain" 2>/dev/null
    "$ipt" -w -t mangle -X "$chain" 2>/dev/null
  done
  # cgroups, deepest first.
  for c in /sys/fs/cgroup/*/"$CGROUP"; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  # Host directories the node made, if nothing is mounted there any more
  # (never through a mount), and the shims' sockets.
  local d
  for d in "${HOST_DIRS[@]}"; do
    if awk '{print $5}' /proc/self/mountinfo | grep -q "^$d\(/\|$\)"; then
      log "FAIL: still mounted under $d: not removed"
    else
      rm -rf --one-file-system "$d"
    fi
  done
  for f in $sockets; do rm -f "$f"; done
  if [ ! -e "$STATE/run-containerd.existed" ]; then
    rmdir /run/containerd/s /run/containerd 2>/dev/null
  fi
  # Sysctls back to what they were.
  local s val
  while IFS='=' read -r s val; do
    [ "$val" = absent ] || sysctl -qw "$s=$val" >/dev/null 2>&1
  done <"$STATE/sysctl.before"
}

# verify: compares the host with the run's records; anything left is a
# failure, said loudly (returns 1).
verify() {
  local bad=0 left s v c d f
  for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s" 2>/dev/null || echo absent)"; done >"$STATE/sysctl.after"
  if ! diff -u "$STATE/sysctl.before" "$STATE/sysctl.after" >&2; then log "FAIL: sysctls differ from before the run"; bad=1; fi
  rules >"$STATE/iptables.after"
  if ! diff -u "$STATE/iptables.before" "$STATE/iptables.after" >&2; then log "FAIL: iptables rules differ from before the run"; bad=1; fi
  for v in "$BRIDGE" "$ADAPTER_BRIDGE"; do
    ip link show "$v" >/dev/null 2>&1 && { log "FAIL: link $v is still there"; bad=1; }
  done
  for c in /sys/fs/cgroup/*/"$CGROUP"; do [ -e "$c" ] && { log "FAIL: cgroup $c is still there"; bad=1; }; done
  for d in "${HOST_DIRS[@]}"; do [ -e "$d" ] && { log "FAIL: $d is still there"; bad=1; }; done
  if awk '{print $5}' /proc/self/mountinfo | grep -q -e "^$STATE/" -e "^/var/lib/kubelet"; then log "FAIL: mounts are left"; bad=1; fi
  left=$(comm -13 "$STATE/netns.before" <(ls /run/netns 2>/dev/null | sort))
  [ -n "$left" ] && { log "FAIL: network namespaces made during the run are left: $left"; bad=1; }
  for f in $sockets; do [ -e "$f" ] && { log "FAIL: shim socket $f is left"; bad=1; }; done
  if [ ! -e "$STATE/run-containerd.existed" ] && [ -e /run/containerd ]; then
    log "FAIL: /run/containerd is still there"
    bad=1
  fi
  left=$(ours)
  [ -n "$left" ] && { log "FAIL: still running: $left"; bad=1; }
  [ "$bad" = 0 ]
}

# restore: undoes what a run changed, from its records in $STATE.
restore() {
  local sockets
  stop
  undo
  verify
}

TEST_PID=
cleaned=0
cleanup() {
  local rc=$?
  [ "$cleaned" = 1 ] && return
  cleaned=1
  # Nothing interrupts the cleanup.
  trap '' INT TERM HUP
  log "cleaning up"
  if [ -n "$TEST_PID" ] && kill -0 "$TEST_PID" 2>/dev/null; then
    kill -TERM "$TEST_PID" 2>/dev/null
    wait "$TEST_PID" 2>/dev/null
  fi
  if ! restore; then
    log "the host was NOT left as it was found (see above)"
    exit 1
  fi
  log "host restored: processes stopped, mounts, namespaces, bridges, iptables rules, cgroups and directories removed, sysctls as before"
  exit "$rc"
}

# One run at a time on a host: the lock is held while this script runs
# (the processes it starts do not inherit it), and a SIGKILL frees it.
exec 9>"$STATE.lock" || die "cannot open $STATE.lock"
flock -n 9 || die "another make e2e-node holds $STATE.lock: one run at a time"
SOCK="$STATE/containerd/containerd.sock"
LOGS="${PULSE_E2E_LOGS:-$STATE/logs}"

# A run killed before its cleanup (SIGKILL, a lost session) leaves the host
# changed, and its records in the state directory: with none of its
# processes left, it is restored from those records, as its own exit would
# have, and checked the same way.
if [ -e "$STATE/$MARK" ] && [ -e "$STATE/pids" ] && [ -e "$STATE/sysctl.before" ] && [ -e "$STATE/iptables.before" ] &&
  [ -e "$STATE/netns.before" ]; then
  left=$(while read -r pid start name; do [ -n "$pid" ] && alive "$pid" "$start" && echo "$pid ($name)"; done <"$STATE/pids")
  [ -z "$left" ] || die "a previous run's processes still run: $left; stop them, or wait for that run"
  if leftovers; then
    log "a previous run ended without cleaning up (killed?): restoring the host from its records in $STATE"
    mkdir -p "$LOGS"
    restore || die "the previous run's changes could not all be undone (see above)"
    log "the previous run's changes are undone"
  fi
fi
if awk '{print $5}' /proc/self/mountinfo | grep -q "^$STATE/"; then
  die "something is mounted under $STATE: a run that could not clean up? Unmount it first."
fi
for d in "${HOST_DIRS[@]}"; do
  [ -e "$d" ] && die "$d exists: another node's (or a run that could not clean up). Remove it if it is not in use."
done
for l in "$BRIDGE" "$ADAPTER_BRIDGE"; do
  ip link show "$l" >/dev/null 2>&1 && die "a link $l exists: another run, or one that could not clean up? ip link del $l"
done
for c in /sys/fs/cgroup/*/; do
  [ -e "$c$CGROUP" ] && die "cgroup $c$CGROUP exists: a run that could not clean up?"
done

rm -rf --one-file-system "$STATE"
mkdir -p "$STATE"
touch "$STATE/$MARK"
: >"$STATE/pids"
mkdir -p "$LOGS"
LOGS=$(realpath "$LOGS")

# Record what the run may change.
for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s" 2>/dev/null || echo absent)"; done >"$STATE/sysctl.before"
rules >"$STATE/iptables.before"
grep -q 'KUBE-' "$STATE/iptables.before" && die "iptables has KUBE-* chains: another kube-proxy or kubelet runs here"
ls /run/netns 2>/dev/null | sort >"$STATE/netns.before"
[ -d /run/containerd ] && touch "$STATE/run-containerd.existed"
trap cleanup EXIT
# A signal stops the test (which the script runs in the background, so that
# the trap runs at once), then cleans up.
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# The pod network: the bridge the CNI plugin will use, and the rules that
# keep pod traffic on it.
must() { "$@" || die "failed: $*"; }
must ip link add "$BRIDGE" type bridge
must ip addr add "$GATEWAY/24" dev "$BRIDGE"
must ip link set "$BRIDGE" up
must ip route add "$SERVICE_CIDR" dev "$BRIDGE" src "$GATEWAY"
for fam in iptables ip6tables; do
  must "$fam" -w -t mangle -N "$CHAIN"
  must "$fam" -w -t mangle -A "$CHAIN" -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
  must "$fam" -w -t mangle -A "$CHAIN" -o "$BRIDGE" ! -i "$BRIDGE" -j DROP
  must "$fam" -w -t mangle -I FORWARD 1 -j "$CHAIN"
  must "$fam" -w -t mangle -C FORWARD -j "$CHAIN"
done
# INPUT: pod addresses only from the bridge or this host itself (no
# spoofing from elsewhere).
must iptables -w -t mangle -N "$CHAIN-IN"
must iptables -w -t mangle -A "$CHAIN-IN" -i lo -j RETURN
must iptables -w -t mangle -A "$CHAIN-IN" -i "$BRIDGE" -j RETURN
must iptables -w -t mangle -A "$CHAIN-IN" -s "$POD_CIDR" -j DROP
must iptables -w -t mangle -I INPUT 1 -j "$CHAIN-IN"
must iptables -w -t mangle -C INPUT -j "$CHAIN-IN"

# The kubelet's cgroup root, in every v1 hierarchy (cpuset needs its
# parent's CPUs and memory nodes copied).
for c in /sys/fs/cgroup/*/; do
  [ -d "$c" ] && [ -w "$c" ] || continue
  mkdir "$c$CGROUP" 2>/dev/null || continue
  if [ -f "$c$CGROUP/cpuset.cpus" ]; then
    cat "${c}cpuset.cpus" >"$c$CGROUP/cpuset.cpus"
    cat "${c}cpuset.mems" >"$c$CGROUP/cpuset.mems"
  fi
done

export PULSE_E2E_NODE_STATE="$STATE" PULSE_E2E_LOGS="$LOGS" PULSE_E2E_NODE_BRIDGE="$BRIDGE"
export PULSE_E2E_NODE_GATEWAY="$GATEWAY" PULSE_E2E_NODE_POD_CIDR="$POD_CIDR" PULSE_E2E_NODE_SERVICE_CIDR="$SERVICE_CIDR"
export PULSE_E2E_NODE_CGROUP="$CGROUP"
log "state in $STATE, logs in $LOGS"
go test -c -tags e2e -o "$STATE/e2e.test" ./test/e2e/ 9>&- || die "build the e2e test"
(cd test/e2e && exec "$STATE/e2e.test" -test.v -test.count=1 -test.timeout=25m -test.run '^TestNode$' 9>&-) &
TEST_PID=$!
wait "$TEST_PID"
rc=$?
TEST_PID=
[ "$rc" = 0 ] || exit "$rc"
