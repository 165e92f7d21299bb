#!/usr/bin/env bash
# ci/deb-test.sh — the Debian package, end to end, on a clean Debian 12 root:
#
#   sudo ci/deb-test.sh [--keep]
#
# 1. packaging/build-deb.sh (CARGO_PROFILE as for ci/test.sh, default dev; the
#    build must exist: ci/test.sh builds first)
# 2. mmdebstrap a bookworm chroot with the standard tools (ibverbs-utils,
#    perftest, rdmacm-utils, man-db, init-system-helpers), proc/sys/devpts/
#    /dev/shm and a tmpfs /run mounted; the host's network (free ports only)
# 3. records every path of the chroot (and the checksum of every file in /etc
#    and of the system librdmacm) — the "before" list
# 4. apt install ./uiw_*.deb; man uiw; as an unprivileged user, rootless uiw up
#    and uiw run on the installed pieces; uiw up --config /etc/uiw/devices (what
#    uiw.service runs); uiw env uses the installed pieces; `uiw run -- ib_write_bw`
#    pair and `uiw run -- rping -V` pair, each process checked to have mapped the
#    installed provider (and rping the private librdmacm drop-in)
# 5. apt purge uiw; the "after" list must equal the "before" list, and
#    `dpkg -S` must know none of the package's paths
# The host is never touched: everything happens in the chroot, which is
# unmounted and removed at the end, also on failure (--keep leaves it).
# Takes about 2 minutes (mmdebstrap and apt dominate).
set -euo pipefail

keep=0
[[ "${1:-}" != --keep ]] || keep=1
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ $(id -u) -ne 0 ]]; then
	echo "deb-test: needs root (mmdebstrap, chroot, mounts)" >&2
	exit 1
fi
command -v mmdebstrap >/dev/null || { echo "deb-test: needs mmdebstrap (ci/packages.txt)" >&2; exit 1; }

start=$(date +%s)
step() { printf '\n==> [deb-test %4ss] %s\n' "$(($(date +%s) - start))" "$*" >&2; }

step "build the package (packaging/build-deb.sh, CARGO_PROFILE=${CARGO_PROFILE:-dev})"
deb=$(CARGO_PROFILE=${CARGO_PROFILE:-dev} UIW_SKIP_BUILD=${UIW_SKIP_BUILD:-1} \
	"$src/packaging/build-deb.sh" "$(mktemp -d /tmp/uiw-deb.XXXXXX)")
ls -l "$deb" >&2

mirror=${UIW_CLEAN_ROOT_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /tmp/uiw-deb-root.XXXXXX)
mounts=()
cleanup() {
	local i
	for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
		umount -l "${mounts[i]}" 2>/dev/null || true
	done
	if [[ $keep == 1 ]]; then
		echo "deb-test: left $root" >&2
	elif findmnt -rn -o TARGET | grep -q "^$root"; then
		echo "deb-test: something is still mounted under $root; not removing it" >&2
	else
		rm -rf --one-file-system "$root"
	fi
	rm -rf "$(dirname "$deb")"
}
trap cleanup EXIT
mnt() { mount "$@"; mounts+=("${!#}"); }

step "mmdebstrap bookworm -> $root"
mmdebstrap --variant=minbase \
	--include=ibverbs-utils,perftest,rdmacm-utils,man-db,init-system-helpers,iproute2 \
	bookworm "$root" "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
	"deb ${mirror%/debian}/debian-security bookworm-security main" 2>&1 | grep -v '^I: ' >&2 || true
[[ -x "$root/usr/bin/ib_write_bw" ]] || { echo "deb-test: mmdebstrap failed" >&2; exit 1; }
mnt -t proc proc "$root/proc"
mnt -t sysfs sysfs "$root/sys"
mnt -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
mnt -t tmpfs tmpfs "$root/dev/shm"
mnt -t tmpfs tmpfs "$root/run"
cp "$deb" "$root/root/"
in_root() { chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 bash -c "$1"; }

