#!/usr/bin/env python
"""Are two studies' results the same? Compares runs.csv and schedules.csv of two results directories
column by column, as the text of each cell (equal text, equal bits; '2757.0' and '2757' are one double), leaving out what a rerun legitimately changes: clocks and throughput, memory,
the process and the machine, provenance (versions, commit, paths, load average, config hash).

    python benchmarks/same_results.py results/before results/after

Prints, per table, the rows matched, the columns compared, the columns left out (and why), the columns only
one side has, and every differing value; exits 1 when a compared value differs or (without --partial) a row
is on one side only (an empty cell equals an empty cell).
Used for issue 29 (a redesign that keeps behaviour): the default study before and after.

Across machines (issue 41): run the same config with `cpu_isa: avx2` on both (any x86 CPU with AVX2; oneDNN and
ATen then pick the kernels an AVX2-only CPU runs, so the values match to every digit) and the same results_dir
(the `init` column names it), copy one machine's results_dir to the other and compare:

    snakemake --cores 2 --config cpu_isa=avx2 results_dir=results/here      # on each machine
    python benchmarks/same_results.py results/here results/there

`cpu_capability` (AVX2 on both) is compared; `cpu_flags` (what each CPU has) is left out. Without the cap, an
AVX-512 BF16 and an AVX2-only EPYC differed in 25 of 60 values of one small study; with it, in none.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

# what a rerun changes by itself: (why, pattern matched against the column name)
LEFT_OUT = [
    ("time", r"seconds|per_second|steps_per_s|_ms$|_s$|time|eta|started|finished|timestamp|date|"
             r"^state_saves$"),  # resumable-state saves every checkpoint_every_minutes of wall time
    ("memory", r"memory|rss|bytes|_mib$|_mb$"),
    ("process", r"^pid$|process|hostname|load_avg|threads_used|oversubscribed"),
    ("provenance", r"version|git_|commit|path$|_path|hostname|config_hash|device_name|cpu_model|cpu_flags|energy|nvml|"
                   r"setup|overhead"),
]
KEYS = {"runs": ["run_id"], "schedules": ["schedule", "seed"]}


def why_left_out(column: str) -> str | None:
    for why, pattern in LEFT_OUT:
        if re.search(pattern, column):
            return why
    return None


def same_number(x: str, y: str) -> bool:
    """'2757.0' and '2757' are the same double: a column of ints is written with '.0' once a row lacks the
    value (an empty cell makes pandas read it as floats), so a table of fewer rows can print it without."""
    try:
        return float(x) == float(y)
    except ValueError:
        return False


def compare(name: str, before: Path, after: Path) -> int:
    # as text: pandas writes each float as the shortest text that reads back as the same double, so equal
    # text is equal bits (and an empty cell equals an empty cell)
    a = pd.read_csv(before / f"{name}.csv", dtype=str, keep_default_na=False)
    b = pd.read_csv(after / f"{name}.csv", dtype=str, keep_default_na=False)
    keys = KEYS[name]
    a, b = a.set_index(keys).sort_index(), b.set_index(keys).sort_index()
    only_a, only_b = sorted(set(a.columns) - set(b.columns)), sorted(set(b.columns) - set(a.columns))
    common = [c for c in a.columns if c in b.columns]
    left = {c: why_left_out(c) for c in common if why_left_out(c)}
    compared = [c for c in common if c not in left]
    rows = a.index.intersection(b.index)
    print(f"== {name}.csv: {len(rows)} rows in both ({len(a)} before, {len(b)} after)")
    print(f"   compared {len(compared)} columns: {', '.join(compared)}")
    print(f"   left out {len(left)}: " + "; ".join(
        f"{why}: {', '.join(c for c in left if left[c] == why)}" for why in dict.fromkeys(left.values())))
    if only_a:
        print(f"   only before: {', '.join(only_a)}")
    if only_b:
        print(f"   only after: {', '.join(only_b)}")
    missing = a.index.symmetric_difference(b.index)
    for key in missing:
        print(f"   row {key} is in {'before' if key in a.index else 'after'} only: not compared")
    differ = 0
    for col in compared:
        for key in rows:
            x, y = a.at[key, col], b.at[key, col]
            if x != y and not same_number(x, y):
                differ += 1
                print(f"   DIFFERS {key} {col}: {x!r} -> {y!r}")
    print(f"   {len(rows)} rows x {len(compared)} columns: " + ("identical" if not differ else f"{differ} values differ"))
    return differ, len(missing)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--partial", action="store_true",
                    help="compare the rows both have (a study still running): rows one side lacks do not fail")
    args = ap.parse_args()
    results = [compare(name, args.before, args.after) for name in ("runs", "schedules")]
    differ, missing = sum(r[0] for r in results), sum(r[1] for r in results)
    same = not differ and (args.partial or not missing)
    print("SAME" if same else "DIFFERENT", f"({differ} values differ, {missing} rows on one side only)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
