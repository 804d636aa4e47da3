#!/usr/bin/env python
"""Sequential seeds by simulation: error rates under repeated looks, seeds used, and the fixed design.

Each row simulates paired differences N(effect, sd^2) (points of accuracy), looks after every ``--step`` new
seeds from ``--start`` to ``--max-seeds`` with the anytime-valid confidence sequence of
precswitch.analysis.sequential, and stops at the first settled look. Columns: the rate of each final call
(different / equivalent / inconclusive at the maximum) and the mean seeds used, each +- its Monte Carlo
standard error; ``fixed@80%``: the paired seeds a fixed design needs for 80% power at that effect (t-test for
a difference; TOST within the margin when the effect is 0); ``fixed@same``: the fixed design with the power
the sequential design reached for that call (capped at 99%). The ``naive`` rows look with ordinary t
intervals instead (repeated t-tests): their false-difference rate under effect 0 is what peeking costs.
docs/sequential.md quotes this table.

Usage: python benchmarks/sequential_seeds.py [--sims 20000] [--start 3] [--step 1] [--max-seeds 20]
       [--alpha 0.05] [--margin 1.0] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from _bench import positive_int  # noqa: E402

from precswitch.analysis import sequential as sq  # noqa: E402


def positive_float(text: str) -> float:
    """argparse type of a number above 0 (alpha, margin); _bench's was removed with the one-off benchmarks."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v

#: (effect, sd) of each row, in points of accuracy
CASES = [(0.0, 1.0), (0.0, 0.5), (2.0, 1.0), (1.0, 1.0), (0.5, 1.0)]


def fixed(effect: float, sd: float, power: float, args) -> str:
    """Seeds of the fixed design with ``power`` for the call that is right at this effect."""
    power = min(power, 0.99)
    if effect == 0:
        n = sq.fixed_equivalence_seeds(0.0, sd, args.margin, power, args.alpha)
    else:
        n = sq.fixed_seeds(effect, sd, power, args.alpha)
    return "-" if n is None else str(n)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sims", type=positive_int, default=20000, help="simulated studies per row")
    p.add_argument("--start", type=positive_int, default=3, help="paired seeds at the first look")
    p.add_argument("--step", type=positive_int, default=1, help="new seeds between looks")
    p.add_argument("--max-seeds", type=positive_int, default=20, help="seeds at most (then inconclusive)")
    p.add_argument("--alpha", type=positive_float, default=0.05)
    p.add_argument("--margin", type=positive_float, default=1.0, help="equivalence margin (points)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the simulation")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    print(f"start {args.start}, step {args.step}, max {args.max_seeds} seeds, alpha {args.alpha}, "
          f"margin {args.margin}, g {sq.DEFAULT_G}, {args.sims} sims per row\n")
    print("| method | effect | sd | P(different) | P(equivalent) | P(inconclusive) | mean seeds "
          "| fixed@80% | fixed@same |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = [("sequential", e, s) for e, s in CASES] + [("naive t", 0.0, 1.0)]
    for i, (method, effect, sd) in enumerate(rows):
        r = sq.simulate(effect, sd, args.sims, args.start, args.step, args.max_seeds, args.alpha,
                        args.margin, rng=args.seed + i, naive=method != "sequential")
        call = "equivalent" if effect == 0 else "different"
        cells = [f"{r['p_' + k]:.3f} ± {r['se_' + k]:.3f}" for k in ("different", "equivalent", "inconclusive")]
        print(f"| {method} | {effect:g} | {sd:g} | {' | '.join(cells)} "
              f"| {r['mean_seeds']:.2f} ± {r['se_mean_seeds']:.2f} | {fixed(effect, sd, 0.8, args)} "
              f"| {fixed(effect, sd, r['p_' + call], args)} |")
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
