#!/usr/bin/env bash
# ci/testbed.sh — two "hosts" for uiw on one machine: two network namespaces, each with a
# veth to a bridge in a third (the "wire"), a uiw device published in each host (own
# UIW_STATE_DIR), optional random frame loss on the wire.
#
#   ci/testbed.sh [-p PREFIX] up [--mtu 1500|9000] [--loss PCT] [--net A.B.C] [--ifname NAME]
#                                [--uiw PATH] [--transport tcp|packet|xdp]
#                                [--transport-a T] [--transport-b T]
#       create namespaces PREFIX-a and PREFIX-b (the hosts) and PREFIX-w (the wire: a
#       bridge, br0, with ports to-a and to-b), a veth from each host (NAME, default veth0)
#       to its port, addresses A.B.C.1/24 on host A and A.B.C.2/24 on host B (default
#       198.51.100, the RFC 5737 TEST-NET-2 range: it exists only inside these namespaces),
#       bring everything up and run `uiw up --netdev NAME` in each host with
#       UIW_STATE_DIR=STATE/{a,b}. The uiw device is uiw_NAME on both hosts. --loss as for
#       `loss both PCT`.
#       --transport is passed to `uiw up` on both hosts (default tcp); --transport-a/-b set
#       one host's (a mixed pair: xdp on A, tcp on B). When either host uses packet or xdp
#       the offloads (tx checksum, TSO, GSO, GRO) of all four veth ends are turned off first,
#       as uiw's userspace TCP needs (needs ethtool); programs run there as root
#       (CAP_NET_RAW, CAP_NET_ADMIN, CAP_BPF). xdp at --mtu 9000 carries each frame in
#       several 4 KiB UMEM chunks (AF_XDP multi-buffer, kernel 6.6+; an older kernel's uiw
#       announces an MSS that fits one chunk, 3786).
#   ci/testbed.sh [-p PREFIX] run a|b [--] CMD [ARGS...]
#       run CMD on host A/B under `uiw run` (exec: the PID you get is CMD's)
#   ci/testbed.sh [-p PREFIX] exec a|b|w [--] CMD [ARGS...]
#       run CMD on host A/B, or on the wire (w), without uiw's environment (ip, nft, ss,
#       tcpdump, ...)
#   ci/testbed.sh [-p PREFIX] loss a|b|both PCT
#       drop PCT percent (0-100, fractions like 0.1 allowed; 0 removes the rule) of the
#       IPv4/IPv6 frames host A/B sends, chosen at random by nftables `numgen random` (this
#       kernel has no netem), on the wire: the bridge's `forward` hook in PREFIX-w (table
#       bridge uiw_testbed_a or _b), after the sender took each frame as sent. So a loss is
#       a loss whatever the hosts' transports: a kernel TCP must detect and repair it (a drop
#       at its own `output` or `egress` hook would be reported back to it, NET_XMIT_DROP,
#       and the segment simply sent later), and a raw host's frames, which pass no netfilter
#       hook of their own, are dropped as well. Each rule counts what it dropped and carries
#       the comment "loss a->b" or "loss b->a": `ci/testbed.sh exec w nft list ruleset`.
#   ci/testbed.sh [-p PREFIX] cut a|b        remove the host's address (it "disappears":
#                                            its peer's segments are silently dropped)
#   ci/testbed.sh [-p PREFIX] restore a|b    put it back
#   ci/testbed.sh [-p PREFIX] env            print shell assignments: TB_PREFIX TB_NS_A TB_NS_B
#                                            TB_IF TB_DEV TB_ADDR_A TB_ADDR_B TB_STATE_A
#                                            TB_STATE_B TB_MTU TB_UIW TB_TRANSPORT_A
#                                            TB_TRANSPORT_B (eval "$(... env)")
#   ci/testbed.sh [-p PREFIX] down           kill what runs in the namespaces, `uiw down`,
#                                            delete the namespaces and the state
#
# PREFIX (default uiwtb, or $UIW_TESTBED_PREFIX) names the namespaces and the state dir
# /tmp/PREFIX-testbed; give each concurrent user (test, helper) its own prefix. Needs root,
# iproute2 and nftables. `up` on an existing testbed of the same prefix tears it down first.
#
# Example:
#   ci/testbed.sh -p demo up --loss 1
#   ci/testbed.sh -p demo run b ib_write_bw -d uiw_veth0 -x 0 & sleep 1
#   ci/testbed.sh -p demo run a ib_write_bw -d uiw_veth0 -x 0 198.51.100.2; wait
#   ci/testbed.sh -p demo down
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${UIW_TESTBED_PREFIX:-uiwtb}

die() { echo "testbed: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
	case $1 in
	-p|--prefix) prefix=$2; shift 2 ;;
	-h|--help) usage; exit 0 ;;
	*) break ;;
	esac
