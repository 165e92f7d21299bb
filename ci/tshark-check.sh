#!/usr/bin/env bash
# Check that iWARP traffic decodes cleanly in Wireshark's own dissectors (iwarp_mpa,
# iwarp_ddp_rdmap): no malformed frame, no expert error, and really some MPA and DDP/RDMAP.
#
#   ci/tshark-check.sh -r FILE.pcap [--no-data]
#       check an existing capture
#   ci/tshark-check.sh [-i IFACE] [-w OUT.pcap] [-f 'CAPTURE FILTER'] [--no-data] -- CMD [ARGS...]
#       capture on IFACE (default lo) while CMD runs (for example a script that starts an
#       rping server and client under `uiw run`), then check; CMD's status is checked too
#
# Example (as root, a device published with `uiw up`):
#   ci/tshark-check.sh -f 'tcp port 7174' -- sh -c \
#     'uiw run -- rping -s -a 127.0.0.1 -C 10 & sleep 1; uiw run -- rping -c -a 127.0.0.1 -C 10 -v; wait'
#
# MPA is found by tshark's heuristic (on by default), which needs each connection's MPA
# Request and Reply in the capture; `-d tcp.port==PORT,iwarp_mpa` is not needed. The
# RPC-over-RDMA and SMB-Direct heuristics misread small perftest Sends and are disabled, as
# in /work/shared/captures/README.md. tshark 4.0 warns "Res not zero" / "Rev not one" on
# every MPA v2 frame (it does not know the IRD/ORD words): warnings are reported, not failed.
# A capture that lost segments is reported: MPA has no markers here, so tshark cannot find
# the FPDUs after a gap and may report them malformed (then the failure says it is the
# capture's fault, and the exit status is 3 instead of 1 when that is the only failure, so
# that a caller may capture again). Keep captured runs short (perftest -n 100).
set -euo pipefail

iface=lo
pcap=
write=
filter=tcp
need_data=1
cmd=()
while [[ $# -gt 0 ]]; do
	case $1 in
	-r) pcap=$2; shift 2 ;;
	-i) iface=$2; shift 2 ;;
	-w) write=$2; shift 2 ;;
	-f) filter=$2; shift 2 ;;
	--no-data) need_data=0; shift ;;
	--) shift; cmd=("$@"); break ;;
	-h|--help) sed -n '2,23p' "$0"; exit 0 ;;
	*) echo "tshark-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
command -v tshark >/dev/null || { echo "tshark-check: tshark is not installed (apt-get install tshark)" >&2; exit 2; }

cmd_status=0
if [[ -z $pcap ]]; then
	[[ ${#cmd[@]} -gt 0 ]] || { echo "tshark-check: give -r FILE or -- CMD" >&2; exit 2; }
	pcap=${write:-$(mktemp --suffix=.pcap)}
	rm -f "$pcap"
	# A large kernel buffer: loopback carries 64 KiB frames at GB/s, and a dropped segment
	# makes every later FPDU of its stream undecodable (MPA without markers has no resync).
	tshark -q -i "$iface" -B 1024 -f "$filter" -w "$pcap" 2>/tmp/tshark-check.$$.log &
	cap=$!
	# wait until the capture runs
	for _ in $(seq 100); do
		grep -q "Capturing on" /tmp/tshark-check.$$.log 2>/dev/null && break
		sleep 0.1
	done
	"${cmd[@]}" || cmd_status=$?
	sleep 1
	kill -INT "$cap" 2>/dev/null || true
	wait "$cap" 2>/dev/null || true
	rm -f /tmp/tshark-check.$$.log
fi

tsh() {
	tshark -r "$pcap" -o tcp.try_heuristic_first:TRUE --disable-heuristic rpcrdma_iwarp --disable-heuristic smb_direct_iwarp \
		-T fields -e frame.number "$@" 2>/dev/null | grep -c . || true
}
frames=$(tsh)
malformed=$(tsh -Y '_ws.malformed')
errors=$(tsh -Y '_ws.expert.severity >= "Error"')
warnings=$(tsh -Y '_ws.expert.severity == "Warning"')
mpa_req=$(tsh -Y 'iwarp_mpa.key.req')
mpa_rep=$(tsh -Y 'iwarp_mpa.key.rep')
ddp=$(tsh -Y 'iwarp_ddp_rdmap')
# tshark 4.0 has no CRC status field (iwarp_mpa.crc_check.status is refused as a filter):
# its verdict is only in the CRC item's text.
crc_bad=$(tshark -r "$pcap" -o tcp.try_heuristic_first:TRUE --disable-heuristic rpcrdma_iwarp --disable-heuristic smb_direct_iwarp \
	-V 2>/dev/null | grep -c 'Bad CRC32' || true)
lost=$(tsh -Y 'tcp.analysis.lost_segment')

echo "tshark-check: $pcap: $frames frames, MPA requests $mpa_req, replies $mpa_rep, DDP/RDMAP $ddp," \
	"malformed $malformed, expert errors $errors, expert warnings $warnings, bad CRC $crc_bad," \
	"segments not captured $lost"
fail=0
gap_fail=0
if [[ $lost -ne 0 ]]; then
	echo "tshark-check: warning: the capture lost $lost TCP segment(s); MPA without markers cannot" \
		"be decoded after a gap in its stream" >&2
fi
if [[ $malformed -ne 0 || $errors -ne 0 ]]; then
	if [[ $lost -ne 0 ]]; then
		echo "tshark-check: FAIL (inconclusive): malformed frames in a capture with gaps — the" \
			"capture was too slow; rerun with shorter runs (perftest -n 100)" >&2
		gap_fail=1
	else
		fail=1
	fi
	echo "tshark-check: FAIL: malformed or expert-error frames:" >&2
	tshark -r "$pcap" -o tcp.try_heuristic_first:TRUE --disable-heuristic rpcrdma_iwarp --disable-heuristic smb_direct_iwarp \
		-Y '_ws.malformed || _ws.expert.severity >= "Error"' 2>/dev/null | head -20 >&2
fi
if [[ $mpa_req -eq 0 || $mpa_rep -eq 0 ]]; then
	echo "tshark-check: FAIL: no MPA Request/Reply decoded (was the connection set up inside the capture?)" >&2
	fail=1
fi
if [[ $need_data -eq 1 && $ddp -eq 0 ]]; then
	echo "tshark-check: FAIL: no DDP/RDMAP frame decoded" >&2
	fail=1
fi
if [[ $cmd_status -ne 0 ]]; then
	echo "tshark-check: FAIL: the command exited with status $cmd_status" >&2
	fail=1
fi
if [[ $fail -eq 0 && $gap_fail -eq 1 ]]; then
	exit 3
fi
[[ $fail -eq 0 ]] && echo "tshark-check: OK"
exit $fail
