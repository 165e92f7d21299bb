#!/usr/bin/env bash
# ci/raw-matrix.sh — issue 12's acceptance matrix for the raw transports, in one command.
#
#   ci/raw-matrix.sh [--uiw PATH] [--mtu "1500 9000"] [--pairs "xdp:xdp xdp:tcp tcp:xdp packet:xdp xdp:packet"]
#                    [--only REGEX] [--out DIR]
#
# For every pairing A:B (client on test bed host A with transport A, server on host B with
# transport B; ci/testbed.sh) and every MTU, runs, unmodified and data checked where the tool
# can check:
#   rc_pingpong   ibv_rc_pingpong -g 0 --chk (every byte of every message compared)
#   rping         rping -V -C 10 (every ping's data verified; the client must print all 10)
#   integrity     examples/c/integrity.c: every operation at every size, 0 B … 8 MiB, checked
#                 on both sides (RTR-connected)
#   the six perftest tools, ib_{write,read,send}_{bw,lat}, with -a (every size, 2 B … 8 MiB),
#   the bandwidth tools with -q 4, each once RTR-connected and once over rdma_cm (-R): the
#   client must print a result row for every size.
# Each case is one line in OUT/cases.txt (logs in OUT/<case>/; the default OUT is
# target/raw-matrix). Exit status 0 only if every case passed. Needs root (namespaces, AF_XDP), perftest,
# rdmacm-utils, ibverbs-utils, nftables, ethtool, a C compiler and libibverbs-dev. Not run by
# CI (about 30 minutes on 2 cores); rawhost.rs runs a subset on every test run.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
uiw=$repo/target/release/uiw mtus="1500 9000" pairs="xdp:xdp xdp:tcp tcp:xdp packet:xdp xdp:packet" only= out=$repo/target/raw-matrix
while [[ $# -gt 0 ]]; do
	case $1 in
	--uiw) uiw=$2; shift 2 ;;
	--mtu) mtus=$2; shift 2 ;;
	--pairs) pairs=$2; shift 2 ;;
	--only) only=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "raw-matrix: unknown argument '$1' (--help)" >&2; exit 2 ;;
	esac
done
[[ $(id -u) == 0 ]] || { echo "raw-matrix: needs root (network namespaces, AF_XDP)" >&2; exit 2; }
[[ -x $uiw ]] || { echo "raw-matrix: no uiw CLI at $uiw (cargo build --release, or --uiw PATH)" >&2; exit 2; }
for p in ibv_rc_pingpong rping ib_write_bw ib_read_lat cc; do
	command -v "$p" >/dev/null || { echo "raw-matrix: $p is not installed" >&2; exit 2; }
done
export UIW_LIBDIR=${UIW_LIBDIR:-$(dirname "$uiw")}
rm -rf "$out"; mkdir -p "$out"
cc -O1 -g -Wall -Werror -o "$out/integrity" "$repo/examples/c/integrity.c" -libverbs
tb=(bash "$repo/ci/testbed.sh" -p uiwmx)
trap '"${tb[@]}" down >/dev/null 2>&1 || true' EXIT

pass=0 fail=0
failed=()

# run_pair CASE PORT CHECK SERVER-ARGS... -- CLIENT-ARGS...: the server on B (waits until its
# port listens), the client on A; both must exit 0 within 10 minutes and CHECK (a function
# given the client's and the server's log) must hold.
run_pair() {
	local name=$1 port=$2 check=$3; shift 3
	local srv=() cli=()
	while [[ $1 != -- ]]; do srv+=("$1"); shift; done
	shift; cli=("$@")
	local d=$out/$name rc_s=0 rc_c=0 verdict=FAIL why=
	mkdir -p "$d"
	timeout 600 "${tb[@]}" run b -- env VERBS_LOG_LEVEL=3 "${srv[@]}" >"$d/server.log" 2>&1 &
	local spid=$!
	for _ in $(seq 100); do
		"${tb[@]}" exec b ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
		sleep 0.1
	done
	timeout 600 "${tb[@]}" run a -- env VERBS_LOG_LEVEL=3 "${cli[@]}" >"$d/client.log" 2>&1 || rc_c=$?
	wait "$spid" || rc_s=$?
	if [[ $rc_s == 0 && $rc_c == 0 ]]; then
		if why=$($check "$d/client.log" "$d/server.log") && why=$(check_transport "$d/client.log" "$trans_a") &&
			why=$(check_transport "$d/server.log" "$trans_b"); then verdict=pass; fi
	else
		why="server rc=$rc_s client rc=$rc_c: $(grep -h -m1 -iE 'error|fail|bad|unable|refused' "$d/client.log" "$d/server.log" | head -1)"
	fi
	[[ $verdict == pass ]] && pass=$((pass + 1)) || { fail=$((fail + 1)); failed+=("$name"); }
	printf '%-44s %-4s %s\n' "$name" "$verdict" "$why" | tee -a "$out/cases.txt"
}

