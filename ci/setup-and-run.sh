#!/usr/bin/env bash
# ci/setup-and-run.sh — the README's first command: on a fresh Debian 12
# machine, install what uiw needs, build it, publish the loopback device
# uiw_lo and run standard, unmodified rdma-core tools against it.
#
#   ./ci/setup-and-run.sh          as root, or as a user with sudo (it uses sudo
#                                  only for apt-get and `uiw up`; it builds as you)
#   sudo ./ci/setup-and-run.sh     also works: it builds as $SUDO_USER, with that
#                                  user's ~/.cargo/bin toolchain (sudo resets PATH)
#   UIW_ROOTLESS=1 ./ci/setup-and-run.sh
#                                  as a user, without root at all (also chosen
#                                  when there is no sudo): the packages must be
#                                  installed already; uiw up publishes in
#                                  rootless mode (no /dev/infiniband node)
#
# What it does:
#   1. installs the Debian packages of ci/packages.txt that are missing
#      (apt-get; the same list .ci/run installs)
#   2. finds a Rust toolchain >= the workspace's rust-version, or says exactly
#      how to install one and stops
#   3. cargo build --workspace           (uiw, libuiw-rdmav34.so, the shim,
#                                         the librdmacm drop-in)
#   4. uiw up                            publish uiw_lo (127.0.0.1); creating
#                                        /dev/infiniband/uverbsN needs root once
#   5. uiw run -- ibv_devices
#      uiw run -- ibv_devinfo -v -d uiw_lo
#   6. ibv_rc_pingpong server and client over uiw_lo (RC Send/Recv through
#      the uiw data path, on 127.0.0.1, GID index 0), then a short
#      ib_write_bw pair (perftest, RDMA Write, -x 0: no rdma_cm)
#
# Environment:
#   CARGO_PROFILE=release   build and use the release profile (default: dev)
#   UIW_SKIP_APT=1          do not install packages (step 1)
#   RUN_PINGPONG=0          skip step 6 (default: run it)
#   PINGPONG_EVENTS=1       ...and ibv_rc_pingpong once more with -e
#                           (completion channel)
#   PINGPONG_PORT=N         TCP port for the tools' own exchange (default: a
#                           free one)
#   UIW_DOWN_AFTER=1        take the device down at the end (default: leave it
#                           up so you can go on with `uiw run -- <your tool>`)
#   UIW_STATE_DIR           where uiw keeps the published tree (uiw's default
#                           if unset)
set -euo pipefail

# Step 4 runs by default (RUN_PINGPONG=0 skips it): the data path works.
RUN_PINGPONG_DEFAULT=1

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

profile_args=()
profile_dir=debug
if [[ "${CARGO_PROFILE:-dev}" == release ]]; then
	profile_args=(--release)
	profile_dir=release
fi
target_dir=${CARGO_TARGET_DIR:-$root/target}
uiw=$target_dir/$profile_dir/uiw

step() { printf '\n==> %s\n' "$*" >&2; }

# Who builds: the invoking user, also under sudo (a root-owned target/ would
# get in that user's way later).
build_user=""
if [[ $(id -u) -eq 0 && -n "${SUDO_USER:-}" && "${SUDO_USER}" != root ]]; then
	build_user=$SUDO_USER
fi

if [[ "${UIW_SKIP_APT:-0}" != 1 ]]; then
	step "Debian packages (ci/packages.txt)"
	bash ci/apt-packages.sh
fi

if [[ "${UIW_SKIP_BUILD:-0}" != 1 ]]; then
	step "Rust toolchain"
	# shellcheck source=ci/rust-toolchain.sh
	. ci/rust-toolchain.sh
	uiw_find_cargo "${build_user:-$(id -un)}"
	step "cargo build --workspace ${profile_args[*]}"
	if [[ -n "$build_user" ]]; then
		home=$(getent passwd "$build_user" | cut -d: -f6)
		runuser -u "$build_user" -- env "HOME=$home" "PATH=$PATH" \
			${RUSTUP_HOME:+"RUSTUP_HOME=$RUSTUP_HOME"} ${CARGO_HOME:+"CARGO_HOME=$CARGO_HOME"} \
			${CARGO_TARGET_DIR:+"CARGO_TARGET_DIR=$CARGO_TARGET_DIR"} \
			cargo build --workspace "${profile_args[@]}"
	else
		cargo build --workspace "${profile_args[@]}"
	fi
fi
if [[ ! -x "$uiw" ]]; then
	echo "setup-and-run: $uiw was not built" >&2
	exit 1
fi

