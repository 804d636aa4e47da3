#!/usr/bin/env python
"""pure_fp16 against AdamW's eps, per optimizer kernel: does a short masked-LM stage train or diverge?

In pure fp16 the optimizer state is fp16: Adam's second moment underflows for small gradients, and the
step is then about lr * m / eps. eps 1e-8 is 0 in fp16 and 1e-6 a subnormal, so whether a run survives
depends on eps and on the AdamW kernel (fused does its arithmetic in fp32 and stores fp16; foreach computes
in fp16). docs/gpu.md ("adam_eps") quotes this table. Each cell is one fresh `precswitch train` process
(tiny BERT, lr 5e-4, batch 32, seq 64, default clipping at 1.0, the embedded default's synthetic language).

Usage: python benchmarks/pure_fp16_eps.py [--steps 30] [--eps 1e-8 1e-6 1e-4] [--impls fused foreach]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import engine_run, positive_float, positive_int, prepare  # noqa: E402


def outcome(m: dict) -> str:
    """One cell: ok with the final training and eval losses (compare them with fp32's: a run can survive and
    still learn little), or diverged with the first non-finite loss's step or the engine's reason."""
    if m["status"] != "ok":
        step = m.get("first_nonfinite_step")
        return f"{m['status']}" + (f" (first non-finite loss at step {step})" if step is not None else "") + (
            f": {m['status_reason']}" if m.get("status_reason") and step is None else "")
    return f"ok: final training loss {m['final_train_loss']:.2f}, eval loss {m['eval_loss']:.2f}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=30)
    ap.add_argument("--eps", type=positive_float, nargs="+", default=[1e-8, 1e-6, 1e-4])
    ap.add_argument("--impls", nargs="+", choices=["fused", "foreach"], default=["fused", "foreach"])
    ap.add_argument("--threads", type=positive_int, default=2)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        data = prepare(Path(root))
        print(f"# pure_fp16, tiny BERT masked LM, {a.steps} steps, lr 5e-4, batch 32 x 64, clipping 1.0")
        for impl in a.impls:
            for eps in a.eps:
                m = engine_run(data["mlm"], "mlm", "pure_fp16", steps=a.steps, threads=a.threads, adam_eps=eps,
                               optimizer_impl=impl, eval_batch_size=64)
                print(f"{impl:<8} eps {eps:<7g} {outcome(m)}", flush=True)


if __name__ == "__main__":
    main()
