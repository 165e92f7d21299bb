#!/usr/bin/env bash
# ci/clean-root-check.sh — check the README's two commands, verbatim, on a clean
# Debian 12 root that has only git and a Rust toolchain added.
#
#   sudo ci/clean-root-check.sh [--keep] [--only-setup] [--sudo-user]
#
# 1. mmdebstrap --variant=minbase --include=git,ca-certificates bookworm ROOT
# 2. a Rust toolchain: this host's rustup toolchains bind-mounted read-only at
#    ROOT/root/.rustup, its ~/.cargo/bin copied, and `. "$HOME/.cargo/env"` in
#    root's ~/.profile — what rustup's installer leaves behind
#    (and the host's CA bundle as a local CA: the network here may inspect TLS;
#    /etc/hosts and /etc/hostname as the Debian installer writes them)
# 3. git clone of this checkout's HEAD into ROOT/root/uiw
# 4. in `chroot ROOT bash -l` (proc, sysfs, devpts, /dev/shm mounted; the host's
#    network, for apt and crates.io):
#        cd /root/uiw
#        ./ci/setup-and-run.sh      # the README's first command
#        ./ci/test.sh               # the README's second command
# 5. unmounts everything and removes ROOT (--keep leaves it for a look)
#
# --sudo-user: the form the issue reported broken — a user `dev` with the
# toolchain in ~dev/.rustup and ~dev/.cargo (and sudo, password-less, added to
# the root) runs `sudo ./ci/setup-and-run.sh` from a login shell, then
# `./ci/test.sh` (which runs the device tests through `sudo -n`).
#
# Needs root and mmdebstrap (apt-get install mmdebstrap). Takes about 15-25
# minutes on 2 cores (the chroot builds the workspace from scratch), so CI does
# not run it on every submission. --only-setup stops after the first command.
# Environment: UIW_CLEAN_ROOT_MIRROR (default http://deb.debian.org/debian),
# RUSTUP_HOME / CARGO_HOME (default ~/.rustup, ~/.cargo) for the toolchain.
set -euo pipefail

keep=0
only_setup=0
sudo_user=0
for a in "$@"; do
	case $a in
	--keep) keep=1 ;;
	--only-setup) only_setup=1 ;;
	--sudo-user) sudo_user=1 ;;
	*) echo "usage: $0 [--keep] [--only-setup] [--sudo-user]" >&2; exit 2 ;;
	esac
done
include=git,ca-certificates
home=/root
if [[ $sudo_user == 1 ]]; then
	include=$include,sudo
	home=/home/dev
fi

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ $(id -u) -ne 0 ]]; then
	echo "clean-root-check: needs root (mmdebstrap, chroot, mounts)" >&2
	exit 1
fi
command -v mmdebstrap >/dev/null || {
	echo "clean-root-check: needs mmdebstrap: apt-get install mmdebstrap" >&2
	exit 1
}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
[[ -d "$rustup_home/toolchains" && -x "$cargo_home/bin/cargo" ]] || {
	echo "clean-root-check: no rustup toolchain in $rustup_home / $cargo_home" >&2
	exit 1
}