# Every path (type, mode, owner; symlink targets) and the checksums of /etc and
# of the system's librdmacm: what "the system as it was" means here. apt's and
# dpkg's own bookkeeping, logs and caches, and users' homes (a user's rootless
# state directory is the user's) are not the system's state.
snapshot() {
	in_root '
		cd / && find / /run /dev -xdev \
			\( -path /proc -o -path /sys -o -path /dev/pts -o -path /dev/shm -o -path /tmp \
			   -o -path /var/lib/apt -o -path /var/cache -o -path /var/log \
			   -o -path /var/lib/dpkg -o -path /root -o -path /home \) -prune \
			-o -printf "%p %y %m %u:%g %l\n" | sort -u
		find /etc /usr/lib/x86_64-linux-gnu -xdev -type f \( -path "/etc/*" -o -name "librdmacm*" \) \
			-exec md5sum {} + | sort -k2'
}

in_root 'useradd -m uiwtest'
step "the system before: $(snapshot | tee "$root.before" | wc -l) entries"

step "apt install ./$(basename "$deb")"
in_root "cd /root && apt-get install -y --no-install-recommends ./$(basename "$deb")" >&2

fail=0
check() { # check NAME COMMAND...
	local name=$1
	shift
	if "$@"; then
		echo "ok - $name"
	else
		echo "not ok - $name"
		fail=$((fail + 1))
	fi
}
pass_count() { grep -c '^ok - ' "$root.results" || true; }

{
	# man -l renders it; groff -ww names any undefined macro, bad escape or character.
	check "man -l packaging/debian/uiw.8 renders, groff -ww finds nothing" \
		bash -c "man -l '$src/packaging/debian/uiw.8' 2>/dev/null | grep -q 'publish, inspect and use uiw' && out=\$(groff -k -man -Tutf8 -ww -z '$src/packaging/debian/uiw.8' 2>&1); echo \"\$out\"; test -z \"\$out\""
	check "the unit is enabled (multi-user.target.wants)" \
		test -L "$root/etc/systemd/system/multi-user.target.wants/uiw.service"
	check "man uiw renders uiw(8)" in_root 'man -P cat uiw 2>/dev/null | grep -q "publish, inspect and use uiw"'
	# What uiw.service runs at boot (there is no systemd in a chroot).
	exec_start=$(sed -n 's/^ExecStart=//p' "$root/lib/systemd/system/uiw.service")
	check "ExecStart of uiw.service ($exec_start) publishes uiw_lo" \
		in_root "$exec_start && uiw show | grep -q '^link uiw_lo/1 state ACTIVE'"
	env_out=$(in_root 'uiw env')
	echo "$env_out" | sed 's/^/    /'
	check "uiw env: no RDMAV_DRIVERS (installed provider)" bash -c "! grep -q RDMAV_DRIVERS <<<\"\$0\"" "$env_out"
	check "uiw env: the shim is the installed one" \
		in_root 'test "$(readlink -f /run/uiw/lib/libuiw_preload.so)" = /usr/lib/x86_64-linux-gnu/uiw/libuiw_preload.so'
	check "uiw env: LD_LIBRARY_PATH leads to the installed drop-in" \
		in_root 'eval "$(uiw env)"; test "$(readlink -f "${LD_LIBRARY_PATH%%:*}/librdmacm.so.1")" = /usr/lib/x86_64-linux-gnu/uiw/rdmacm/librdmacm.so.1'
	check "the system librdmacm is still the system's" \
		in_root 'test "$(readlink -f /usr/lib/x86_64-linux-gnu/librdmacm.so.1)" != /usr/lib/x86_64-linux-gnu/uiw/rdmacm/librdmacm.so.1 && dpkg -S /usr/lib/x86_64-linux-gnu/librdmacm.so.1 | grep -q "^librdmacm1"'
	check "uiw run -- ibv_devinfo -d uiw_lo" in_root 'uiw run -- ibv_devinfo -d uiw_lo | grep -q "transport:.*iWARP"'
	# An unprivileged user with the package: rootless uiw up into ~/.local/state/uiw,
	# and uiw run finds the installed provider and shim too.
	check "as a user: uiw up (rootless) and uiw run -- ibv_devinfo on the installed pieces" \
		in_root 'runuser -u uiwtest -- env HOME=/home/uiwtest sh -c "cd && uiw up >/dev/null && uiw run -- ibv_devinfo -d uiw_lo | grep -q \"transport:.*iWARP\" && uiw env | grep -q libuiw_preload.so && ! uiw env | grep -q RDMAV_DRIVERS; s=\$?; uiw down >/dev/null; exit \$s"'
} >>"$root.results" 2>&1

