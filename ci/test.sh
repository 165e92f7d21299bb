#!/usr/bin/env bash
# ci/test.sh — THE test command: builds everything, then runs every test
# (as root also ci/deb-test.sh: the Debian package in a clean chroot).
#
#   ./ci/test.sh            # as root: everything
#   ./ci/test.sh            # as a user: builds and tests as you, then runs the
#                           # tests that publish a device (they need root for
#                           # /dev/infiniband/uverbsN) through `sudo -n`
#
# Environment:
#   CARGO_PROFILE=release   test the release build (default: dev/debug)
#   UIW_TEST_ALLOW_SKIP=1   as a user without sudo: let the device tests be
#                           skipped instead of failing the run
#
# `cargo test` does not build other crates' binaries (uiw) and cdylibs (the
# provider, the shim) for an integration test, so the build comes first.
# The last lines printed are cargo test's own summary.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

profile_args=()
profile_dir=debug
if [[ "${CARGO_PROFILE:-dev}" == release ]]; then
	profile_args=(--release)
	profile_dir=release
fi

step() { printf '\n==> %s\n' "$*" >&2; }

step "cargo build --workspace --all-targets ${profile_args[*]}"
cargo build --workspace --all-targets "${profile_args[@]}"

# The example C programs must also build warning-free with clang (users
# build them with whatever compiler they have).
if command -v clang >/dev/null; then
	step "clang -Wall -Wextra -Werror examples/c/*.c"
	tmp=$(mktemp -d)
	for c in examples/c/*.c; do
		clang -O1 -g -Wall -Wextra -Werror -Wno-unused-parameter \
			-o "$tmp/$(basename "$c" .c)" "$c" -lrdmacm -libverbs -lpthread || { rm -rf "$tmp"; exit 1; }
	done
	rm -rf "$tmp"
fi

if [[ $(id -u) -eq 0 ]]; then
	# Root: every test runs, and none may skip.
	export UIW_TEST_REQUIRE_ALL=1
	# The Debian package: built from this build, installed, used and purged in a
	# clean bookworm chroot (the host is not touched); ~1-2 minutes.
	step "ci/deb-test.sh (the .deb in a clean Debian 12 chroot)"
	bash ci/deb-test.sh
	step "cargo test --workspace ${profile_args[*]}"
	exec cargo test --workspace --no-fail-fast "${profile_args[@]}"
fi

# Not root. The device tests are in the uiw-examples crate: run its built test
# binaries as root via sudo, then the whole workspace as this user (where
# those tests print why they skip).
device_status=0
if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
	step "device tests as root (sudo -n)"
	mapfile -t bins < <(cargo test -p uiw-examples --no-run "${profile_args[@]}" 2>&1 |
		sed -n 's/^ *Executable .*(\(.*\))$/\1/p')
	if [[ ${#bins[@]} -eq 0 ]]; then
		echo "ci/test.sh: cannot find the uiw-examples test binaries" >&2
		exit 1
	fi
	out=$(mktemp -d)
	for bin in "${bins[@]}"; do
		# Built files and state directories go to $out, never into target/.
		sudo -n env "PATH=$PATH" UIW_TEST_REQUIRE_ALL=1 \
			"UIW_EXAMPLES_OUT_DIR=$out" "$bin" || device_status=$?
	done
	sudo -n rm -rf "$out"
elif [[ "${UIW_TEST_ALLOW_SKIP:-0}" == 1 ]]; then
	step "not root and no password-less sudo: device tests will be SKIPPED"
else
	cat >&2 <<EOF

ci/test.sh: the acceptance tests publish a uiw device, which creates
/dev/infiniband/uverbsN once and needs root. Run one of:
    sudo ./ci/test.sh
    UIW_TEST_ALLOW_SKIP=1 ./ci/test.sh     # everything else; device tests skipped
EOF
	device_status=2
fi

step "cargo test --workspace ${profile_args[*]} (target/$profile_dir)"
test_status=0
cargo test --workspace --no-fail-fast "${profile_args[@]}" || test_status=$?
if [[ $device_status -ne 0 ]]; then
	echo "ci/test.sh: device tests failed or could not run (status $device_status)" >&2
	exit "$device_status"
fi
exit "$test_status"
