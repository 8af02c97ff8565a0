#!/usr/bin/env bash
# The real-node e2e (`make e2e-node`, see test/e2e/README.md): prepares the
# host for one Kubernetes node, runs TestNode (test/e2e/node_test.go), and
# leaves the host as it found it — on pass, fail or interrupt.
#
# What it changes, and undoes on exit:
#   - a bridge pulse-node0 with 10.200.0.1/24 (the pod subnet) and a route
#     for the Service range 10.201.0.0/24 over it;
#   - iptables chains PULSE-E2E-NODE and PULSE-E2E-NODE-IN in the mangle
#     table's FORWARD and INPUT chains that drops pod traffic to any interface but the bridge
#     (nothing is masqueraded: the CNI bridge runs with ipMasq false);
#   - cgroups under /sys/fs/cgroup/*/pulse-e2e (the kubelet's cgroup root);
#   - /var/lib/kubelet, /var/log/pods, /var/log/containers, /var/lib/cni
#     (refused if any exists before: another node's, not ours to delete);
#   - the shims' sockets in /run/containerd/s, where containerd 1.6 always
#     puts them (the directory too if the run made it; a host's own
#     containerd's sockets are left alone);
#   - the bridge pulse-e2e0 the KEDA metrics adapter listens on (as in make e2e);
#   - network namespaces (/run/netns/cni-*) and mounts the runtime makes;
#   - the kube-proxy's iptables chains (kube-proxy --cleanup);
#   - sysctls the kubelet, the CNI plugin or kube-proxy set.
# Every process the test starts is recorded in $STATE/pids and stopped by
# PID; the runtime's shims and the containers' processes are found by their
# state directory and cgroup. Finally the sysctls and iptables rules are
# compared with what was recorded first: a difference fails the run loudly.
#
#   PULSE_E2E_NODE_STATE  the state directory (default /tmp/pulse-e2e-node)
#   PULSE_E2E_LOGS        where the processes' logs go (default $STATE/logs)
#   PULSE_E2E_TOOLS, PULSE_E2E_BIN, PULSE_E2E_IMAGES  set by make e2e-node
set -uo pipefail
cd "$(dirname "$0")/../../.."

STATE="${PULSE_E2E_NODE_STATE:-/tmp/pulse-e2e-node}"
BRIDGE=pulse-node0
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
for c in containerd ctr runc iptables iptables-save ip6tables-save ip gcc conntrack; do
  command -v "$c" >/dev/null || die "$c is missing (.ci/run installs containerd, runc, containernetworking-plugins, iptables, conntrack)"
done
# The kubelet runs with the cgroupfs driver on a cgroup v1 hierarchy; a
# cgroup v2 host (where the systemd driver is the host's) is not supported.
[ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ] ||
  die "this host has cgroup v2: the node e2e supports only cgroup v1 hosts (cgroupfs driver) so far"
[ -x /usr/lib/cni/bridge ] || die "/usr/lib/cni/bridge is missing (Debian containernetworking-plugins)"
[ -n "${PULSE_E2E_TOOLS:-}" ] && [ -n "${PULSE_E2E_BIN:-}" ] && [ -n "${PULSE_E2E_IMAGES:-}" ] ||
  die "PULSE_E2E_TOOLS, PULSE_E2E_BIN and PULSE_E2E_IMAGES must be set: run make e2e-node"
for d in "${HOST_DIRS[@]}"; do
  [ -e "$d" ] && die "$d exists: another node's (or a run that could not clean up). Remove it if it is not in use."
