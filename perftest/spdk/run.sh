#!/usr/bin/env bash
# SPDK NVMe-oF over uiw: build SPDK from a source tree you supply, then run nvmf_tgt (RDMA transport,
# malloc bdev) + spdk_nvme_perf over uiw, beside SPDK's own NVMe/TCP transport, in one run.
#
# Not a CI test: SPDK is not packaged in Debian 12; you supply the sources. See README.md,
# section "NVMe-oF with SPDK", and `run.sh --help`.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: perftest/spdk/run.sh build --spdk DIR --isal DIR --isal-crypto DIR [--work DIR]
       perftest/spdk/run.sh bench [--work DIR] [--time SECS] [--reps N] [--uiw PATH]
                                  [--tcp-only|--rdma-only] [--alternate N] [--count QD]
                                  [--threads QD]
       perftest/spdk/run.sh all   --spdk DIR --isal DIR --isal-crypto DIR [--work DIR] [--time SECS]

build   Copy the SPDK tree (and isa-l / isa-l_crypto, checked out at the commits SPDK pins:
        `git ls-tree HEAD isa-l isa-l-crypto` in the SPDK repository) into WORK/spdk, apply the
        two patches Debian 12's DPDK 22.11 needs, configure (--with-dpdk from pkg-config,
        --with-rdma, CONFIG_IPSEC_MB=n) and build nvmf_tgt and spdk_nvme_perf.
        Your trees are never modified.
bench   Run nvmf_tgt + spdk_nvme_perf (each pinned to its own core) over uiw's RDMA (both under
        `uiw run`) and over SPDK's NVMe/TCP on 127.0.0.1, data verified, and print a table of
        medians over --reps interleaved repetitions: 4 KiB random read / write at QD1 and QD16,
        128 KiB sequential read / write at QD16.
all     build, then bench.

Options:
  --spdk DIR          SPDK checkout (tested: v26.05)
  --isal DIR          isa-l checkout at SPDK's pinned commit
  --isal-crypto DIR   isa-l_crypto checkout at SPDK's pinned commit
  --work DIR          build and run directory (default /tmp/uiw-spdk)
  --time SECS         seconds per perf run (default 10)
  --reps N            run every row N times, the transports interleaved within each repetition
                      (rdma, tcp, rdma, tcp, ...), and print each cell's median with its range
                      and the ratio of the medians (default 3; one run of a row swings by up to 2x
                      on a shared machine)
  --uiw PATH          the uiw CLI (default: target/release/uiw of this repository)
  --no-huge           run SPDK with --no-huge -s 1024 (default: hugepages if 2 MiB pages are free)
  --count QD          instead of the table: the target under callgrind (instrumented only while a
                      run goes), one 4 KiB random read run at queue depth QD over each transport
                      (slowed down about 50 times: the target is the bottleneck), and the
                      target's instructions per I/O, by library — deterministic where IOPS are
                      not, to compare builds by. No data verification in this mode.
  --threads QD        instead of the table: a 4 KiB random read run at queue depth QD over each
                      transport and, over 2 s in its middle, every thread of the target and the
                      host: wake-ups (voluntary context switches) and preemptions (involuntary
                      ones) per second and CPU share, from /proc (issue 9: no uiw thread may
                      compete for a reactor's core; a reactor preempted a thousand times a second
                      is one that does). Needs SECS of at least 4.
  --alternate N       instead of the table: N rounds of 4 KiB random reads at QD1 for SECS seconds,
                      over uiw's RDMA then NVMe/TCP, on the same target, each round's ratio
                      printed (the machine's speed moves both; the ratio is what to read)
Prerequisites (Debian 12):
  apt-get install libdpdk-dev python3-jinja2 python3-tabulate libaio-dev nasm libcunit1-dev \
      libjson-c-dev libnuma-dev uuid-dev libssl-dev libncurses-dev pkg-config autoconf automake \
      libtool python3-pyelftools libkeyutils-dev librdmacm-dev libibverbs-dev
USAGE
}