free_port() {
	local p
	for _ in $(seq 200); do
		p=$((30000 + RANDOM % 20000))
		ss -Htan "( sport = :$p or dport = :$p )" | grep -q . || { echo "$p"; return; }
	done
	echo 18515
}

# pair NAME NEED_LIB SERVER_CMD CLIENT_CMD: server in the background, client
# when the server listens on $port; both must exit 0, and the server process
# must have mapped NEED_LIB (the installed pieces, not a build tree's).
pair() {
	local name=$1 need=$2 scmd=$3 ccmd=$4 spid maps="" st=0 sst=0
	in_root "exec timeout 60 $scmd" >"$root.server.log" 2>&1 &
	spid=$!
	for _ in $(seq 100); do
		ss -Htln "sport = :$port" | grep -q . && break
		sleep 0.1
	done
	# The server program itself (uiw run execs it with these arguments; the
	# `timeout` around it has them too, after its own). /proc directly: a clean
	# root has no procps.
	local cpid="" want=${scmd#uiw run -- } d cmd
	for d in /proc/[0-9]*; do
		cmd=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) || continue
		[[ "$cmd" == "$want "* ]] && cpid=${d#/proc/}
	done
	for lib in $need; do
		if [[ -n "$cpid" ]] && grep -q "$lib" "/proc/$cpid/maps" 2>/dev/null; then
			maps="$maps ok:$(basename "$lib")"
		else
			maps="$maps MISSING:$lib"
		fi
	done
	in_root "timeout 60 $ccmd" >"$root.client.log" 2>&1 || st=$?
	wait "$spid" || sst=$?
	sed 's/^/    server: /' "$root.server.log" | tail -8
	sed 's/^/    client: /' "$root.client.log" | tail -8
	echo "    mapped:$maps"
	check "$name (client exit $st, server exit $sst)" test "$st" = 0 -a "$sst" = 0
	check "$name: the server ran on the installed libraries" bash -c "! grep -q MISSING <<<\"\$0\"" "$maps"
}

{
	port=$(free_port)
	pair "uiw run -- ib_write_bw pair" "/usr/lib/x86_64-linux-gnu/libibverbs/libuiw-rdmav34.so /usr/lib/x86_64-linux-gnu/uiw/libuiw_preload.so" \
		"uiw run -- ib_write_bw -d uiw_lo -x 0 -F -s 65536 -n 200 -p $port" \
		"uiw run -- ib_write_bw -d uiw_lo -x 0 -F -s 65536 -n 200 -p $port 127.0.0.1"
	port=$(free_port)
	pair "uiw run -- rping -V pair" "/usr/lib/x86_64-linux-gnu/uiw/rdmacm/librdmacm.so.1 /usr/lib/x86_64-linux-gnu/libibverbs/libuiw-rdmav34.so" \
		"uiw run -- rping -s -a 127.0.0.1 -p $port -V -C 10" \
		"uiw run -- rping -c -a 127.0.0.1 -p $port -V -C 10"
} >>"$root.results" 2>&1

step "apt purge uiw"
in_root 'apt-get purge -y uiw' >&2
snapshot >"$root.after"
{
	if diff -u "$root.before" "$root.after" >"$root.diff"; then
		echo "ok - apt purge leaves the system as it was ($(wc -l <"$root.before") entries compared)"
	else
		echo "not ok - apt purge leaves the system as it was:"
		sed 's/^/    /' "$root.diff" | head -40
		fail=$((fail + 1))
	fi
	left=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|; s|/$||' | grep -v '^$' |
		while read -r p; do in_root "dpkg -S '$p' 2>/dev/null | grep -E '(^|, )uiw(, |:)'" || true; done)
	check "dpkg -S knows none of the package's paths" test -z "$left"
} >>"$root.results" 2>&1

cat "$root.results"
passed=$(pass_count)
failed=$(grep -c '^not ok - ' "$root.results" || true)
rm -f "$root.results" "$root.before" "$root.after" "$root.diff" "$root.server.log" "$root.client.log"
step "deb-test: $passed passed, $failed failed"
[[ $failed -eq 0 && $passed -gt 0 ]]
