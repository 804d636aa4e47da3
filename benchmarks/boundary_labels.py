"""The tie / one-flip / shift table: label and interval of the fixed and the sequential path at the boundary.

    python benchmarks/boundary_labels.py

Accuracies are k/2000 (a 2,000-example eval set: one flipped example is 0.05 points); B is 95% on every seed,
A = B + d. Fixed path: precswitch.analysis.paired (one comparison, t-test); sequential path:
precswitch.analysis.sequential.decide at its last look (max_seeds reached). Issue 38 item 4.
"""
from __future__ import annotations

import inspect
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from precswitch.analysis import paired, sequential  # noqa: E402

N_EXAMPLES, MARGIN, ALPHA = 2000, 1.0, 0.05
CASES = {
    "ties 3x0": [0, 0, 0],
    "one flip [+0.05,0,0]": [0.05, 0, 0],
    "shift 3x-2": [-2, -2, -2],
    "[-2,-2.05,-2]": [-2, -2.05, -2],
    "8x-0.05": [-0.05] * 8,
    "ties 5x0": [0] * 5,
    "shift 5x-0.05": [-0.05] * 5,
}


def fixed(d):
    b = [0.95] * len(d)
    a = [round((0.95 + x / 100) * N_EXAMPLES) / N_EXAMPLES for x in d]
    kw = {"resolution": 100 / N_EXAMPLES} if "resolution" in inspect.signature(paired.paired_contrast).parameters else {}
    r = paired.paired_contrast(a, b, scale=100.0, margin=MARGIN, alpha=ALPHA, **kw)
    r["p_holm"] = r["p_t"]
    return paired.classify(r, ALPHA, True), r["ci_low"], r["ci_high"]


def seq(d):
    kw = {"resolution": 100 / N_EXAMPLES} if "resolution" in inspect.signature(sequential.decide).parameters else {}
    r = sequential.decide(d, MARGIN, ALPHA, max_seeds=len(d), **kw)
    return r["decision"], r["lo"], r["hi"]


def ci(lo, hi):
    return "none" if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{lo:+.3f}, {hi:+.3f}]"


def main() -> int:
    print(f"| d (points) | fixed label | fixed {100 * (1 - ALPHA):g}% CI | sequential decision | sequence interval |")
    print("| --- | --- | --- | --- | --- |")
    for name, d in CASES.items():
        fl, flo, fhi = fixed(d)
        sl, slo, shi = seq(d)
        print(f"| {name} | {fl} | {ci(flo, fhi)} | {sl} | {ci(slo, shi)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