say() { echo "spdk-run: $*" >&2; }
die() { say "error: $*"; exit 1; }

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cmd=${1:-}; [ $# -gt 0 ] && shift
spdk_src= isal_src= isalc_src= work=/tmp/uiw-spdk secs=10 reps=3 uiw= nohuge=0 modes="rdma tcp" alternate=0 count=0 threads=0
while [ $# -gt 0 ]; do
    case "$1" in
        --spdk) spdk_src=$2; shift 2 ;;
        --isal) isal_src=$2; shift 2 ;;
        --isal-crypto) isalc_src=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        --time) secs=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --uiw) uiw=$2; shift 2 ;;
        --no-huge) nohuge=1; shift ;;
        --tcp-only) modes="tcp"; shift ;;
        --rdma-only) modes="rdma"; shift ;;
        --alternate) alternate=$2; shift 2 ;;
        --count) count=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument '$1'" ;;
    esac
done

# --- build -------------------------------------------------------------------------------------

build() {
    [ -n "$spdk_src" ] && [ -f "$spdk_src/configure" ] && [ -f "$spdk_src/lib/env_dpdk/env.mk" ] ||
        die "--spdk DIR must be an SPDK checkout (no configure / lib/env_dpdk/env.mk in '$spdk_src')"
    [ -n "$isal_src" ] && [ -f "$isal_src/Makefile.am" ] ||
        die "--isal DIR must be an isa-l checkout (github.com/intel/isa-l at the commit SPDK pins)"
    [ -n "$isalc_src" ] && [ -f "$isalc_src/Makefile.am" ] ||
        die "--isal-crypto DIR must be an isa-l_crypto checkout (github.com/intel/isa-l_crypto at the commit SPDK pins)"
    pkg-config --exists libdpdk || die "pkg-config finds no libdpdk: apt-get install libdpdk-dev"
    local dpdk_ver; dpdk_ver=$(pkg-config --modversion libdpdk)
    case "$dpdk_ver" in 22.11*) ;; *) say "warning: DPDK $dpdk_ver; these patches are for Debian 12's 22.11" ;; esac
    if ! python3 -c 'import jinja2, tabulate' 2>/dev/null; then
        # e.g. a pyenv python3 first in PATH: Debian's python3-jinja2/-tabulate serve /usr/bin/python3.
        /usr/bin/python3 -c 'import jinja2, tabulate' 2>/dev/null ||
            die "SPDK's build needs python3-jinja2 and python3-tabulate (apt-get install python3-jinja2 python3-tabulate)"
        say "$(command -v python3) lacks jinja2/tabulate; building with /usr/bin first in PATH"
        export PATH=/usr/bin:$PATH
    fi

    local dst=$work/spdk
    mkdir -p "$work"
    if [ -f "$dst/.uiw-copied" ]; then
        say "reusing the copy in $dst (delete it to start over)"
    else
        say "copying $spdk_src -> $dst (your tree stays untouched)"
        rm -rf "$dst"; mkdir -p "$dst"
        (cd "$spdk_src" && tar c --exclude=.git --exclude=./build .) | (cd "$dst" && tar x)
        rm -rf "$dst/isa-l" "$dst/isa-l-crypto"; mkdir -p "$dst/isa-l" "$dst/isa-l-crypto"
        (cd "$isal_src" && tar c --exclude=.git .) | (cd "$dst/isa-l" && tar x)
        (cd "$isalc_src" && tar c --exclude=.git .) | (cd "$dst/isa-l-crypto" && tar x)
        touch "$dst/.uiw-copied"
    fi

    # Patch 1: SPDK v26.01+ links librte_log and librte_argparse, which DPDK 22.11 does not have
    # (rte_log lives inside librte_eal there). Keep them only where the DPDK has them.
    local libdir; libdir=$(pkg-config --variable=libdir libdpdk)
    local envmk=$dst/lib/env_dpdk/env.mk
    for lib in rte_log rte_argparse; do
        if ! ls "$libdir"/lib$lib.so* >/dev/null 2>&1 && grep -qE "^DPDK_LIB_LIST = .*\b$lib\b" "$envmk"; then
            say "patch: $envmk: not linking $lib (absent in DPDK $dpdk_ver at $libdir)"
            sed -i -E "/^DPDK_LIB_LIST = /s/ $lib\b//" "$envmk"
        fi
    done
    # Patch 2: the runtime check accepts 22.11.0-22.11.4 only (fearing a private-ABI change in a
    # later LTS release); Debian 12 ships 22.11.x with x > 4, whose rte_bus_pci layout SPDK uses
    # unchanged. Accept the installed minor release.
    local pcic=$dst/lib/env_dpdk/pci_dpdk.c minor=${dpdk_ver##*.}
    if [[ "$dpdk_ver" == 22.11.* ]] && grep -q 'if (minor > 4) {' "$pcic"; then
        say "patch: $pcic: accept DPDK 22.11.$minor (the check allows 22.11.0-22.11.4)"
        sed -i "s/if (minor > 4) {/if (minor > $minor) { \/* uiw run.sh: was 4 *\//" "$pcic"
    fi

    cd "$dst"
    if [ ! -f mk/config.mk ] || [ ! -f .uiw-configured ]; then
        say "configure (log: $work/configure.log)"
        ./configure --with-dpdk --with-rdma --without-crypto --without-vhost --without-virtio \
            --without-uring --without-xnvme --without-ocf --without-vfio-user \
            --without-idxd --without-nvme-cuse --disable-tests --disable-unit-tests --disable-examples \
            >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log"; die "configure failed"; }
        # configure turns IPSEC_MB on when the DPDK was built with it (Debian's is), which would
        # build the absent intel-ipsec-mb submodule; SPDK needs none of it for NVMe-oF.
        sed -i -E 's/^CONFIG_IPSEC_MB\??=.*/CONFIG_IPSEC_MB?=n/' mk/config.mk
        grep -q '^CONFIG_IPSEC_MB?=n' mk/config.mk || die "could not set CONFIG_IPSEC_MB=n in mk/config.mk"
        say "mk/config.mk: CONFIG_IPSEC_MB=n"
        touch .uiw-configured
    fi
    say "make -j$(nproc) (log: $work/build.log; a few minutes)"
    if ! make -j"$(nproc)" >"$work/build.log" 2>&1; then
        # isa-l_crypto's .asm -> .s intermediates can race under parallel make ("nasm: unable to
        # open input file aes/gcm_multibinary_nt.s"); a second pass finds them and goes on.
        say "make failed; once more (log: $work/build2.log)"
        make -j"$(nproc)" >"$work/build2.log" 2>&1 || { tail -40 "$work/build2.log"; die "make failed twice"; }
    fi
    # bdevperf (an example app) is the host that verifies data; build it alone.
    make -C examples/bdev/bdevperf >>"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; die "make bdevperf failed"; }
    [ -x build/bin/nvmf_tgt ] && [ -x build/bin/spdk_nvme_perf ] && [ -x build/examples/bdevperf ] ||
        die "build finished without build/bin/nvmf_tgt and build/bin/spdk_nvme_perf"
    say "built: $dst/build/bin/nvmf_tgt $dst/build/bin/spdk_nvme_perf"
}