done
[[ $# -gt 0 ]] || { usage >&2; exit 2; }
cmd=$1; shift
[[ $prefix =~ ^[A-Za-z0-9_-]{1,20}$ ]] || die "prefix '$prefix': use 1-20 of [A-Za-z0-9_-]"

dir=/tmp/$prefix-testbed
conf=$dir/env
ns_a=$prefix-a
ns_b=$prefix-b
ns_w=$prefix-w

load() {
	[[ -f $conf ]] || die "no testbed '$prefix' (run: $0 -p $prefix up)"
	# shellcheck disable=SC1090
	. "$conf"
}

ns_of() {
	case $1 in
	a|A) echo "$TB_NS_A" ;;
	b|B) echo "$TB_NS_B" ;;
	w|W) echo "$ns_w" ;;
	*) die "host '$1': say a or b (or w, the wire, for exec)" ;;
	esac
}

# set_loss HOST PCT: (re)write the rule that drops PCT% of what host a/b sends (on the
# wire; see the header).
set_loss() {
	local h=${1,,} pct=$2 per10k peer
	per10k=$(awk -v p="$pct" 'BEGIN { if (p !~ /^[0-9]*\.?[0-9]+$/ || p > 100) exit 1; printf "%d", p * 100 + 0.5 }') ||
		die "loss '$pct': give a percentage 0-100"
	peer=$([[ $h == a ]] && echo b || echo a)
	ip netns exec "$ns_w" nft delete table bridge "uiw_testbed_$h" 2>/dev/null || true
	[[ $per10k -gt 0 ]] || return 0
	ip netns exec "$ns_w" nft -f - <<EOF
table bridge uiw_testbed_$h {
	chain forward {
		type filter hook forward priority 0; policy accept;
		iifname "to-$h" meta protocol { ip, ip6 } numgen random mod 10000 < $per10k counter drop comment "loss $h->$peer"
	}
}
EOF
}

teardown() {
	local ns st
	for ns in "$ns_a" "$ns_b" "$ns_w"; do
		ip netns list | awk '{print $1}' | grep -qx "$ns" || continue
		# Only processes inside our own namespaces: things this testbed's users started.
		for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
	done
	sleep 0.2
	for ns in "$ns_a" "$ns_b" "$ns_w"; do
		ip netns list | awk '{print $1}' | grep -qx "$ns" || continue
		for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
	done
	if [[ -f $conf ]]; then
		# shellcheck disable=SC1090
		. "$conf"
		for st in "$TB_STATE_A" "$TB_STATE_B"; do
			[[ -d $st ]] && UIW_STATE_DIR=$st "$TB_UIW" down >/dev/null 2>&1 || true
		done
	fi
	for ns in "$ns_a" "$ns_b" "$ns_w"; do ip netns del "$ns" 2>/dev/null || true; done
	rm -rf "$dir"
}

