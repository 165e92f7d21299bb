#!/usr/bin/env bash
# ci/siw-interop.sh — uiw against the Linux kernel's siw, both directions, in a VM.
#
#   ci/siw-interop.sh [--keep-vm] [--only REGEX] [--rounds N]
#
# Boots the Debian VM of ../shared/siw-vm (QEMU; TCG on machines whose KVM cannot boot a
# stock kernel) that has the kernel's siw and its rebuilt variants, publishes uiw_lo on this
# host, and runs unmodified rdma-core tools between them through rdma_cm:
#
#   tools       rping -V (verified data), ib_send_bw -R, ib_write_bw -R, ib_read_bw -R
#   directions  h2g: uiw is the client, siw (guest) the server
#               g2h: siw is the client, uiw (host) the server
#   modes       off      stock siw, CRC off on both sides (uiw with UIW_CRC=0)
#               crc-uiw  stock siw, uiw asks for CRC (UIW_CRC=1); siw must use it (RFC 5044)
#               crc-siw  siw built with mpa_crc_required: siw asks for CRC (as initiator
#                        only: as responder it uses CRC only when asked); uiw with UIW_CRC=0
#               rev1, p2p run with UIW_CRC=0 too: every mode sets UIW_CRC, so none depends
#                        on uiw's default (off, see README "CRC")
#               rev1     siw built with mpa_version=1 (MPA revision 1, no IRD/ORD words)
#               p2p      siw built with peer_to_peer: MPA v2 P2P with an RTR message
#
# Every case must exit 0 on both sides; the host side's traffic is captured on lo and checked
# with ci/tshark-check.sh (Wireshark's MPA/DDP/RDMAP dissectors, incl. CRC32c where
# negotiated). The last line is "N passed, M failed"; a failure exits 1. Logs, captures and
# the matrix (matrix.txt) land in $OUT (default target/siw-interop).
#
# Host <-> guest (QEMU user networking): the host reaches the guest's siw listener on
# :18515 through the forward 127.0.0.1:19515; the guest reaches the host's 127.0.0.1:PORT
# as 10.0.2.2:PORT. The image (about 4 min to build the first time) is cached in
# /var/cache/siw-vm-lab; booting takes about 30-60 s under TCG. Needs root (uiw up, apt).
#
# Environment:
#   SIW_VM_DIR   the lab (default: ../shared/siw-vm beside the repository)
#   ITERS SIZE   perftest -n / -s (default 200 / 16384: multi-FPDU messages)
#   RPING_COUNT  rping -C (default 10)
#   OUT          where logs and captures go
#   CARGO_PROFILE=release  use the release build
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

keep_vm=0
only=
rounds=1
while [[ $# -gt 0 ]]; do
	case $1 in
	--keep-vm) keep_vm=1; shift ;;
	--only) only=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	-h|--help) sed -n '2,32p' "$0"; exit 0 ;;
	*) echo "siw-interop: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done

SIW_VM_DIR=${SIW_VM_DIR:-$root/../shared/siw-vm}
if [[ ! -f $SIW_VM_DIR/lab.env ]]; then
	echo "siw-interop: no siw VM lab at $SIW_VM_DIR (set SIW_VM_DIR)" >&2
	exit 2
fi
SIW_VM_DIR=$(cd "$SIW_VM_DIR" && pwd)
# shellcheck source=/dev/null
source "$SIW_VM_DIR/lab.env"
[[ $(id -u) -eq 0 ]] || { echo "siw-interop: run as root (uiw up, the VM's packages)" >&2; exit 2; }

ITERS=${ITERS:-200}
SIZE=${SIZE:-16384}
RPING_COUNT=${RPING_COUNT:-10}
OUT=${OUT:-$root/target/siw-interop}
CASE_TIMEOUT=${CASE_TIMEOUT:-150}
profile_dir=debug
profile_args=()
if [[ "${CARGO_PROFILE:-dev}" == release ]]; then profile_dir=release; profile_args=(--release); fi
uiw=${CARGO_TARGET_DIR:-$root/target}/$profile_dir/uiw

step() { printf '\n==> %s\n' "$*" >&2; }
now() { date +%s; }
t_start=$(now)
timing() { printf '%-14s %4d s\n' "$1" "$2" >> "$OUT/timings.txt"; }

