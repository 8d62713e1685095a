#!/usr/bin/env python3
"""The seed janitor's tree scan, for benchmarking kc-watchman against it.

Written for this benchmark from the seed's description
(../shared/seeds/001_519ead8abc7881dd.txt, ``_scan_supervisor_groups``):
groups are matched by the container ID carried in each process's argv, so
the scan reads every process's cmdline and, for the processes whose argv
carries a container ID, their stat (process group and start time, for the
member identity and the tree's age). No podman, no signals: this is only the
part of ``reap_orphaned_supervisors`` that looks at /proc.

Prints one JSON object: {"processes", "matches", "groups", "scan_seconds",
"scan_cpu_seconds", "trees": [[pgid, container_id], ...]}. The times are
measured inside the interpreter around the scan, so they exclude Python's
start-up.
"""

import json
import os
import sys
import time

HEX = frozenset("0123456789abcdef")


def _is_id(s):
    return len(s) == 64 and all(c in HEX for c in s)


def container_ids(argv):
    """Container IDs in argv: a whole element, or the value after '='."""
    out = []
    for a in argv:
        cid = None
        if _is_id(a):
            cid = a
        elif "=" in a:
            v = a.split("=", 1)[1]
            if _is_id(v):
                cid = v
        if cid is not None and cid not in out:
            out.append(cid)
    return out


def scan(proc="/proc"):
    with open(proc + "/uptime") as f:
        uptime = float(f.read().split()[0])
    hz = os.sysconf("SC_CLK_TCK")
    processes = matches = 0
    groups = {}  # container_id -> {"pgids": set, "members": [(pid, start)], "youngest_age_s"}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        processes += 1
        try:
            with open(f"{proc}/{name}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # gone, or not ours to read
        if not raw:
            continue  # kernel thread or zombie
        argv = raw.rstrip(b"\0").decode("utf-8", "replace").split("\0")
        ids = container_ids(argv)
        if not ids:
            continue
        matches += 1
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):
            continue
        pgid = int(fields[2])
        start = int(fields[19])
        age = uptime - start / hz
        for cid in ids:
            g = groups.setdefault(cid, {"pgids": set(), "members": [], "youngest_age_s": None})
            g["pgids"].add(pgid)
            g["members"].append((int(name), start))
            if g["youngest_age_s"] is None or age < g["youngest_age_s"]:
                g["youngest_age_s"] = age
    return processes, matches, groups


def main():
    proc = sys.argv[1] if len(sys.argv) > 1 else "/proc"
    t0, c0 = time.perf_counter(), time.process_time()
    processes, matches, groups = scan(proc)
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    trees = sorted([pgid, cid] for cid, g in groups.items() for pgid in g["pgids"])
    json.dump({
        "processes": processes,
        "matches": matches,
        "groups": len(groups),
        "scan_seconds": took,
        "scan_cpu_seconds": cpu,
        "trees": trees,
    }, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
