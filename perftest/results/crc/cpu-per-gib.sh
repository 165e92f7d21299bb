#!/bin/bash
# CPU time of the passive server per GiB moved, MPA CRC on vs off, alternating:
#   ib_write_bw server: its progress thread receives 1 MiB Writes (rx path: recvmsg into
#     registered memory, + CRC over the placed bytes);
#   ib_read_bw server: its progress thread sends 1 MiB Read Responses (tx path: CRC over
#     registered memory, + sendmsg from it).
# The application threads of these servers only wait; the clients busy-poll (not measured).
export UIW_STATE_DIR=/tmp/uiw-h-crc-bench
U=${U:-/work/h-crc/target/release/uiw}
N=${N:-2000}
for i in $(seq 1 ${R:-3}); do
  for prog in ib_write_bw ib_read_bw; do
    for c in 0 1; do
      /usr/bin/time -f "%U %S %e" -o /tmp/crc-runs/cpu-srv.txt env UIW_CRC=$c $U run -- $prog -d uiw_lo -x 0 -F -s 1048576 -n $N -p 23111 >/dev/null 2>&1 & S=$!
      sleep 0.5
      env UIW_CRC=$c $U run -- $prog -d uiw_lo -x 0 -F -s 1048576 -n $N -p 23111 127.0.0.1 > /tmp/crc-runs/cpu-out.txt 2>&1
      wait $S
      bw=$(grep -A1 'BW peak' /tmp/crc-runs/cpu-out.txt | tail -1 | awk '{print $4}')
      read u s e < /tmp/crc-runs/cpu-srv.txt
      echo "$prog crc=$c server_cpu_s=$(echo "$u + $s" | bc) per_GiB=$(echo "scale=3; ($u + $s) * 1024 / $N" | bc) bw_avg_MBps=$bw load=$(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