rm -rf "$OUT"
mkdir -p "$OUT"

step "cargo build --workspace ${profile_args[*]}"
cargo build --workspace "${profile_args[@]}"

t0=$(now)
step "siw VM: host packages and the cached image ($SIW_CACHE)"
bash "$SIW_VM_DIR/00-host-deps.sh"
bash "$SIW_VM_DIR/10-build-image.sh"
timing image $(( $(now) - t0 ))

export UIW_STATE_DIR=${UIW_STATE_DIR:-/tmp/uiw-siw-interop-state}
ssh_mux=()
cleanup() {
	local pids
	pids=$(jobs -p) && [[ -n $pids ]] && kill $pids 2>/dev/null
	"$uiw" down >/dev/null 2>&1 || true
	[[ ${#ssh_mux[@]} -eq 0 ]] || ssh "${ssh_opts[@]}" "${ssh_mux[@]}" -O exit root@127.0.0.1 >/dev/null 2>&1 || true
	if [[ $keep_vm == 0 ]]; then bash "$SIW_VM_DIR/90-stop-vm.sh" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

# Boots the VM, again when its kernel panics on the way up (3 attempts). Under TCG the guest
# kernel has died ~4 s into boot (an int3 Oops in sched_clock_cpu, "Kernel panic - not
# syncing: Fatal exception in interrupt"; once, in a CI run, against 8 of 8 clean boots when
# retried on the same machine): QEMU keeps running a dead guest
# and 20-start-vm.sh waits out its whole ssh timeout (600 s) before it gives up. The serial
# log says so at once. Any other boot failure is not retried.
boot_vm() {
	local attempt pid
	for attempt in 1 2 3; do
		rm -f "$SIW_RUN/serial.log"
		bash "$SIW_VM_DIR/20-start-vm.sh" &
		pid=$!
		while kill -0 "$pid" 2>/dev/null; do
			if grep -q 'Kernel panic' "$SIW_RUN/serial.log" 2>/dev/null; then
				echo "siw-interop: the guest kernel panicked while booting (attempt $attempt of 3):" >&2
				grep -m1 -A3 'Oops\|BUG:\|Kernel panic' "$SIW_RUN/serial.log" >&2 || true
				cp "$SIW_RUN/serial.log" "$OUT/serial-panic-$attempt.log"
				kill "$pid" 2>/dev/null || true
				wait "$pid" 2>/dev/null || true
				bash "$SIW_VM_DIR/90-stop-vm.sh" >&2 || true
				continue 2
			fi
			sleep 1
		done
		wait "$pid"
		return
	done
	echo "siw-interop: the guest kernel panicked in 3 boots out of 3 (serial logs in $OUT)" >&2
	return 1
}

t0=$(now)
step "siw VM: boot"
boot_vm
timing boot $(( $(now) - t0 ))
# One multiplexed ssh connection for all guest commands (a new handshake costs seconds under TCG).
ssh_mux=(-o ControlMaster=auto -o "ControlPath=$SIW_RUN/ssh-mux-%C" -o ControlPersist=900)
vm() { ssh "${ssh_opts[@]}" "${ssh_mux[@]}" root@127.0.0.1 "$@"; }
vm 'cat > /root/siw-load.sh' < "$SIW_VM_DIR/guest/siw-load.sh"

# The harness's connect delay for perftest's client against the slow guest, and its close
# delay for every uiw side (siw's close race); see the files.
cc -O2 -Wall -shared -fPIC -o "$OUT/connect_delay.so" "$root/ci/siw-interop/connect_delay.c" -ldl
cc -O2 -Wall -shared -fPIC -o "$OUT/close_delay.so" "$root/ci/siw-interop/close_delay.c" -ldl

step "uiw up (state $UIW_STATE_DIR)"
"$uiw" up
"$uiw" run -- ibv_devices

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits until a TCP listener on $1 exists on the host.
wait_host_listen() {
	for _ in $(seq 100); do
		ss -Hltn "sport = :$1" | grep -q . && return 0
		sleep 0.1
	done
	return 1
}

# The tools' command lines. $1 = tool, $2 = side (server|client), $3 = device, $4 = port,
# $5 = server address (client) or bind address (server).
tool_cmd() {
	local tool=$1 side=$2 dev=$3 port=$4 addr=$5
	case $tool in
	rping)
		if [[ $side == server ]]; then echo "rping -s -a $addr -p $port -v -V -C $RPING_COUNT"
		else echo "rping -c -a $addr -p $port -v -V -C $RPING_COUNT"; fi ;;
	send|write|read)
		local c="ib_${tool}_bw -R -d $dev -p $port -n $ITERS -s $SIZE -F"
		if [[ $side == server ]]; then echo "$c"; else echo "$c $addr"; fi ;;
	esac
}

# The capture decoded by Wireshark's iWARP dissectors in one pass (ci/tshark-check.sh's
# criteria): MPA Request and Reply and DDP/RDMAP frames found, nothing malformed, no expert
# error (a bad MPA CRC is one), and MPA CRCs checked exactly when CRC was negotiated ($2).
tshark_check() {
	local pcap=$1 want_crc=$2 row
	row=$(tshark -r "$pcap" -q -o tcp.try_heuristic_first:TRUE --disable-heuristic rpcrdma_iwarp --disable-heuristic smb_direct_iwarp \
		-z 'io,stat,0,iwarp_mpa.key.req,iwarp_mpa.key.rep,iwarp_ddp_rdmap,_ws.malformed,_ws.expert.severity >= "Error",tcp.analysis.lost_segment,iwarp_mpa.crc_check' \
		2>/dev/null | grep -E '^\| *[0-9.]+ <>' | tail -1)
	local -a f
	IFS='|' read -r -a f <<<"$row"
	local req=${f[2]// /} rep=${f[4]// /} ddp=${f[6]// /} mal=${f[8]// /} err=${f[10]// /} lost=${f[12]// /} crc=${f[14]// /}
	echo "tshark: $pcap: MPA requests ${req:-?}, replies ${rep:-?}, DDP/RDMAP frames ${ddp:-?}, malformed ${mal:-?}," \
		"expert errors ${err:-?}, segments not captured ${lost:-?}, frames with a checked MPA CRC ${crc:-?}"
	local ok=1
	[[ ${req:-0} -ge 1 && ${rep:-0} -ge 1 && ${ddp:-0} -ge 1 ]] || { echo "tshark: no MPA Request/Reply or no DDP/RDMAP decoded"; ok=0; }
	[[ ${mal:-1} -eq 0 && ${err:-1} -eq 0 ]] || { echo "tshark: malformed or expert-error frames"; ok=0; }
	if [[ $want_crc == 1 && ${crc:-0} -eq 0 ]]; then echo "tshark: CRC was to be negotiated but no CRC was checked"; ok=0; fi
	if [[ $want_crc == 0 && ${crc:-0} -ne 0 ]]; then echo "tshark: CRC checked where none was to be negotiated"; ok=0; fi
	[[ ${lost:-0} -eq 0 ]] || echo "tshark: warning: the capture lost segments"
	[[ $ok == 1 ]]
}

pass=0
fail=0
retried=0
failed_cases=()
declare -A cell

# The uiw side's environment for a mode and direction.
uiw_env() {
	local mode=$1 dir=$2 tool=$3
	# Every mode says whether uiw asks for CRC, so none depends on uiw's default: crc-uiw
	# asks, the others test the CRC they name or none.
	if [[ $mode == crc-uiw ]]; then echo UIW_CRC=1; else echo UIW_CRC=0; fi
	case $mode in
	# uiw asks siw (built with peer_to_peer) for an RTR
	p2p) [[ $dir == h2g ]] && echo UIW_MPA_P2P=1 ;;
	# uiw as a revision 1 initiator. Not for rping: siw reports IRD/ORD 0 to the server of
	# a revision 1 connection and rping accepts with them, so its RDMA Read cannot be
	# posted (siw-vm README W12); perftest passes its own IRD/ORD.
	rev1) [[ $dir == h2g && $tool != rping ]] && echo UIW_MPA_REVISION=1 ;;
	esac
	return 0
}

# One attempt at a case; logs in $d. Sets att_note; returns 0 when both sides exited 0, rping
# printed every ping and the capture decodes.
attempt() {
	local mode=$1 dir=$2 tool=$3 d=$4
	mkdir -p "$d"
	local envs=()
	mapfile -t envs < <(uiw_env "$mode" "$dir" "$tool")
	local port cap rc_s=0 rc_c=0 rc_t=0
	att_note=
	if [[ $dir == h2g ]]; then
		port=$SIW_FWD_CM_PORT
		# start the siw server and wait until it listens, in one round trip
		vm "rm -f /tmp/srv.rc /tmp/srv.log; setsid -f sh -c 'timeout $CASE_TIMEOUT stdbuf -oL $(tool_cmd "$tool" server siw0 18515 0.0.0.0) >/tmp/srv.log 2>&1; echo \$? >/tmp/srv.rc' </dev/null >/dev/null 2>&1
			for i in \$(seq 100); do ss -Hltn 'sport = :18515' | grep -q . && exit 0; sleep 0.1; done; exit 1" ||
			att_note="guest server did not listen"
		# perftest's second connection must not race the guest's re-listen (connect_delay.c)
		[[ $tool == rping ]] || envs+=("SIW_INTEROP_DELAY_PORT=$port")
	else
		port=$(free_port)
	fi
	# uiw's FIN must not reach siw while siw still completes its last WR (close_delay.c)
	envs+=("LD_PRELOAD=$OUT/connect_delay.so $OUT/close_delay.so" "SIW_INTEROP_CLOSE_PORT=$port")
	printf '%s\n' "${envs[@]}" >"$d/uiw-env.txt"
	tcpdump --immediate-mode -B 65536 -i lo -s 0 -U -w "$d/host.pcap" "tcp port $port" 2>"$d/tcpdump.log" &
	cap=$!
	for _ in $(seq 50); do grep -q 'listening on' "$d/tcpdump.log" && break; sleep 0.1; done
	if [[ $dir == h2g ]]; then
		# shellcheck disable=SC2046
		timeout "$CASE_TIMEOUT" env "${envs[@]}" "$uiw" run -- $(tool_cmd "$tool" client uiw_lo "$port" 127.0.0.1) \
			>"$d/uiw-client.log" 2>&1 || rc_c=$?
		# the server ends with the client; give it 30 s, then stop it; its log and status
		vm 'for i in $(seq 60); do test -s /tmp/srv.rc && break; sleep 0.5; done
			test -s /tmp/srv.rc || { pkill -x rping; pkill -f "^ib_.*_bw"; sleep 1; }
			cat /tmp/srv.log; echo "SRV_RC=$(cat /tmp/srv.rc 2>/dev/null || echo 124)"' >"$d/siw-server.log" 2>&1 || true
		rc_s=$(sed -n 's/^SRV_RC=//p' "$d/siw-server.log" | tail -1)
		rc_s=${rc_s:-124}
	else
		# shellcheck disable=SC2046
		timeout "$CASE_TIMEOUT" env "${envs[@]}" "$uiw" run -- $(tool_cmd "$tool" server uiw_lo "$port" 127.0.0.1) \
			>"$d/uiw-server.log" 2>&1 &
		local spid=$!
		wait_host_listen "$port" || att_note="uiw server did not listen"
		vm "timeout $CASE_TIMEOUT stdbuf -oL $(tool_cmd "$tool" client siw0 "$port" "$HOST_FROM_GUEST_IP")" \
			>"$d/siw-client.log" 2>&1 || rc_c=$?
		# the server ends with the client; give it 30 s, then stop it
		for _ in $(seq 60); do kill -0 "$spid" 2>/dev/null || break; sleep 0.5; done
		kill "$spid" 2>/dev/null || true
		wait "$spid" || rc_s=$?
	fi
	sleep 0.3
	kill -INT "$cap" 2>/dev/null || true
	wait "$cap" 2>/dev/null || true
	vm 'dmesg -c' >"$d/guest-dmesg.log" 2>&1 || true
	# CRC on the wire: uiw asked for it, or siw built with mpa_crc_required initiated. As a
	# responder that build does not require CRC: siw_proc_mpareq sets C in its Reply only
	# when the Request had it (so crc-siw h2g runs without CRC, as siw to siw would).
	local want_crc=0
	[[ $mode == crc-uiw || ($mode == crc-siw && $dir == g2h) ]] && want_crc=1
	tshark_check "$d/host.pcap" "$want_crc" >"$d/tshark.log" 2>&1 || rc_t=$?
	if [[ $tool == rping && $rc_c == 0 ]]; then
		# rping exits 0 on some failures: every ping must have been verified and printed
		local pings
		pings=$(cat "$d"/*client.log | grep -c 'ping data:' || true)
		if [[ $pings -lt $RPING_COUNT ]]; then rc_c=99; att_note="rping client printed $pings of $RPING_COUNT pings"; fi
	fi
	[[ $rc_s == 0 && $rc_c == 0 && $rc_t == 0 ]] && return 0
	att_note="server rc=$rc_s client rc=$rc_c tshark rc=$rc_t${att_note:+ ($att_note)}: $(
		{ grep -h -m1 -E 'Bad wc status|Unexpected CM|ERRNO|error' "$d"/*client.log "$d"/*server.log 2>/dev/null || true; } | head -1 | tr -s ' ')"
	return 1
}

# run_case MODE DIR TOOL ROUND: an attempt, and one more if it failed (the siw side runs
# under TCG; each failed attempt's logs stay in <case>.tryN and the verdict is "pass*").
run_case() {
	local mode=$1 dir=$2 tool=$3 round=$4
	local name="$mode-$dir-$tool"
	[[ $rounds -gt 1 ]] && name+="-r$round"
	local d="$OUT/$name" t0 verdict=FAIL note= try
	t0=$(now)
	for try in 1 2; do
		if attempt "$mode" "$dir" "$tool" "$d"; then
			verdict=pass
			[[ $try -gt 1 ]] && retried=$((retried + 1))
			break
		fi
		note+="${note:+; }try $try: $att_note"
		mv "$d" "$d.try$try"
	done
	if [[ $verdict == pass ]]; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1)); failed_cases+=("$name")
	fi
	local shown=$verdict
	[[ $verdict == pass && -n $note ]] && shown="pass*"
	cell["$mode,$dir-$tool"]+="${cell["$mode,$dir-$tool"]:+/}$shown"
	printf '%-28s %-5s %3d s  %s\n' "$name" "$shown" "$(( $(now) - t0 ))" "$note" | tee -a "$OUT/cases.txt" >&2
}

modes=(off crc-uiw crc-siw rev1 p2p)
tools=(rping send write read)
t_cases=$(now)
for mode in "${modes[@]}"; do
	case $mode in
	off|crc-uiw) variant=default ;;
	crc-siw) variant=crc ;;
	*) variant=$mode ;;
	esac
	want=0
	for dir in h2g g2h; do for tool in "${tools[@]}"; do
		[[ -z $only || "$mode-$dir-$tool" =~ $only ]] && want=1
	done; done
	[[ $want == 1 ]] || continue
	step "siw variant '$variant' (mode $mode)"
	vm "bash /root/siw-load.sh $variant" >&2
	vm 'dmesg -c >/dev/null'
	for round in $(seq "$rounds"); do
		for dir in h2g g2h; do
			for tool in "${tools[@]}"; do
				[[ -z $only || "$mode-$dir-$tool" =~ $only ]] || continue
				run_case "$mode" "$dir" "$tool" "$round"
			done
		done
	done
done
timing cases $(( $(now) - t_cases ))
timing total $(( $(now) - t_start ))

{
	printf '%-8s' mode
	for dir in h2g g2h; do for tool in "${tools[@]}"; do printf ' %-11s' "$dir-$tool"; done; done
	printf '\n'
	for mode in "${modes[@]}"; do
		printf '%-8s' "$mode"
		for dir in h2g g2h; do for tool in "${tools[@]}"; do
			printf ' %-11s' "${cell["$mode,$dir-$tool"]:--}"
		done; done
		printf '\n'
	done
	printf '(h2g: uiw client -> siw server; g2h: siw client -> uiw server; pass* = passed on a later try, see cases.txt)\n'
} >"$OUT/matrix.txt"
step "matrix ($OUT/matrix.txt)"
cat "$OUT/matrix.txt" >&2
cat "$OUT/timings.txt" >&2
if [[ $fail -gt 0 ]]; then
	printf 'failed: %s\n' "${failed_cases[*]}" >&2
fi
echo "siw-interop: $retried of the passes needed more than one try"
echo "siw-interop: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
