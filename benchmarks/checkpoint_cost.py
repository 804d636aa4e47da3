#!/usr/bin/env python
"""What a resumable-state checkpoint costs a training stage.

Runs the embedded default's stage 1 (tiny BERT MLM, batch 32, seq 64, 1 thread) on the synthetic
language twice in fresh processes: without periodic state and with state every ``--every`` steps.
Prints the number of saves, seconds per save, the state size, and the saves' share of train time.
Save time is kept out of ``train_seconds`` by the engine and reported as ``state_save_seconds``.

Usage: python benchmarks/checkpoint_cost.py [--steps 300] [--every 50]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import engine_run, positive_int, prepare  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=300)
    ap.add_argument("--every", type=positive_int, default=50)
    ap.add_argument("--precision", default="amp_fp16")
    a = ap.parse_args()
    if a.every >= a.steps:  # the engine saves state only before the last step: no save to measure
        ap.error(f"--every {a.every}: needs --every < --steps ({a.steps}), or no state is saved")
    with tempfile.TemporaryDirectory() as root:
        data = prepare(Path(root))
        common = dict(steps=a.steps, threads=1, save_checkpoint=True)
        off = engine_run(data["mlm"], "mlm", a.precision, **common)
        on = engine_run(data["mlm"], "mlm", a.precision, checkpoint_every_steps=a.every, **common)
    n = on["state_saves"]
    per = on["state_save_seconds"] / max(n, 1)
    print(f"# resumable state every {a.every} steps, {a.steps} steps of {a.precision} MLM (tiny BERT, 1 thread)")
    print(f"saves {n}; {per * 1000:.0f} ms per save; {on['state_save_seconds']:.2f} s in all = "
          f"{100 * on['state_save_seconds'] / on['train_seconds']:.1f}% of train_seconds ({on['train_seconds']:.1f} s)")
    print(f"train_seconds without state {off['train_seconds']:.1f} s, with {on['train_seconds']:.1f} s "
          f"(saves excluded); final checkpoint write {off['checkpoint_seconds']:.2f} s")
    print(f"same result: eval_loss {off['eval_loss']} vs {on['eval_loss']}")


if __name__ == "__main__":
    main()