# --- bench -------------------------------------------------------------------------------------

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

pids=()
cleanup() {
    local p
    for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
    if [ -n "${UIW_STATE_DIR:-}" ] && [ -n "$uiw" ]; then "$uiw" down >/dev/null 2>&1 || true; fi
}

# "Total : IOPS MiB/s avg min max" from spdk_nvme_perf's summary
perf_total() { awk -F: '/^Total/ { split($2, f, " "); printf "%s %s %s\n", f[1], f[2], f[3] }' "$1"; }
# ratio A B: A/B to two decimals, or "-" when either is missing or zero
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", a/b; else print "-" }'; }

# count_per_io (inside bench, the target under callgrind): per transport, one 4 KiB random read
# run at QD $count with the target instrumented for exactly that run, its counts dumped, and the
# target's instructions per I/O printed by library.
count_per_io() {
    local vg m log total ios
    vg=$(pgrep -f -- "--callgrind-out-file=$run/cg.out" | head -1)
    [ -n "$vg" ] || die "no callgrind process for $run/cg.out"
    echo "SPDK $(cat "$work/spdk/VERSION" 2>/dev/null || echo '?') nvmf_tgt under callgrind (core 0) + spdk_nvme_perf (core 1): 4 KiB randread QD $count, ${secs}s, $(date -u +%FT%TZ)"
    for m in $modes; do
        log=$run/count-$m.log
        callgrind_control -z "$vg" >/dev/null 2>&1
        callgrind_control -i on "$vg" >/dev/null 2>&1
        total=$(perf_run "$m" randread 4096 "$count" "$log") || { tail -20 "$log" >&2; die "perf over $m failed (log $log)"; }
        callgrind_control -i off "$vg" >/dev/null 2>&1
        callgrind_control -d "$m" "$vg" >/dev/null 2>&1
        ios=$(awk -v i="${total%% *}" -v s="$secs" 'BEGIN { printf "%.0f", i * s }')
        local dump; dump=$(ls -t "$run"/cg.out.* | head -1)
        echo "$m: ${total%% *} IOPS under callgrind, $ios I/Os; target instructions per I/O:"
        callgrind_annotate --inclusive=no --threshold=100 --auto=no "$dump" 2>/dev/null |
            awk -v ios="$ios" '/^ *[0-9,]+ .*\[.*\] *$/ { n = $1; gsub(",", "", n); o = $NF; gsub(/^\[|\]$/, "", o); sub(/.*\//, "", o); by[o] += n; t += n }
                END { for (o in by) if (by[o] / ios >= 10) printf "  %8.0f  %s\n", by[o] / ios, o; printf "  %8.0f  total\n", t / ios }' |
            sort -rn
    done
}