mirror=${UIW_CLEAN_ROOT_MIRROR:-http://deb.debian.org/debian}
sec=${mirror%/debian}/debian-security
root=$(mktemp -d /tmp/uiw-clean-root.XXXXXX)
mounts=()

cleanup() {
	local i
	for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
		umount -l "${mounts[i]}" 2>/dev/null || true
	done
	if [[ $keep == 1 ]]; then
		echo "clean-root-check: left $root (mounts removed)" >&2
	elif findmnt -rn -o TARGET | grep -q "^$root"; then
		echo "clean-root-check: something is still mounted under $root; not removing it" >&2
	else
		rm -rf --one-file-system "$root"
	fi
}
trap cleanup EXIT

mnt() { # mnt ARGS... TARGET
	mount "$@"
	mounts+=("${!#}")
}

start=$(date +%s)
step() { printf '\n==> [%4ss] %s\n' "$(($(date +%s) - start))" "$*" >&2; }

step "mmdebstrap bookworm (minbase + $include) -> $root"
mmdebstrap --variant=minbase --include=$include bookworm "$root" \
	"deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
	"deb $sec bookworm-security main"

# The new root as a mount point of its own (private), as / is on a real machine:
# tools that unshare a mount namespace (ci/distro-chroot.sh) make / private,
# which fails on a directory that is not a mount point.
mnt --bind "$root" "$root"
mount --make-private "$root"

if [[ $sudo_user == 1 ]]; then
	chroot "$root" useradd -m -s /bin/bash dev
	echo 'dev ALL=(ALL) NOPASSWD:ALL' >"$root/etc/sudoers.d/dev"
	chmod 0440 "$root/etc/sudoers.d/dev"
fi

step "a Rust toolchain: $rustup_home (read-only) and $cargo_home/bin -> $home"
mkdir -p "$root$home/.rustup" "$root$home/.cargo"
mnt --bind "$rustup_home" "$root$home/.rustup"
mount -o remount,bind,ro "$root$home/.rustup"
cp -a "$cargo_home/bin" "$root$home/.cargo/"
printf '#!/bin/sh\ncase ":${PATH}:" in *:"$HOME/.cargo/bin":*) ;; *) export PATH="$HOME/.cargo/bin:$PATH" ;; esac\n' \
	>"$root$home/.cargo/env"
echo '. "$HOME/.cargo/env"' >>"$root$home/.profile"
echo '. "$HOME/.cargo/env"' >>"$root$home/.bashrc"

step "git clone $src (HEAD $(git -C "$src" rev-parse --short HEAD)) -> $home/uiw"
git clone -q --no-hardlinks "$src" "$root$home/uiw"
if [[ $sudo_user == 1 ]]; then
	chroot "$root" chown -R dev:dev /home/dev/uiw /home/dev/.cargo /home/dev/.profile /home/dev/.bashrc
fi

mnt -t proc proc "$root/proc"
mnt -t sysfs sysfs "$root/sys"
mnt -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
mnt -t tmpfs tmpfs "$root/dev/shm"
mnt -t tmpfs tmpfs "$root/run"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# What the Debian installer writes on every new machine and minbase lacks:
# without /etc/hosts "localhost" does not resolve (libfabric's verbs provider
# binds it to find its device).
printf '127.0.0.1\tlocalhost\n127.0.1.1\tuiw-clean-root\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
	>"$root/etc/hosts"
echo uiw-clean-root >"$root/etc/hostname"
# The host's CA bundle, as a local CA of the new root: where the network to
# crates.io passes a TLS-inspecting proxy (as in this project's workplace), a
# fresh machine there carries that CA too. Harmless elsewhere.
if [[ -s /etc/ssl/certs/ca-certificates.crt ]]; then
	cp /etc/ssl/certs/ca-certificates.crt "$root/usr/local/share/ca-certificates/uiw-host-bundle.crt"
	chroot "$root" update-ca-certificates >/dev/null 2>&1 || true
fi

in_root() { chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/sbin:/usr/bin:/sbin:/bin bash -lc "$1"; }
if [[ $sudo_user == 1 ]]; then
	# A login shell of dev: ~/.profile puts ~/.cargo/bin on PATH, as rustup's installer does.
	in_root() { chroot "$root" /usr/bin/env -i TERM=dumb PATH=/usr/sbin:/usr/bin:/sbin:/bin runuser -l dev -c "$1"; }
	first='sudo ./ci/setup-and-run.sh'
else
	first='./ci/setup-and-run.sh'
fi

step "the README's first command: $first"
in_root "cd $home/uiw && echo '+ $first' && $first"

if [[ $only_setup == 0 ]]; then
	step "the README's second command: ./ci/test.sh"
	in_root "cd $home/uiw && echo '+ ./ci/test.sh' && ./ci/test.sh"
fi

chroot "$root" "$home/uiw/target/debug/uiw" down || true
step "clean-root-check: PASSED (the README's command(s) succeeded on a clean Debian 12 root)"
