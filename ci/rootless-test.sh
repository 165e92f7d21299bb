#!/usr/bin/env bash
# ci/rootless-test.sh — uiw as an unprivileged user, with no /dev/infiniband at all.
#
#   sudo ci/rootless-test.sh LIBDIR PORT1 PORT2 PORT3
#
# LIBDIR holds the built `uiw`, libuiw_rdmav34.so, libuiw_preload.so and
# (optionally) libuiw_rdmacm.so; PORT1..3 are free TCP ports (perftest, rping,
# ibv_rc_pingpong). Run as root: it creates the user `uiw-rootless` (if
# missing), copies LIBDIR somewhere that user can read, gives it a fresh HOME,
# then in a private mount
# namespace hides /dev/infiniband behind an empty tmpfs and, as that user with
# no capabilities (setpriv), runs:
#   uiw up                       (rootless: state dir under ~/.local/state)
#   uiw run -- ibv_devinfo       (libibverbs opens the absent uverbs node)
#   uiw run -- ls/python3 listing /sys/class/infiniband (the published tree)
#   uiw run -- lstopo-no-graphics (hwloc finds uiw_lo as an OpenFabrics device)
#   an ib_write_bw pair, an rping -V pair, an ibv_rc_pingpong pair
#   uiw down
# Prints what each step printed and exits non-zero on the first failure.
# examples/tests/rootless.rs runs it (cargo test).
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
	echo "rootless-test.sh: run as root (it creates a user and a mount namespace, then drops to that user)" >&2
	exit 2