done
ip link show "$BRIDGE" >/dev/null 2>&1 && die "a link $BRIDGE exists: a run that could not clean up? ip link del $BRIDGE"
for c in /sys/fs/cgroup/*/; do
  [ -e "$c$CGROUP" ] && die "cgroup $c$CGROUP exists: a run that could not clean up?"
done

rm -rf "$STATE"
mkdir -p "$STATE"
: >"$STATE/pids"
LOGS="${PULSE_E2E_LOGS:-$STATE/logs}"
mkdir -p "$LOGS"

# Record what the run may change.
for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s" 2>/dev/null || echo absent)"; done >"$STATE/sysctl.before"
# iptables-save of both families, without counters or comments, and without
# tables that hold nothing (listing a table creates it, empty).
rules() {
  { iptables-save; ip6tables-save; } 2>/dev/null | grep -v '^#' | sed 's/ *\[[0-9]*:[0-9]*\]//' | awk '
    /^\*/ { table = $0; body = ""; used = 0; next }
    /^COMMIT/ { if (used) print table body "\nCOMMIT"; next }
    /^:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) ACCEPT$/ { body = body "\n" $0; next }
    { body = body "\n" $0; used = 1 }'
}
rules >"$STATE/iptables.before"
grep -q 'KUBE-' "$STATE/iptables.before" && die "iptables has KUBE-* chains: another kube-proxy or kubelet runs here"
ls /run/netns 2>/dev/null | sort >"$STATE/netns.before"
if [ -d /run/containerd ]; then ls /run/containerd/s 2>/dev/null | sort >"$STATE/shim-sockets.before"; fi

