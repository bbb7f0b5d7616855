#!/usr/bin/env python3
"""bench/RESULTS.md's current tables are the numbers of the run they cite.

    python3 tests/results_tables.py ROOT

Finds the archive RESULTS.md names as its run ("this run:
`bench/data/...-current-....tar.gz`"), unpacks it into a temporary
directory, prints the tables bench/current_tables.py makes from it, and
checks that every row of the decode, tensor-core, integer, mma.sync,
Marlin FP4, Marlin INT4, sustained-load, sequence and MoE tables is in
RESULTS.md as it is.  A section measured again later names its own run ("this run of moe:
`bench/data/....tar.gz`, directory `DIR`"): its rows come from there.
Exit 0, or 1 naming the first rows that are not (a number edited by hand,
a table from another run, a table left out).
"""
import os
import re
import subprocess
import sys
import tarfile
import tempfile

SECTIONS = ("decode", "tc", "int", "mma", "marlin", "int4peers", "sustained_fp4", "sustained_int4", "sequence", "moe")


def tables(root, archive, subdir, sections):
    """current_tables.py's output for sections, from the run in archive
    (its one top directory, or subdir of it when given)."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(tmp)
        dirs = [os.path.join(tmp, d) for d in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, d))]
        run = dirs[0] if len(dirs) == 1 else tmp
        if subdir:
            run = os.path.join(run, subdir)
        cmd = [sys.executable, os.path.join(root, "bench", "current_tables.py"), run]
        for s in sections:
            cmd += ["--section", s]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = open(os.path.join(root, "bench", "RESULTS.md")).read()
    m = re.search(r"this run:\s*`(bench/data/[^`]*-current-[^`]*\.tar\.gz)`", results)
    if not m:
        print("results_tables: RESULTS.md names no run archive (this run: `bench/data/...-current-....tar.gz`)")
        return 1
    runs = {}  # (archive, subdir) -> sections
    later = {}
    for o in re.finditer(r"this run of (\w+):\s*`(bench/data/[^`]*\.tar\.gz)`(?:,\s*directory\s*`([^`]+)`)?",
                         results):
        if o.group(1) in SECTIONS:
            later[o.group(1)] = (o.group(2), o.group(3))
    for s in SECTIONS:
        runs.setdefault(later.get(s, (m.group(1), None)), []).append(s)
    out = "".join(tables(root, os.path.join(root, a), d, secs) for (a, d), secs in runs.items())
    bad, rows, seen = [], 0, set()
    section = None
    for line in out.splitlines():
        s = re.match(r"<!-- (\w+) -->", line)
        if s:
            section = s.group(1)
            seen.add(section)
            continue
        if line.startswith("|"):
            rows += 1
            if line not in results:
                bad.append("%s: %s" % (section, line))
    missing = [s for s in SECTIONS if s not in seen]
    if missing:
        bad.append("no table made for: %s" % ", ".join(missing))
    names = [m.group(1)] + ["%s (%s)" % (a, s) for s, (a, _) in sorted(later.items())]
    print("results_tables: %s, %d rows of %d sections, %d not in RESULTS.md" % (", ".join(names), rows, len(seen),
                                                                                 len(bad)))
    for b in bad[:10]:
        print("  " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