# LOG's side used TRANSPORT: the provider names a raw transport when it opens one
# (VERBS_LOG_LEVEL=3), and opens none on a tcp device.
check_transport() {
	local line
	line=$(grep -m1 "QP streams go over uiw's TCP on" "$1" || true)
	if [[ $2 == tcp ]]; then
		[[ -z $line ]] || { echo "$(basename "$1"): a raw transport on a tcp device: $line"; return 1; }
	else
		[[ $line == *"($2"* ]] || { echo "$(basename "$1"): not over $2: ${line:-no raw transport opened}"; return 1; }
	fi
}
# (--chk: a mismatch fails the program itself)
check_pingpong() { grep -q "iters in" "$1" && grep -q "iters in" "$2" || { echo "no result line"; return 1; }; }
check_rping() { local n; n=$(grep -c '^ping data: rdma-ping-' "$1" || true); [[ $n == 10 ]] || { echo "client printed $n of 10 pings"; return 1; }; }
check_integrity() {
	local f
	for f in "$1" "$2"; do
		grep -qE '^[0-9]+ passed, 0 failed$' "$f" || { echo "$(basename "$f"): $(grep -E ' passed, [0-9]+ failed$' "$f" || echo 'no summary')"; return 1; }
	done
}
# every size of -a: 2 B … 8 MiB (23 rows) for the bandwidth tools, and for the latency tools
check_all_sizes() {
	local rows
	rows=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && $1 >= 2 && $1 <= 8388608 {print $1}' "$1" | sort -un | wc -l)
	[[ $rows -ge 23 ]] || { echo "client printed results for $rows of 23 sizes"; return 1; }
}

# The case name of TOOL in the pairing and MTU being run, and whether --only picks it.
key() { echo "$trans_a-$trans_b-$mtu-$1"; }
c() { [[ -z $only || "$(key "$1")" =~ $only ]]; }

for mtu in $mtus; do
	for pair in $pairs; do
		trans_a=${pair%%:*} trans_b=${pair##*:}
		want=0
		for t in rc_pingpong rping integrity ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat; do
			c "$t" && want=1
		done
		[[ $want == 1 ]] || continue
		echo "==> $trans_a (client) -> $trans_b (server), MTU $mtu" | tee -a "$out/cases.txt"
		"${tb[@]}" up --uiw "$uiw" --mtu "$mtu" --transport-a "$trans_a" --transport-b "$trans_b" >"$out/up-$trans_a-$trans_b-$mtu.log" 2>&1 ||
			{ cat "$out/up-$trans_a-$trans_b-$mtu.log"; exit 1; }
		eval "$("${tb[@]}" env)"
		dev=$TB_DEV addr=$TB_ADDR_B
		c rc_pingpong && run_pair "$(key rc_pingpong)" 18515 check_pingpong ibv_rc_pingpong -d "$dev" -g 0 -n 200 -s 16384 --chk \
			-- ibv_rc_pingpong -d "$dev" -g 0 -n 200 -s 16384 --chk "$addr"
		c rping && run_pair "$(key rping)" 7174 check_rping rping -s -a "$addr" -V -C 10 -- rping -c -a "$addr" -V -C 10 -v
		c integrity && run_pair "$(key integrity)" 7476 check_integrity "$out/integrity" -s -p 7476 -d "$dev" \
			-- "$out/integrity" -c "$addr" -p 7476 -d "$dev"
		for tool in ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat; do
			c "$tool" || continue
			for mode in rtr cm; do
				args=("$tool" -d "$dev" -a -p 18515)
				[[ $mode == cm ]] && args+=(-R) || args+=(-x 0)
				if [[ $tool == *_bw ]]; then args+=(-q 4 -n 50); else args+=(-n 100); fi
				run_pair "$(key "$tool")-$mode" 18515 check_all_sizes "${args[@]}" -- "${args[@]}" "$addr"
			done
		done
		"${tb[@]}" down >/dev/null 2>&1 || true
	done
done

echo
echo "raw-matrix: $pass passed, $fail failed (cases in $out/cases.txt, logs in $out/<case>/)"
[[ $fail == 0 ]] || { printf 'failed: %s\n' "${failed[@]}"; exit 1; }