fi
if [[ $# -ne 4 ]]; then
	echo "usage: $0 LIBDIR PORT1 PORT2 PORT3" >&2
	exit 2
fi
libdir=$1 p1=$2 p2=$3 p3=$4
user=uiw-rootless

if ! id -u "$user" >/dev/null 2>&1; then
	useradd --create-home --shell /bin/bash "$user"
fi
work=$(mktemp -d /tmp/uiw-rootless.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
# A fresh HOME per run (the default state dir is under it), so concurrent runs never
# share a state directory.
home=$work/home
mkdir -p "$home"
chown "$user:" "$home"
for f in uiw libuiw_rdmav34.so libuiw_preload.so libuiw_rdmacm.so; do
	[[ -e $libdir/$f ]] && cp "$libdir/$f" "$work/bin/"
done
chmod -R a+rX "$work"

# The script the user runs. Each step is echoed; any failure stops it.
cat >"$work/steps.sh" <<'EOS'
set -euo pipefail
cd "$HOME"
uiw() { "$BIN/uiw" "$@"; }
step() { printf '\n--- %s\n' "$*"; }
to() { timeout --kill-after=5 60 "$@"; }

step "whoami: $(id -un) uid $(id -u); CapEff $(awk '/CapEff/{print $2}' /proc/self/status)"
[[ $(id -u) -ne 0 ]] || { echo "still root"; exit 1; }
step "ls -A /dev/infiniband (empty: no node for uiw)"
ls -A /dev/infiniband
[[ -z $(ls -A /dev/infiniband) ]]

step "uiw down; uiw up"
uiw down
uiw up 2>&1 | tee up.out
grep -q 'rootless mode' up.out
state=${XDG_RUNTIME_DIR:-$HOME/.local/state}/uiw
[[ -d $state/sysfs ]] || [[ -d $HOME/.local/state/uiw/sysfs ]]

step "uiw run -- ibv_devinfo -d uiw_lo"
to "$BIN/uiw" run -- ibv_devinfo -d uiw_lo | tee devinfo.out
grep -q 'PORT_ACTIVE' devinfo.out

step "uiw run -- ls -l /sys/class/infiniband /sys/class/infiniband_verbs"
to "$BIN/uiw" run -- ls -l /sys/class/infiniband /sys/class/infiniband_verbs | tee ls.out
grep -q 'uiw_lo' ls.out
grep -q 'uverbs' ls.out

step "uiw run -- ls /sys/class/infiniband/uiw_lo/device/net/ (how rdma-core v44's tests/base.py finds the netdev)"
[[ $(to "$BIN/uiw" run -- ls /sys/class/infiniband/uiw_lo/device/net/) == lo ]]

step "uiw run -- python3: os.listdir, open, stat, as rdma-core's tests/base.py reads sysfs; ls device/net"
if command -v python3 >/dev/null; then
	to "$BIN/uiw" run -- python3 - <<'EOP'
import os
devs = os.listdir('/sys/class/infiniband')
print('devices', devs)
assert 'uiw_lo' in devs, devs
d = '/sys/class/infiniband/uiw_lo'
print('node_type', open(d + '/node_type').read().strip())
ndevs = os.listdir(d + '/ports/1/gid_attrs/ndevs')
print('ndevs', ndevs, open(d + '/ports/1/gid_attrs/ndevs/0').read().strip())
assert open(d + '/ports/1/gid_attrs/ndevs/0').read().strip() == 'lo'
uv = [u for u in os.listdir('/sys/class/infiniband_verbs') if u.startswith('uverbs')]
print('uverbs', uv)
st = os.stat('/dev/infiniband/' + uv[0])
assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3), st
# realpath(3), as UCX resolves a device's sysfs path
import ctypes
libc = ctypes.CDLL(None)
libc.realpath.restype = ctypes.c_char_p
rp = libc.realpath(d.encode(), ctypes.create_string_buffer(4096)).decode()
print('realpath', rp)
assert rp.endswith('/sysfs/class/infiniband/uiw_lo') and os.path.exists(rp + '/node_type'), rp
EOP
else
	echo "python3 not installed: listed with ls only"
fi

step "hwloc: HWLOC_VIRTUAL_LINUX_OSDEV=1 uiw run -- lstopo-no-graphics --whole-io (software devices are virtual, as siw's)"
HWLOC_VIRTUAL_LINUX_OSDEV=1 to "$BIN/uiw" run -- lstopo-no-graphics --whole-io | tee lstopo.out | grep -i openfabrics
grep -q 'OpenFabrics "uiw_lo"' lstopo.out

step "ib_write_bw pair (port $P1)"
to "$BIN/uiw" run -- ib_write_bw -d uiw_lo -x 0 -n 200 -s 65536 -p "$P1" >wbs.out 2>&1 &
srv=$!
sleep 1
to "$BIN/uiw" run -- ib_write_bw -d uiw_lo -x 0 -n 200 -s 65536 -p "$P1" 127.0.0.1 2>&1 | tee wbc.out
wait "$srv" || { cat wbs.out; exit 1; }
grep -Eq '^ *65536 +200 ' wbc.out

step "uiw stat -a (the pair's counters, from the user's own state directory)"
"$BIN/uiw" stat -a | tee stat.out
grep -Eq 'processes 2 tx_bytes 13107200 rx_bytes 13107200 tx_msgs 200 rx_msgs 200 ' stat.out
"$BIN/uiw" stat -a -j >stat.json
python3 -c '
import json, sys
procs = json.load(open("stat.json"))
assert len(procs) == 2 and all(p["ifname"] == "uiw_lo" and p["exited"] for p in procs), procs
assert sorted(p["counters"]["tx_msgs"] for p in procs) == [0, 200], procs
assert all(q["destroyed"] for p in procs for q in p["qps"]), procs
print("uiw stat -j: ok")'

step "rping -V pair (port $P2)"
to "$BIN/uiw" run -- rping -s -a 127.0.0.1 -p "$P2" -C 5 -V >rps.out 2>&1 &
srv=$!
sleep 1
to "$BIN/uiw" run -- rping -c -a 127.0.0.1 -p "$P2" -C 5 -V 2>&1 | tee rpc.out
wait "$srv" || { cat rps.out; exit 1; }
cat rps.out

step "ibv_rc_pingpong -e pair (port $P3; completion channel through the shim)"
to "$BIN/uiw" run -- ibv_rc_pingpong -d uiw_lo -g 0 -e -n 50 -p "$P3" >pps.out 2>&1 &
srv=$!
sleep 1
to "$BIN/uiw" run -- ibv_rc_pingpong -d uiw_lo -g 0 -e -n 50 -p "$P3" 127.0.0.1 2>&1 | tee ppc.out
wait "$srv" || { cat pps.out; exit 1; }
grep -q '50 iters' ppc.out

step "uiw down"
uiw down
echo ROOTLESS-OK
EOS
chmod a+r "$work/steps.sh"

# A private mount namespace: an empty tmpfs hides /dev/infiniband (whatever nodes other
# users or tests created), then the user runs without any capability.
status=0
unshare --mount --propagation private bash -c '
	mkdir -p /dev/infiniband 2>/dev/null || true
	mount -t tmpfs -o mode=0755,size=64k uiw-rootless /dev/infiniband
	exec setpriv --reuid="$1" --regid="$1" --init-groups --inh-caps=-all --bounding-set=-all \
		env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$2" USER="$1" LANG=C.UTF-8 \
		BIN="$3/bin" P1="$4" P2="$5" P3="$6" bash "$3/steps.sh"
' rootless-test "$user" "$home" "$work" "$p1" "$p2" "$p3" || status=$?
exit $status