if [[ $(id -u) -ne 0 && "${UIW_ROOTLESS:-0}" != 1 ]] && ! command -v sudo >/dev/null; then
	# No way to root: publish in rootless mode (uiw up as this user: no
	# /dev/infiniband node; the shim that uiw run preloads stands in for it).
	step "not root and no sudo: publishing in rootless mode"
	export UIW_ROOTLESS=1
fi
if [[ $(id -u) -ne 0 && "${UIW_ROOTLESS:-0}" != 1 ]]; then
	step "re-running as root with sudo (the build is done)"
	exec sudo env "PATH=$PATH" UIW_SKIP_BUILD=1 UIW_SKIP_APT=1 \
		"CARGO_PROFILE=${CARGO_PROFILE:-dev}" "CARGO_TARGET_DIR=$target_dir" \
		"RUN_PINGPONG=${RUN_PINGPONG:-}" "PINGPONG_EVENTS=${PINGPONG_EVENTS:-}" \
		"PINGPONG_PORT=${PINGPONG_PORT:-}" "UIW_DOWN_AFTER=${UIW_DOWN_AFTER:-}" \
		${UIW_STATE_DIR:+"UIW_STATE_DIR=$UIW_STATE_DIR"} \
		bash "$0" "$@"
fi

if [[ "${UIW_DOWN_AFTER:-0}" == 1 ]]; then
	trap '"$uiw" down || true' EXIT
fi

step "uiw up"
"$uiw" up

step "uiw run -- ibv_devices"
"$uiw" run -- ibv_devices

step "uiw run -- ibv_devinfo -v -d uiw_lo"
"$uiw" run -- ibv_devinfo -v -d uiw_lo

# Wait until something listens on TCP port $1 (at most ~10 s).
wait_listen() {
	local i
	for i in $(seq 100); do
		if ss -Htln "sport = :$1" 2>/dev/null | grep -q .; then
			return 0
		fi
		sleep 0.1
	done
	return 1
}

# A TCP port nothing listens on (other programs on this host may be running
# their own pairs: never a fixed one).
free_port() {
	local p i
	for i in $(seq 200); do
		p=$((30000 + RANDOM % 20000))
		if ! ss -Htan "( sport = :$p or dport = :$p )" 2>/dev/null | grep -q .; then
			echo "$p"
			return 0
		fi
	done
	echo 18515
}

# One server/client pair of TOOL: server in the background, client to
# 127.0.0.1, each under a 60 s timeout.
pair() {
	local tool=$1 port=${PINGPONG_PORT:-} spid status=0 sstatus=0
	[[ -n "$port" ]] || port=$(free_port)
	shift
	local args=("$@" -p "$port")

	step "uiw run -- $tool ${args[*]}  (server)  &  ... 127.0.0.1  (client)"
	timeout 60 "$uiw" run -- "$tool" "${args[@]}" &
	spid=$!
	if ! wait_listen "$port"; then
		echo "setup-and-run: the $tool server did not start listening" >&2
		kill "$spid" 2>/dev/null || true
		wait "$spid" 2>/dev/null || true
		return 1
	fi
	timeout 60 "$uiw" run -- "$tool" "${args[@]}" 127.0.0.1 || status=$?
	wait "$spid" || sstatus=$?
	[[ $status -ne 0 ]] || status=$sstatus
	if [[ $status -ne 0 ]]; then
		echo "setup-and-run: $tool $* failed (status $status)" >&2
	fi
	return "$status"
}

# -g 0 / -x 0: iWARP/Ethernet ports need a GID; uiw_lo's GID 0 is
# ::ffff:127.0.0.1. With a GID index and no -R, perftest connects the QPs
# itself (by GID and QPN), as ibv_rc_pingpong does.
pingpong() { pair ibv_rc_pingpong -d uiw_lo -g 0 "$@"; }
write_bw() { pair ib_write_bw -d uiw_lo -x 0 -F "$@"; }

if [[ "${RUN_PINGPONG:-$RUN_PINGPONG_DEFAULT}" == 1 ]]; then
	pingpong
	if [[ "${PINGPONG_EVENTS:-0}" == 1 ]]; then
		pingpong -e
	fi
	if command -v ib_write_bw >/dev/null; then
		write_bw -s 65536 -n 1000
	else
		step "skipping ib_write_bw (perftest is not installed)"
	fi
else
	step "skipping ibv_rc_pingpong and ib_write_bw (RUN_PINGPONG=0)"
fi

step "done"
if [[ "${UIW_DOWN_AFTER:-0}" != 1 ]]; then
	cat >&2 <<EOF
uiw_lo stays published. Try:
    $uiw run -- ibv_devinfo -d uiw_lo
    $uiw run -- bash        # a shell whose programs all see uiw_lo
    $uiw down               # remove it
EOF
fi