# thread_stats PID...: "pid comm voluntary involuntary cpu-ticks" for every thread of the PIDs
thread_stats() {
    local p t
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            [ -r "$t/status" ] || continue
            printf '%s %s %s %s\n' "$p" "$(tr ' ' _ <"$t/comm")" \
                "$(awk '/^voluntary_ctxt_switches/ { v = $2 } /^nonvoluntary_ctxt_switches/ { n = $2 } END { print v, n }' "$t/status")" \
                "$(awk '{ print $14 + $15 }' "$t/stat")"
        done
    done
}

# threads_per_run (inside bench): per transport, one 4 KiB random read run at QD $threads, and
# each thread of the target and the host over 2 s in its middle.
threads_per_run() {
    local m log tgt host a b hz
    [ "$secs" -ge 4 ] || die "--threads needs --time of at least 4 (2 s are looked at in the middle)"
    hz=$(getconf CLK_TCK)
    tgt=${pids[0]}
    # `uiw run` execs the target: its pid is the target's.
    echo "SPDK $(cat "$work/spdk/VERSION" 2>/dev/null || echo '?') nvmf_tgt (core 0) + spdk_nvme_perf (core 1): 4 KiB randread QD $threads, threads over 2 s, $(date -u +%FT%TZ)"
    for m in $modes; do
        log=$run/threads-$m.log
        $(host "$m") "$bin/spdk_nvme_perf" -c 0x2 "${mem[@]}" -r "$(trid "$m")" -w randread -o 4096 -q "$threads" \
            -t "$secs" >"$log" 2>&1 &
        local perf=$!
        sleep $(((secs - 2) / 2))
        host=$(pgrep -f -- "spdk_nvme_perf -c 0x2 .*$(trid "$m" | cut -d' ' -f1)" | head -1)
        a=$(thread_stats "$tgt" $host)
        sleep 2
        b=$(thread_stats "$tgt" $host)
        wait "$perf" || { tail -20 "$log" >&2; die "perf over $m failed (log $log)"; }
        echo "$m: $(perf_total "$log" | cut -d' ' -f1) IOPS; per thread (target $tgt, host ${host:-?}):"
        join <(echo "$a" | awk '{ print $1 "/" $2 "/" NR, $3, $4, $5 }' | sort) \
             <(echo "$b" | awk '{ print $1 "/" $2 "/" NR, $3, $4, $5 }' | sort) |
            awk -v hz="$hz" '{ split($1, k, "/"); w = ($5 - $2) / 2; p = ($6 - $3) / 2; c = ($7 - $4) / 2 / hz * 100
                if (w + p + c > 0) printf "  %-6s %-7s %-16s wake-ups %6.0f/s  preempted %6.0f/s  cpu %5.1f %%\n",
                    (k[1] == "'"$tgt"'" ? "target" : "host"), k[1], k[2], w, p, c }'
    done
}

