#!/bin/bash
# perftest/turnaround/run.sh — the turnaround of a uiw latency test: what the process does
# between the recv that brings the peer's message and the send of its answer.
#
#   run.sh time  [TEST [ITERS]]   wall clock (turn.c), client and server, and the test's own
#                                 latency; TEST: ib_write_lat (default), ib_send_lat, ...
#   run.sh count [TEST [ITERS]]   the client under callgrind, collecting only its turnarounds
#                                 (turn.c again): instructions and locked instructions per
#                                 turnaround, and where they are
#   run.sh count-responder [TEST [ITERS]]
#                                 the same for the server, whichever of its threads answers
#                                 (ib_read_lat's: uiw's progress thread), the client at speed
#
# Needs a published device (uiw up), perftest, gcc; `count` valgrind and objdump. UIW (the
# uiw binary, default target/release/uiw of this tree) and UIW_STATE_DIR are honoured.
# 8-byte messages, MPA CRC off (as uiw-bench's latency rows).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
uiw=${UIW:-$here/../../target/release/uiw}
mode=${1:-}
test=${2:-ib_write_lat}
build=${TMPDIR:-/tmp}/uiw-turnaround
mkdir -p "$build"
port=$((20000 + RANDOM % 20000))
case $mode in
time)
	iters=${3:-60000}
	gcc -O2 -shared -fPIC -o "$build/turn.so" "$here/turn.c" -ldl
	UIW_CRC=0 LD_PRELOAD="$build/turn.so" "$uiw" run -- "$test" -d uiw_lo -x 0 -p "$port" -s 8 -F -n "$iters" >"$build/server.log" 2>&1 &
	sleep 0.5
	UIW_CRC=0 LD_PRELOAD="$build/turn.so" "$uiw" run -- "$test" -d uiw_lo -x 0 -p "$port" -s 8 -F -n "$iters" 127.0.0.1 >"$build/client.log" 2>&1
	wait
	sed -n 's/^turnaround: /client: /p' "$build/client.log"
	sed -n 's/^turnaround: /server: /p' "$build/server.log"
	awk '/^ *[0-9]+ +[0-9]+ /{print "latency (half round trip, us): typical " $5 ", average " $6}' "$build/client.log" | tail -1
	;;
count | count-responder)
	iters=${3:-5000}
	gcc -O2 -shared -fPIC -o "$build/turn.so" "$here/turn.c" -ldl
	rm -f "$build"/cg.out*
	cg="valgrind --tool=callgrind --collect-atstart=no --separate-threads=yes --dump-instr=yes --callgrind-out-file=$build/cg.out"
	if [ "$mode" = count ]; then
		side=client
		# ib_send_lat's server runs under valgrind as well (collecting nothing): at full speed
		# its answer came back while the client, 50 times slower, was still in its post's pump,
		# which read it there — the counted window was then the rest of that pump and a poll that
		# found the completion queued, not the path a turnaround takes at speed (the recv in an
		# empty poll's drive). Not ib_write_lat's, which spins on memory: valgrind runs one
		# thread at a time, and its progress thread starved.
		slow=
		[ "$test" = ib_write_lat ] || slow="valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/dev/null"
		# shellcheck disable=SC2086
		UIW_CRC=0 "$uiw" run -- $slow "$test" -d uiw_lo -x 0 -p "$port" -s 8 -F -n "$iters" >"$build/server.log" 2>&1 &
		sleep 2
		# shellcheck disable=SC2086
		UIW_CRC=0 LD_PRELOAD="$build/turn.so" "$uiw" run -- $cg \
			"$test" -d uiw_lo -x 0 -p "$port" -s 8 -F -n "$iters" 127.0.0.1 >"$build/client.log" 2>&1
		wait
	else
		side=server
		# The server's thread that receives the message is the one collected (TURN_ANY_THREAD):
		# a passive responder's is uiw's progress thread, not the main thread.
		# shellcheck disable=SC2086
		UIW_CRC=0 TURN_ANY_THREAD=1 LD_PRELOAD="$build/turn.so" "$uiw" run -- $cg \
			"$test" -d uiw_lo -x 0 -p "$port" -s 8 -F -n "$iters" >"$build/server.log" 2>&1 &
		sleep 4
		UIW_CRC=0 "$uiw" run -- "$test" -d uiw_lo -x 0 -p "$port" -s 8 -F -n "$iters" 127.0.0.1 >"$build/client.log" 2>&1
		wait
	fi
	# The dumps of whole thousands of turnarounds, the first and the last left out: the
	# first holds the window from the last out-of-band recv of the set-up to the first post
	# (warm-up, and perftest's CPU clock measurement), the last the window from the last
	# message to perftest's report exchange over its TCP socket (the measurement again).
	# A dump writes a file per thread that ran meanwhile; those that collected nothing add 0.
	nums=$(ls "$build"/cg.out.*-* 2>/dev/null | sed 's/.*cg\.out\.\([0-9]*\)-[0-9]*$/\1/' | sort -nu | sed '1d;$d')
	[ -n "$nums" ] || { echo "run.sh: fewer than 3000 turnarounds collected (ITERS $iters)" >&2; exit 1; }
	dumps=$(for n in $nums; do ls "$build"/cg.out."$n"-*; done)
	turns=$((1000 * $(echo "$nums" | wc -l)))
	total=0
	for d in $dumps; do
		total=$((total + $(callgrind_annotate "$d" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}')))
	done
	lib=$(readlink -f "$(dirname "$uiw")/libuiw_rdmav34.so")
	echo "turnarounds $turns (of $(sed -n 's/^turnaround: collected //p' "$build/$side.log")), instructions per turnaround $((total / turns))"
	# shellcheck disable=SC2086
	python3 "$here/locked.py" "$lib" "$turns" $dumps
	;;
*)
	sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
