#!/usr/bin/env python3
"""locked.py LIBRARY TURNS CALLGRIND_OUT... — locked instructions per turnaround.

Reads callgrind outputs made with --dump-instr=yes (see run.sh) that together hold TURNS
turnarounds, takes the execution count of every instruction of LIBRARY they collected, finds
in `objdump -d LIBRARY` the instructions that lock the bus (a `lock` prefix, or `xchg` with
memory: each a full barrier, tens of cycles), and prints how many ran per turnaround, and
where.
"""
import collections
import re
import subprocess
import sys


def executed(path):
    """(object, address) -> times executed, from a callgrind file with instruction positions."""
    names, counts = {}, collections.Counter()
    obj, last, after_call = None, 0, False
    for line in open(path):
        line = line.rstrip("\n")
        m = re.match(r"(c?ob)=\((\d+)\)(?: (.*))?$", line)
        if m:
            if m.group(3):
                names[m.group(2)] = m.group(3)
            if m.group(1) == "ob":
                obj = names.get(m.group(2))
            continue
        if line.startswith("calls="):
            after_call = True  # the next cost line is the call's inclusive cost
            continue
        if not line or line[0] not in "0123456789+-*":
            continue
        fields = line.split()
        pos = fields[0]
        if pos == "*":
            addr = last
        elif pos[0] in "+-":
            addr = last + int(pos, 0)
        else:
            addr = int(pos, 0)
        last = addr
        if after_call:
            after_call = False
            continue
        if len(fields) >= 3:
            counts[(obj, addr)] += int(fields[2])
    return counts


def locked_instructions(lib):
    """address -> (function, instruction) for the locked instructions of lib."""
    out, fn = {}, None
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", lib], capture_output=True, text=True, check=True).stdout
    for line in dis.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:", line)
        if m:
            fn = m.group(1)
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if m and (m.group(2).startswith("lock ") or (m.group(2).startswith("xchg") and "(" in m.group(2))):
            out[int(m.group(1), 16)] = (fn, m.group(2))
    return out


def main():
    lib, turns, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    locked = locked_instructions(lib)
    total, where = 0, collections.Counter()
    counts = collections.Counter()
    for path in paths:
        counts.update(executed(path))
    for (obj, addr), n in counts.items():
        if obj and obj.endswith(lib.rsplit("/", 1)[-1]) and addr in locked:
            total += n
            fn, ins = locked[addr]
            where[(ins.split()[0] + " " + ins.split()[1] if " " in ins else ins, re.sub(r"::h[0-9a-f]{16}$", "", fn)[:100])] += n
    print("locked instructions per turnaround: %.2f" % (total / turns))
    for (ins, fn), n in where.most_common():
        if n / turns >= 0.05:
            print("  %5.2f  %-22s %s" % (n / turns, ins, fn))


if __name__ == "__main__":
    main()
