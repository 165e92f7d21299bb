#!/usr/bin/env bash
# ci/fabtests.sh — libfabric's own test suite (fabtests 1.17) over uiw, when it is installed.
#
#   sudo ci/fabtests.sh [PROVIDER...]      # default: "verbs;ofi_rxm" verbs
#
# Runs fabtests' runfabtests.sh (test set "quick": unit, functional, short) once per
# provider, server and client both on this host, against a uiw device published on a veth
# in a network namespace of its own (libfabric 1.17's verbs provider skips loopback
# netdevs), and prints each run's Pass / Notrun / Fail totals and the failing tests.
#
# fabtests is not packaged in Debian 12. Build it from libfabric's source at the tag that
# matches Debian's libfabric (v1.17.0), directory fabtests/, against libfabric-dev:
#     apt-get install libfabric-dev autoconf automake libtool
#     cd fabtests && ./autogen.sh && ./configure --prefix=/opt/fabtests && make install
# then run this script with FABTESTS_BIN=/opt/fabtests/bin (or put that on PATH).
#
# runfabtests.sh ends each test by killing every process named fi_* it can see; this
# script runs it in a PID namespace of its own (unshare --pid), so that it sees only its
# own processes and never another program's.
#
# Environment:
#   FABTESTS_BIN      where runfabtests.sh and the fi_* programs are (default: PATH)
#   FABTESTS_SET      runfabtests.sh test set (default: quick)
#   FABTESTS_TIMEOUT  seconds per test (default: 60)
#   CARGO_PROFILE     release: use target/release (default: target/debug, built first)
#   UIW_FABTESTS_NS   network namespace name (default: uiw-fabtests-PID; deleted after)
# Exit status: 0 when every run has no failure, 1 otherwise, 2 when fabtests is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

if [[ $(id -u) -ne 0 ]]; then
	echo "ci/fabtests.sh: needs root (a network namespace, a published device)" >&2
	exit 1
fi
runfab=${FABTESTS_BIN:+$FABTESTS_BIN/}runfabtests.sh
if ! command -v "$runfab" >/dev/null; then
	echo "ci/fabtests.sh: fabtests not found (no runfabtests.sh in ${FABTESTS_BIN:-PATH});" \
		"see this script's header for how to build it" >&2
	exit 2
fi
runfab=$(command -v "$runfab")
bin=$(dirname "$runfab")

profile_dir=debug
profile_args=()
if [[ "${CARGO_PROFILE:-dev}" == release ]]; then
	profile_dir=release
	profile_args=(--release)
fi
cargo build --workspace "${profile_args[@]}" >&2
uiw=${CARGO_TARGET_DIR:-$root/target}/$profile_dir/uiw

ns=${UIW_FABTESTS_NS:-uiw-fabtests-$$}
state=$(mktemp -d /tmp/uiw-fabtests.XXXXXX)
logs=$state/logs
mkdir -p "$logs"
cleanup() {
	UIW_STATE_DIR=$state ip netns exec "$ns" "$uiw" down >/dev/null 2>&1 || true
	ip netns del "$ns" 2>/dev/null || true
	echo "ci/fabtests.sh: logs kept in $logs" >&2
}
trap cleanup EXIT

ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" link add v0 type veth peer name v1
ip -n "$ns" addr add 10.77.0.1/24 dev v0
ip -n "$ns" link set v0 up
ip -n "$ns" link set v1 up
export UIW_STATE_DIR=$state
ip netns exec "$ns" "$uiw" up --netdev v0 >&2

providers=("$@")
[[ ${#providers[@]} -gt 0 ]] || providers=("verbs;ofi_rxm" "verbs")
status=0
for prov in "${providers[@]}"; do
	log=$logs/$(echo "$prov" | tr ';' '_').log
	echo "==> fabtests ${FABTESTS_SET:-quick}, provider $prov (log: $log)" >&2
	# The PID namespace (see the header), then the network namespace, then uiw run.
	# From the log directory: fabtests write crash backtraces (*.btr) into the cwd.
	(cd "$logs" && unshare --pid --fork --mount-proc \
		ip netns exec "$ns" "$uiw" run -- \
		"$runfab" -v -T "${FABTESTS_TIMEOUT:-60}" -t "${FABTESTS_SET:-quick}" \
		-p "$bin" -s 10.77.0.1 -c 10.77.0.1 "$prov" >"$log" 2>&1) || true
	pass=$(awk '/# Total Pass/ {print $NF}' "$log" | tail -1)
	notrun=$(awk '/# Total Notrun/ {print $NF}' "$log" | tail -1)
	fail=$(awk '/# Total Fail/ {print $NF}' "$log" | tail -1)
	if [[ -z $pass || -z $fail ]]; then
		echo "$prov: runfabtests.sh printed no totals (see $log)"
		status=1
		continue
	fi
	echo "$prov: ${pass} passed, ${fail} failed, ${notrun:-0} not run"
	# -v output: "- name:   fi_cq_data -e rdm -p ..." ... "  result: Fail".
	awk '/^- name:/ {sub(/^- name: */, ""); name = $0} /^ *result: *Fail/ {print "    failed: " name}' "$log"
	[[ $fail -eq 0 ]] || status=1
done
exit $status
