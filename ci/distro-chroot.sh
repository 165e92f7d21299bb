#!/usr/bin/env bash
# ci/distro-chroot.sh — run rdma-core's own tools over uiw inside another Debian release.
#
#   sudo ci/distro-chroot.sh [--libdir DIR] [--expect-release N] SUITE
#
# SUITE is a Debian suite (trixie: rdma-core 56.1, private ABI 34; sid: rdma-core 65.0,
# private ABI 65). The script
#   1. builds (or reuses) a chroot of SUITE with the distribution's own libibverbs1,
#      ibverbs-providers, ibverbs-utils, perftest and rdmacm-utils (mmdebstrap), cached as
#      $UIW_CHROOT_CACHE/SUITE.tar (default /var/cache/uiw-chroot);
#   2. unpacks it into a temporary directory and copies in uiw's artifacts from DIR
#      (uiw, libuiw_rdmav34.so, libuiw_preload.so, libuiw_rdmacm.so; default target/debug):
#      they are built on the host (Debian 12), and glibc runs them on newer releases;
#   3. enters it in new mount, network and PID namespaces (only a loopback interface, its own
#      /dev, /proc, /sys and /run, nothing left behind when it exits) and there runs, over a
#      published uiw_lo: ibv_devinfo, an ibv_rc_pingpong pair (-g 0), ib_write_bw, ib_read_bw
#      and ib_send_bw pairs (-x 0), and an rping -V pair through uiw's librdmacm drop-in;
#      installs the provider system-wide (uiw install) and runs ibv_devinfo with it;
#      then renames the chroot's libibverbs as a release uiw does not know (v66) and checks
#      that the provider refuses it, saying why.
# With --expect-release N it also checks that the chroot's libibverbs is rdma-core vN and
# that the provider registered with that release's private ABI.
#
# Environment:
#   UIW_CHROOT_CACHE=DIR     where SUITE.tar is kept (default /var/cache/uiw-chroot)
#   UIW_CHROOT_REBUILD=1     build the chroot anew even if cached (CI=true implies it)
#   UIW_CHROOT_MIRROR=URL    the Debian archive (default: the one apt on this host uses)
# Needs root, mmdebstrap and unshare (util-linux). Exits non-zero, saying what failed, if
# anything does.
set -euo pipefail

libdir=
expect=
while [[ $# -gt 0 ]]; do
	case $1 in
	--libdir) libdir=$2; shift 2 ;;
	--expect-release) expect=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	-*) echo "distro-chroot: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