cleaned=0
cleanup() {
  local rc=$?
  [ "$cleaned" = 1 ] && return
  cleaned=1
  trap - EXIT INT TERM
  log "cleaning up"
  # The test's processes, by the PID it recorded (only if the PID is still
  # the process it recorded: its start time matches).
  local pid start
  while read -r pid start _; do
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || continue
    [ "$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null)" = "$start" ] || continue
    kill -TERM "-$pid" "$pid" 2>/dev/null
  done <"$STATE/pids"
  sleep 2
  while read -r pid start _; do
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || continue
    [ "$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null)" = "$start" ] || continue
    kill -KILL "-$pid" "$pid" 2>/dev/null
  done <"$STATE/pids"
  # The runtime's shims (their command line names the state directory) and
  # every process in the kubelet's cgroups.
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF "$STATE/"; then kill -KILL "${p#/proc/}" 2>/dev/null; fi
  done
  for c in /sys/fs/cgroup/*/"$CGROUP"; do
    [ -d "$c" ] || continue
    find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  done
  sleep 1
  # Mounts under the state directory, the kubelet's directory and the
  # runtime's network namespaces, deepest first.
  local netns_new
  netns_new=$(comm -13 "$STATE/netns.before" <(ls /run/netns 2>/dev/null | sort))
  awk '{print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    case "$m" in
      "$STATE"/* | /var/lib/kubelet | /var/lib/kubelet/*) umount -l "$m" 2>/dev/null ;;
    esac
  done
  for n in $netns_new; do
    umount "/run/netns/$n" 2>/dev/null
    ip netns delete "$n" 2>/dev/null || rm -f "/run/netns/$n"
  done
  # The bridge (its veths went with the namespaces; any left go with it).
  for v in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip link del "$v" 2>/dev/null
  done
  ip link del "$BRIDGE" 2>/dev/null
  ip link del pulse-e2e0 2>/dev/null
  # iptables: kube-proxy's chains, then ours.
  if [ -x "$PULSE_E2E_TOOLS/kube-proxy" ]; then
    "$PULSE_E2E_TOOLS/kube-proxy" --cleanup >"$LOGS/kube-proxy-cleanup.log" 2>&1
  fi
  # What --cleanup leaves (its canary chains, the kubelet's KUBE-FIREWALL and
  # KUBE-MARK-MASQ): every KUBE-* chain, and the jumps to them (none existed
  # before: the run refuses to start otherwise).
  local ipt tbl line
  for ipt in iptables ip6tables; do
    for tbl in filter nat mangle raw; do
      "$ipt-save" -t "$tbl" 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -vE '^-A KUBE-' | while read -r line; do
        eval "$ipt -t $tbl -D ${line#-A }" 2>/dev/null
      done
      for c in $("$ipt-save" -t "$tbl" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do "$ipt" -t "$tbl" -F "$c" 2>/dev/null; done
      for c in $("$ipt-save" -t "$tbl" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do "$ipt" -t "$tbl" -X "$c" 2>/dev/null; done
    done
  done
  local hook chain
  for hook in FORWARD:"$CHAIN" INPUT:"$CHAIN-IN"; do
    chain=${hook#*:} hook=${hook%%:*}
    while iptables -t mangle -D "$hook" -j "$chain" 2>/dev/null; do :; done
    iptables -t mangle -F "$chain" 2>/dev/null
    iptables -t mangle -X "$chain" 2>/dev/null
  done
  # cgroups, deepest first.
  for c in /sys/fs/cgroup/*/"$CGROUP"; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  # Host directories the node made.
  for d in "${HOST_DIRS[@]}"; do rm -rf "$d"; done
  if [ -f "$STATE/shim-sockets.before" ]; then
    for f in $(comm -13 "$STATE/shim-sockets.before" <(ls /run/containerd/s 2>/dev/null | sort)); do rm -f "/run/containerd/s/$f"; done
  else
    rm -rf /run/containerd
  fi
  # Sysctls back to what they were.
  local s v
  while IFS='=' read -r s v; do
    [ "$v" = absent ] || sysctl -qw "$s=$v" >/dev/null 2>&1
  done <"$STATE/sysctl.before"

  # Compare: anything left is a failure, said loudly.
  local bad=0
  for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s" 2>/dev/null || echo absent)"; done >"$STATE/sysctl.after"
  if ! diff -u "$STATE/sysctl.before" "$STATE/sysctl.after" >&2; then log "FAIL: sysctls differ from before the run"; bad=1; fi
  rules >"$STATE/iptables.after"
  if ! diff -u "$STATE/iptables.before" "$STATE/iptables.after" >&2; then log "FAIL: iptables rules differ from before the run"; bad=1; fi
  for l in "$BRIDGE" pulse-e2e0; do
    ip link show "$l" >/dev/null 2>&1 && { log "FAIL: link $l is still there"; bad=1; }
  done
  for c in /sys/fs/cgroup/*/"$CGROUP"; do [ -e "$c" ] && { log "FAIL: cgroup $c is still there"; bad=1; }; done
  for d in "${HOST_DIRS[@]}"; do [ -e "$d" ] && { log "FAIL: $d is still there"; bad=1; }; done
  if [ -f "$STATE/shim-sockets.before" ]; then
    left=$(comm -13 "$STATE/shim-sockets.before" <(ls /run/containerd/s 2>/dev/null | sort))
    [ -n "$left" ] && { log "FAIL: shim sockets left in /run/containerd/s: $left"; bad=1; }
  elif [ -e /run/containerd ]; then
    log "FAIL: /run/containerd is still there"
    bad=1
  fi
  if grep -qF -e " $STATE/" -e " /var/lib/kubelet" /proc/self/mountinfo; then log "FAIL: mounts are left"; bad=1; fi
  left=$(comm -13 "$STATE/netns.before" <(ls /run/netns 2>/dev/null | sort))
  [ -n "$left" ] && { log "FAIL: network namespaces left: $left"; bad=1; }
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF "$STATE/"; then log "FAIL: process ${p#/proc/} is still running"; bad=1; fi
  done
  if [ "$bad" = 1 ]; then
    log "the host was NOT left as it was found (see above)"
    exit 1
  fi
  log "host restored: processes stopped, mounts, namespaces, bridge, iptables rules, cgroups and directories removed, sysctls as before"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The pod network: the bridge the CNI plugin will use, and the rule that
# keeps pod traffic on it.
ip link add "$BRIDGE" type bridge || die "create $BRIDGE"
ip addr add "$GATEWAY/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
ip route add "$SERVICE_CIDR" dev "$BRIDGE" src "$GATEWAY"
iptables -t mangle -N "$CHAIN"
iptables -t mangle -A "$CHAIN" -s "$POD_CIDR" -o "$BRIDGE" -j RETURN
iptables -t mangle -A "$CHAIN" -s "$POD_CIDR" -j DROP
iptables -t mangle -I FORWARD 1 -j "$CHAIN"
# INPUT: pod addresses only from the bridge or this host itself (no
# spoofing from elsewhere).
iptables -t mangle -N "$CHAIN-IN"
iptables -t mangle -A "$CHAIN-IN" -i lo -j RETURN
iptables -t mangle -A "$CHAIN-IN" -i "$BRIDGE" -j RETURN
iptables -t mangle -A "$CHAIN-IN" -s "$POD_CIDR" -j DROP
iptables -t mangle -I INPUT 1 -j "$CHAIN-IN"

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
go test -tags e2e -count=1 -timeout 25m -v -run '^TestNode$' ./test/e2e/ "$@"