bench() {
    local bin=$work/spdk/build/bin ex=$work/spdk/build/examples
    [ -x "$bin/nvmf_tgt" ] && [ -x "$bin/spdk_nvme_perf" ] || die "no SPDK build in $work/spdk: run '$0 build ...' first"
    [ -x "$ex/bdevperf" ] || die "no $ex/bdevperf (the data-verifying host): run '$0 build ...' again"
    if [ -z "$uiw" ]; then uiw=$repo/target/release/uiw; fi
    [ -x "$uiw" ] || die "no uiw CLI at $uiw: cargo build --release (or --uiw PATH)"
    [ "$(nproc)" -ge 2 ] || die "needs 2 cores: the target and the host each get their own"
    local mem=(--no-huge -s 1024)
    if [ "$nohuge" = 0 ] && [ "$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)" -ge 1024 ]; then
        mem=(-s 1024)
    fi
    local run=$work/run; rm -rf "$run"; mkdir -p "$run"
    # Built against a packaged DPDK, SPDK is a set of shared libraries in build/lib.
    export LD_LIBRARY_PATH=$work/spdk/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export UIW_STATE_DIR=$run/uiw-state
    trap cleanup EXIT
    "$uiw" up >"$run/uiw-up.log" 2>&1 || { cat "$run/uiw-up.log"; die "uiw up failed"; }
    local rport tport nqn=nqn.2016-06.io.spdk:uiw-bench
    rport=$(free_port); tport=$(free_port)
    cat >"$run/tgt.json" <<JSON
{ "subsystems": [
  { "subsystem": "bdev", "config": [
    { "method": "bdev_malloc_create", "params": { "name": "Malloc0", "num_blocks": 65536, "block_size": 4096 } } ] },
  { "subsystem": "nvmf", "config": [
    { "method": "nvmf_create_transport", "params": { "trtype": "RDMA" } },
    { "method": "nvmf_create_transport", "params": { "trtype": "TCP" } },
    { "method": "nvmf_create_subsystem", "params": { "nqn": "$nqn", "allow_any_host": true, "serial_number": "UIW0001" } },
    { "method": "nvmf_subsystem_add_ns", "params": { "nqn": "$nqn", "namespace": { "bdev_name": "Malloc0" } } },
    { "method": "nvmf_subsystem_add_listener", "params": { "nqn": "$nqn", "listen_address":
        { "trtype": "RDMA", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "$rport" } } },
    { "method": "nvmf_subsystem_add_listener", "params": { "nqn": "$nqn", "listen_address":
        { "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "$tport" } } } ] } ] }
JSON
    say "nvmf_tgt on core 0 under uiw run (RDMA 127.0.0.1:$rport, TCP 127.0.0.1:$tport, malloc 256 MiB; log $run/tgt.log)"
    local tgt_pre=() wait_s=60
    if [ "$count" != 0 ]; then
        command -v valgrind >/dev/null && command -v callgrind_control >/dev/null || die "--count needs valgrind (apt-get install valgrind)"
        tgt_pre=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$run/cg.out")
        wait_s=300
    fi
    "$uiw" run -- "${tgt_pre[@]}" "$bin/nvmf_tgt" -m 0x1 -u "${mem[@]}" -r "$run/tgt.sock" --json "$run/tgt.json" \
        >"$run/tgt.log" 2>&1 &
    pids+=($!)
    local i
    for i in $(seq 1 "$wait_s"); do
        grep -q "NVMe/TCP Target Listening" "$run/tgt.log" && grep -q "NVMe/RDMA Target Listening" "$run/tgt.log" && break
        kill -0 "${pids[0]}" 2>/dev/null || { cat "$run/tgt.log"; die "nvmf_tgt exited"; }
        sleep 1
    done
    grep -q "NVMe/RDMA Target Listening" "$run/tgt.log" || { cat "$run/tgt.log"; die "nvmf_tgt is not listening on RDMA after $wait_s s"; }

    host() { # transport → the command prefix that runs a host program for it
        if [ "$1" = rdma ]; then echo "$uiw run --"; fi
    }
    trid() {
        if [ "$1" = rdma ]; then echo "trtype:RDMA adrfam:IPv4 traddr:127.0.0.1 trsvcid:$rport subnqn:$nqn"
        else echo "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$tport subnqn:$nqn"; fi
    }

    # perf_run MODE WORKLOAD SIZE QD LOG: one spdk_nvme_perf run on core 1 over MODE; prints its
    # total "IOPS MiB/s avg-us" (fails if the run did).
    perf_run() {
        $(host "$1") "$bin/spdk_nvme_perf" -c 0x2 "${mem[@]}" -r "$(trid "$1")" \
            -w "$2" -o "$3" -q "$4" -t "$secs" >"$5" 2>&1 && perf_total "$5"
    }

    # 1. Data verified: bdevperf's verify workload writes a pattern, reads it back and compares
    #    every byte (a mismatch fails the job); 4 KiB QD16 and 128 KiB QD16, over each transport.
    local m bs fail=0
    local modes_verify=$modes
    if [ "$count" != 0 ] || [ "$threads" != 0 ]; then modes_verify=; fi
    for m in $modes_verify; do
        local TR; TR=$(echo "$m" | tr a-z A-Z)
        local port=$rport; [ "$m" = tcp ] && port=$tport
        cat >"$run/host-$m.json" <<JSON
{ "subsystems": [ { "subsystem": "bdev", "config": [
  { "method": "bdev_nvme_attach_controller", "params": { "name": "Nvme0", "trtype": "$TR", "adrfam": "IPv4",
      "traddr": "127.0.0.1", "trsvcid": "$port", "subnqn": "$nqn" } },
  { "method": "bdev_wait_for_examine" } ] } ] }
JSON
        for bs in 4096 131072; do
            local log=$run/verify-$m-$bs.log
            say "verify: bdevperf -w verify -o $bs -q 16 -t $secs over $m (core 1)"
            if $(host "$m") "$ex/bdevperf" -m 0x2 -u "${mem[@]}" -r "$run/host.sock" --json "$run/host-$m.json" \
                    -q 16 -o "$bs" -w verify -t "$secs" >"$log" 2>&1 &&
               ! grep -qiE "miscompare|mismatch|error while" "$log"; then
                say "  ok: $(grep -E '^\s*Total' "$log" | tail -1 | tr -s ' ')"
            else
                fail=1; tail -20 "$log" >&2; say "  FAILED: data verification over $m, $bs bytes (log $log)"
            fi
        done
    done

    # 2. Speed: spdk_nvme_perf on core 1, the target on core 0.
    # The malloc bdev's memory is touched for the first time by the reads of the first rows: on
    # shared memory (--no-huge) each first touch allocates and zeroes a page in the target's
    # reactor, and the transport measured first (rdma) paid for it (34-38K IOPS at 4 KiB QD1
    # where the same target gave 40K once warm). A sequential write over the whole bdev first.
    # (Over NVMe/TCP, whose listener the target always has: the warm-up measures nothing.)
    say "warm-up: 128 KiB sequential writes at QD16 for 2 s over NVMe/TCP (every block of the bdev touched)"
    "$bin/spdk_nvme_perf" -c 0x2 "${mem[@]}" -r "$(trid tcp)" -w write -o 131072 -q 16 -t 2 >"$run/warm-up.log" 2>&1 ||
        { tail -20 "$run/warm-up.log" >&2; die "warm-up failed (log $run/warm-up.log)"; }
    if [ "$count" != 0 ]; then
        count_per_io
        return
    fi
    if [ "$threads" != 0 ]; then
        threads_per_run
        return
    fi
    if [ "$alternate" -gt 0 ]; then
        local k r t
        for k in $(seq 1 "$alternate"); do
            r=$(perf_run rdma randread 4096 1 "$run/alternate-rdma-$k.log" || true)
            t=$(perf_run tcp randread 4096 1 "$run/alternate-tcp-$k.log" || true)
            echo "round $k: 4 KiB randread QD1 IOPS: rdma ${r%% *}, tcp ${t%% *}, uiw/TCP $(ratio "${r%% *}" "${t%% *}")"
        done
        return
    fi
    [ "$reps" -ge 1 ] 2>/dev/null || die "--reps N needs a whole number of at least 1"
    local loads=("randread 4096 1" "randread 4096 16" "randwrite 4096 1" "randwrite 4096 16"
                 "read 131072 16" "write 131072 16")
    local cells=$run/cells k w order
    mkdir -p "$cells"
    # Repetition after repetition, every row once each time: a row's samples spread over the
    # whole run, and within a row the transports take turns going first.
    for k in $(seq 1 "$reps"); do
        order=$modes
        if [ $((k % 2)) = 0 ]; then order=$(echo "$modes" | tr ' ' '\n' | tac | xargs); fi
        for w in "${loads[@]}"; do
            set -- $w
            for m in $order; do
                local log=$run/perf-$m-$1-$2-$3-$k.log total
                say "perf ($k/$reps): $1 -o $2 -q $3 -t $secs over $m"
                if total=$(perf_run "$m" "$1" "$2" "$3" "$log") && [ -n "$total" ]; then
                    echo "$k $total" >>"$cells/$m-$1-$2-$3"
                else
                    fail=1; tail -20 "$log" >&2; say "  FAILED (log $log)"
                fi
            done
        done
    done
    # median FILE COLUMN: the median of a column of "rep IOPS MiB/s avg-us" lines ("-" if none)
    median() {
        [ -s "$1" ] || { echo -; return; }
        awk -v c="$2" '{ print $c }' "$1" | sort -g |
            awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
    }
    # range FILE: "min-max" of the IOPS column
    range() {
        [ -s "$1" ] || { echo -; return; }
        awk '{ print $2 }' "$1" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.0f-%.0f", lo, hi }'
    }
    # per_rep A B: the ratio A/B of each repetition's IOPS where both ran
    per_rep() {
        [ -s "$1" ] && [ -s "$2" ] || return 0
        join <(sort -k1,1 "$1") <(sort -k1,1 "$2") | sort -n | awk '{ printf "%s%.2f", (NR > 1 ? " " : ""), ($5 > 0 ? $2 / $5 : 0) }'
    }

    echo
    echo "SPDK $(cat "$work/spdk/VERSION" 2>/dev/null || echo '?') nvmf_tgt (malloc bdev, core 0) + spdk_nvme_perf (core 1), ${secs}s each, $reps repetition(s), medians, $(date -u +%FT%TZ)"
    printf '%-10s %7s %3s' workload size qd
    for m in $modes; do printf ' | %-5s %10s %15s %8s %8s' "$m" IOPS "(range)" MiB/s "avg us"; done
    [ "$modes" = "rdma tcp" ] && printf ' | %s' "uiw/TCP IOPS (per repetition)"
    echo
    for w in "${loads[@]}"; do
        set -- $w
        printf '%-10s %7s %3s' "$1" "$2" "$3"
        local med=()
        for m in $modes; do
            local f=$cells/$m-$1-$2-$3
            printf ' | %-5s %10s %15s %8s %8s' "" "$(median "$f" 2)" "($(range "$f"))" "$(median "$f" 3)" "$(median "$f" 4)"
            med+=("$(median "$f" 2)")
        done
        if [ "$modes" = "rdma tcp" ]; then
            printf ' | %s (%s)' "$(ratio "${med[0]}" "${med[1]}")" "$(per_rep "$cells/rdma-$1-$2-$3" "$cells/tcp-$1-$2-$3")"
        fi
        echo
    done
    echo
    local warn
    warn=$(cat "$run/tgt.log" "$run"/perf-*.log "$run"/verify-*.log 2>/dev/null |
        grep -E '\*(WARNING|ERROR)\*|responder_resources|initiator_depth' | sed -E 's/^\[[^]]*\] //' | sort | uniq -c || true)
    if [ -n "$warn" ]; then
        echo "SPDK printed these warnings/errors (count, message):"; echo "$warn"
    else
        echo "SPDK printed no *WARNING* or *ERROR* line (target, hosts)."
    fi
    [ "$fail" = 0 ] || die "some runs failed (logs in $run)"
}

case "$cmd" in
    build) build ;;
    bench) bench ;;
    all) build; bench ;;
    -h|--help|"") usage ;;
    *) usage >&2; die "unknown command '$cmd'" ;;
esac