case $cmd in
up)
	mtu=1500 loss=0 net=198.51.100 ifname=veth0 transport_a=tcp transport_b=tcp
	uiw=${UIW:-}
	while [[ $# -gt 0 ]]; do
		case $1 in
		--mtu) mtu=$2; shift 2 ;;
		--loss) loss=$2; shift 2 ;;
		--net) net=$2; shift 2 ;;
		--ifname) ifname=$2; shift 2 ;;
		--uiw) uiw=$2; shift 2 ;;
		--transport) transport_a=$2 transport_b=$2; shift 2 ;;
		--transport-a) transport_a=$2; shift 2 ;;
		--transport-b) transport_b=$2; shift 2 ;;
		*) die "up: unknown option $1" ;;
		esac
	done
	[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, /dev/infiniband)"
	[[ $mtu =~ ^[0-9]+$ && $mtu -ge 1280 && $mtu -le 65535 ]] || die "--mtu $mtu: give 1280..65535 (1500, 9000)"
	[[ $net =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--net $net: give three octets, e.g. 198.51.100"
	[[ ${#ifname} -le 15 ]] || die "--ifname: at most 15 characters"
	for transport in "$transport_a" "$transport_b"; do
		[[ $transport =~ ^(tcp|packet|xdp)$ ]] || die "--transport $transport: say tcp, packet or xdp"
		[[ $transport == tcp ]] || command -v ethtool >/dev/null || die "--transport $transport needs ethtool (apt-get install ethtool)"
	done
	command -v nft >/dev/null || die "nftables is not installed (apt-get install nftables)"
	awk -v p="$loss" 'BEGIN { exit !(p ~ /^[0-9]*\.?[0-9]+$/ && p <= 100) }' || die "--loss $loss: give a percentage 0-100"
	if [[ -z $uiw ]]; then
		for p in "$repo/target/${CARGO_PROFILE:-debug}/uiw" "$repo/target/debug/uiw" "$repo/target/release/uiw"; do
			[[ -x $p ]] && { uiw=$p; break; }
		done
		[[ -n $uiw ]] || uiw=$(command -v uiw) || die "no uiw binary: cargo build, or pass --uiw PATH"
	fi
	uiw=$(readlink -f "$uiw")
	teardown
	mkdir -p "$dir"
	cat >"$conf" <<EOF
TB_PREFIX=$prefix
TB_NS_A=$ns_a
TB_NS_B=$ns_b
TB_IF=$ifname
TB_DEV=uiw_$ifname
TB_ADDR_A=$net.1
TB_ADDR_B=$net.2
TB_PLEN=24
TB_STATE_A=$dir/a
TB_STATE_B=$dir/b
TB_MTU=$mtu
TB_UIW=$uiw
TB_TRANSPORT_A=$transport_a
TB_TRANSPORT_B=$transport_b
EOF
	. "$conf"
	trap 'echo "testbed: up failed; tearing down" >&2; teardown' ERR
	ip netns add "$ns_a"
	ip netns add "$ns_b"
	ip netns add "$ns_w"
	# The wire: a bridge without STP (a port forwards as soon as it is up) and no IPv6 of
	# its own (no solicitations from the ports). Every veth end is created directly inside
	# its namespace: no name in the machine's own.
	ip netns exec "$ns_w" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6'
	ip -n "$ns_w" link add br0 mtu "$mtu" type bridge stp_state 0
	for h in a b; do
		ip link add name "$ifname" mtu "$mtu" netns "$(ns_of $h)" type veth peer name "to-$h" mtu "$mtu" netns "$ns_w"
		ip -n "$ns_w" link set "to-$h" master br0 up
	done
	ip -n "$ns_w" link set br0 up
	for h in a b; do
		ns=$(ns_of $h)
		addr=$([[ $h == a ]] && echo "$TB_ADDR_A" || echo "$TB_ADDR_B")
		ip -n "$ns" link set lo up
		ip -n "$ns" addr add "$addr/$TB_PLEN" dev "$ifname"
		ip -n "$ns" link set "$ifname" up
	done
	# Wait for both ends to be up (carrier) so the first SYN is not lost to an unready link.
	for _ in $(seq 50); do
		if ip -n "$ns_a" -o link show "$ifname" | grep -q 'state UP' &&
			ip -n "$ns_b" -o link show "$ifname" | grep -q 'state UP'; then break; fi
		sleep 0.1
	done
	if [[ $transport_a != tcp || $transport_b != tcp ]]; then
		# uiw's userspace TCP computes every checksum and needs frames no larger than the MTU.
		for h in a b; do
			ip netns exec "$(ns_of $h)" ethtool -K "$ifname" tx off tso off gso off gro off >/dev/null
			ip netns exec "$ns_w" ethtool -K "to-$h" tx off tso off gso off gro off >/dev/null
		done
	fi
	for h in a b; do
		st=$([[ $h == a ]] && echo "$TB_STATE_A" || echo "$TB_STATE_B")
		transport=$([[ $h == a ]] && echo "$transport_a" || echo "$transport_b")
		ip netns exec "$(ns_of $h)" env UIW_STATE_DIR="$st" "$uiw" up --netdev "$ifname" --transport "$transport" >/dev/null
	done
	[[ $loss == 0 ]] || { set_loss a "$loss"; set_loss b "$loss"; }
	trap - ERR
	echo "testbed $prefix: host a $ns_a $TB_ADDR_A ($transport_a), host b $ns_b $TB_ADDR_B ($transport_b), wire $ns_w, device $TB_DEV, mtu $mtu, loss ${loss}% each way"
	;;
run|exec)
	load
	[[ $# -gt 0 ]] || die "$cmd: say a or b, then the command"
	ns=$(ns_of "$1"); h=${1,,}; shift
	[[ ${1:-} == -- ]] && shift
	[[ $# -gt 0 ]] || die "$cmd: no command"
	if [[ $h == w ]]; then
		[[ $cmd == exec ]] || die "run: the wire has no uiw device (say a or b; exec w runs a command there)"
		exec ip netns exec "$ns" "$@"
	fi
	st=$([[ $h == a ]] && echo "$TB_STATE_A" || echo "$TB_STATE_B")
	if [[ $cmd == run ]]; then
		exec ip netns exec "$ns" env UIW_STATE_DIR="$st" "$TB_UIW" run -- "$@"
	fi
	exec ip netns exec "$ns" env UIW_STATE_DIR="$st" "$@"
	;;
loss)
	load
	[[ $# -eq 2 ]] || die "loss: give a|b|both and a percentage"
	case $1 in
	both) set_loss a "$2"; set_loss b "$2" ;;
	a|A|b|B) set_loss "$1" "$2" ;;
	*) die "loss: host '$1': say a, b or both" ;;
	esac
	;;
cut|restore)
	load
	[[ $# -eq 1 && $1 =~ ^[aAbB]$ ]] || die "$cmd: give a or b"
	ns=$(ns_of "$1")
	addr=$([[ ${1,,} == a ]] && echo "$TB_ADDR_A" || echo "$TB_ADDR_B")
	if [[ $cmd == cut ]]; then
		ip -n "$ns" addr del "$addr/$TB_PLEN" dev "$TB_IF"
	else
		ip -n "$ns" addr add "$addr/$TB_PLEN" dev "$TB_IF"
	fi
	;;
env)
	load
	sed 's/^/export /' "$conf"
	;;
down)
	[[ $(id -u) -eq 0 ]] || die "needs root"
	teardown
	;;
*) die "unknown command '$cmd' (see --help)" ;;
esac