suite=${1:?usage: distro-chroot.sh [--libdir DIR] [--expect-release N] SUITE}
[[ $suite =~ ^[a-z]+$ ]] || { echo "distro-chroot: bad suite name: $suite" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
libdir=${libdir:-$here/target/debug}

say() { printf 'distro-chroot[%s]: %s\n' "$suite" "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "needs root (mmdebstrap, chroot, namespaces)"
command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
command -v unshare >/dev/null || die "unshare (util-linux) is not installed"
for f in uiw libuiw_rdmav34.so libuiw_preload.so libuiw_rdmacm.so; do
	[[ -f $libdir/$f ]] || die "$libdir/$f is not built (cargo build --workspace)"
done

cache=${UIW_CHROOT_CACHE:-/var/cache/uiw-chroot}
tarball=$cache/$suite.tar
mkdir -p "$cache"
if [[ ${UIW_CHROOT_REBUILD:-0} == 1 || ${CI:-} == true || ! -s $tarball ]]; then
	mirror=${UIW_CHROOT_MIRROR:-}
	if [[ -z $mirror ]]; then
		# The archive this host's apt uses (deb822 or one-line sources).
		mirror=$(grep -rhoE '^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)https?://[^[:space:]]+/debian/?' \
			/etc/apt/sources.list.d/ /etc/apt/sources.list 2>/dev/null | head -n1 | grep -oE 'https?://[^[:space:]]+' || true)
	fi
	[[ -n $mirror ]] || die "no Debian mirror found in /etc/apt/sources.list*; set UIW_CHROOT_MIRROR"
	say "building the $suite chroot with mmdebstrap ($mirror)"
	start=$SECONDS
	# Check-Valid-Until: the archive may serve a snapshot whose (unstable) Release file has
	# expired.
	if ! mmdebstrap --variant=apt --format=tar \
		--include=libibverbs1,ibverbs-providers,ibverbs-utils,perftest,rdmacm-utils,iproute2,procps \
		--aptopt='Acquire::Check-Valid-Until "false"' \
		--aptopt='Acquire::Check-Date "false"' \
		"$suite" "$tarball.tmp" "$mirror" >"$cache/$suite.log" 2>&1; then
		tail -n 30 "$cache/$suite.log" >&2
		rm -f "$tarball.tmp"
		die "mmdebstrap $suite failed (log: $cache/$suite.log)"
	fi
	mv "$tarball.tmp" "$tarball"
	say "chroot built in $((SECONDS - start)) s ($(du -h "$tarball" | cut -f1))"
else
	say "reusing $tarball (UIW_CHROOT_REBUILD=1 builds it anew)"
fi

work=$(mktemp -d /var/tmp/uiw-chroot-"$suite".XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT
root=$work/root
mkdir "$root"
tar -C "$root" -xf "$tarball"
mkdir -p "$root/opt/uiw"
cp "$libdir"/{uiw,libuiw_rdmav34.so,libuiw_preload.so,libuiw_rdmacm.so} "$root/opt/uiw/"

# What runs inside: every step prints what it runs; any failure stops it with the output.
cat >"$root/uiw-distro-test.sh" <<'INNER'
#!/bin/bash
set -euo pipefail
suite=$1 expect=$2
export PATH=/opt/uiw:/usr/sbin:/usr/bin:/sbin:/bin UIW_STATE_DIR=/run/uiw
log=/tmp/uiw-test
mkdir -p $log
fail() {
	echo "distro-chroot[$suite]: FAILED: $*" >&2
	for f in $log/*; do [[ -s $f ]] && { echo "--- $f" >&2; tail -n 25 "$f" >&2; }; done
	exit 1
}
wait_listen() { # port pid
	for _ in $(seq 1 200); do
		ss -Htln "sport = :$1" | grep -q . && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}
# pair NAME PORT SERVER-ARGS... -- CLIENT-ARGS...: server in the background, then the client;
# both must exit 0 within 60 s.
pair() {
	local name=$1 port=$2; shift 2
	local s=() c=()
	while [[ $1 != -- ]]; do s+=("$1"); shift; done; shift
	c=("$@")
	echo "+ uiw run -- ${s[*]}  &&  uiw run -- ${c[*]}" >&2
	timeout 60 uiw run -- "${s[@]}" >$log/$name.server 2>&1 &
	local spid=$!
	wait_listen "$port" $spid || fail "$name: the server did not listen on port $port"
	timeout 60 uiw run -- "${c[@]}" >$log/$name.client 2>&1 || fail "$name: the client failed ($?)"
	wait $spid || fail "$name: the server failed ($?)"
}

lib=$(readlink -f /usr/lib/x86_64-linux-gnu/libibverbs.so.1)
echo "distro-chroot[$suite]: $(. /etc/os-release; echo "$PRETTY_NAME"), $lib," \
	"rdma-core $(dpkg-query -W -f '${Version}' libibverbs1), perftest $(dpkg-query -W -f '${Version}' perftest)" >&2
release=$(basename "$lib" | cut -d. -f5)
if [[ -n $expect && $release != "$expect" ]]; then
	fail "expected libibverbs from rdma-core v$expect, found $lib"
fi

ip link set lo up
uiw up >$log/up 2>&1 || fail "uiw up"
echo "+ uiw run -- ibv_devinfo -v -d uiw_lo" >&2
UIW_DEBUG=1 uiw run -- ibv_devinfo -v -d uiw_lo >$log/devinfo 2>&1 || fail "ibv_devinfo"
grep -q "registering with rdma-core v$release (IBVERBS_PRIVATE_" $log/devinfo ||
	fail "the provider did not say it registered with rdma-core v$release"
grep "registering with" $log/devinfo >&2
for want in "hca_id:	uiw_lo" "transport:			iWARP (1)" "state:			PORT_ACTIVE (4)" \
	"GID[  0]:		0000:0000:0000:0000:0000:ffff:7f00:0001"; do
	grep -qF "$want" $log/devinfo || fail "ibv_devinfo does not show '$want'"
done

pair rc_pingpong 18515 ibv_rc_pingpong -d uiw_lo -g 0 -p 18515 -n 200 -- \
	ibv_rc_pingpong -d uiw_lo -g 0 -p 18515 -n 200 127.0.0.1
grep -q "bytes in .* seconds" $log/rc_pingpong.client || fail "ibv_rc_pingpong printed no result"
grep -h "bytes in" $log/rc_pingpong.client >&2

for t in write read send; do
	pair ib_${t}_bw 18516 ib_${t}_bw -d uiw_lo -x 0 -p 18516 -n 2000 -- \
		ib_${t}_bw -d uiw_lo -x 0 -p 18516 -n 2000 127.0.0.1
	# The results table: "#bytes #iterations BW peak ..." then one line of figures.
	line=$(grep -A1 '#bytes' $log/ib_${t}_bw.client | tail -n1)
	[[ $line =~ ^[[:space:]]*65536[[:space:]]+2000[[:space:]] ]] || fail "ib_${t}_bw printed no result line"
	echo "ib_${t}_bw: $line" >&2
done

# rdma-core v57+'s rping polls its CM channel in a thread and joins it after rdma_destroy_id:
# the drop-in must not purge an event that thread already saw (a hang here; see
# rdmacm/src/cm.rs, destroy).
pair rping 18517 rping -s -a 127.0.0.1 -p 18517 -V -C 20 -- rping -c -a 127.0.0.1 -p 18517 -V -C 20

# Installed system-wide instead: libibverbs finds the provider in its own directory under the
# name of its private ABI, without RDMAV_DRIVERS.
echo "+ uiw install; uiw run -- ibv_devinfo -d uiw_lo; uiw uninstall" >&2
pdir=/usr/lib/x86_64-linux-gnu/libibverbs
pabi=$(ls $pdir | sed -n 's/^lib.*-rdmav\([0-9]*\)\.so$/\1/p' | head -n1)
uiw install >$log/install 2>&1 || fail "uiw install"
[[ -e $pdir/libuiw-rdmav$pabi.so ]] || fail "uiw install did not install $pdir/libuiw-rdmav$pabi.so"
! uiw env | grep -q RDMAV_DRIVERS || fail "uiw env still sets RDMAV_DRIVERS after uiw install"
uiw run -- ibv_devinfo -d uiw_lo >$log/devinfo3 2>&1 || fail "ibv_devinfo with the installed provider"
grep -qF "hca_id:	uiw_lo" $log/devinfo3 || fail "ibv_devinfo does not list uiw_lo with the installed provider"
uiw uninstall >>$log/install 2>&1 || fail "uiw uninstall"
! ls $pdir | grep -q uiw || fail "uiw uninstall left files in $pdir"

# A libibverbs uiw does not know (the same library, named as rdma-core v66 would name it) is
# refused with a message, and the tools then see no uiw device rather than corrupt memory.
dir=$(dirname "$lib")
cp "$lib" "$dir/libibverbs.so.1.18.66.0"
ln -sfn libibverbs.so.1.18.66.0 "$dir/libibverbs.so.1"
echo "+ uiw run -- ibv_devinfo -d uiw_lo   (libibverbs renamed to v66)" >&2
if uiw run -- ibv_devinfo -d uiw_lo >$log/refuse 2>&1; then
	fail "ibv_devinfo found uiw_lo through a libibverbs uiw does not know"
fi
ln -sfn "$(basename "$lib")" "$dir/libibverbs.so.1"
grep -q "uiw: provider not registered: .*libibverbs.so.1.18.66.0 is rdma-core v66, but uiw knows the private provider ABI only of v36..v65" $log/refuse ||
	fail "no clear refusal for an unknown libibverbs"
grep "provider not registered" $log/refuse >&2
uiw run -- ibv_devinfo -d uiw_lo >$log/devinfo2 2>&1 || fail "ibv_devinfo after restoring libibverbs"

uiw down >>$log/up 2>&1 || fail "uiw down"
echo "distro-chroot[$suite]: all passed" >&2
INNER
chmod +x "$root/uiw-distro-test.sh"

say "running the tools over uiw in the $suite chroot"
# New mount, network and PID namespaces: the mounts and the loopback interface vanish with
# the last process; --kill-child ends every process left if the test is interrupted.
status=0
unshare --mount --net --pid --fork --kill-child --propagation private -- bash -euc '
	root=$1 suite=$2 expect=$3
	mount -t tmpfs -o mode=755 uiw-dev "$root/dev"
	for n in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
		IFS=: read -r name maj min <<<"$n"
		mknod -m 666 "$root/dev/$name" c "$maj" "$min"
	done
	mkdir "$root/dev/shm" "$root/dev/pts"
	mount -t tmpfs -o mode=1777 uiw-shm "$root/dev/shm"
	ln -s /proc/self/fd "$root/dev/fd"
	mount -t proc proc "$root/proc"
	mount -t sysfs sysfs "$root/sys"
	mount -t tmpfs uiw-run "$root/run"
	mount -t tmpfs uiw-tmp "$root/tmp"
	exec chroot "$root" /uiw-distro-test.sh "$suite" "$expect"
' bash "$root" "$suite" "$expect" || status=$?
[[ $status -eq 0 ]] || die "the tools failed in the $suite chroot (status $status)"
say "passed"
