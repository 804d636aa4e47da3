"""Overhead of activation telemetry (precswitch.telemetry) on a tiny BERT MLM training step.

Same process, interleaved step by step: the three variants (baseline = no telemetry object,
telemetry off = ``every=0``, telemetry on at ``every=K``) take turns, one training step each, in a
rotating order, so machine-load drift hits all of them alike. The "on" variant samples every K-th of
its own steps, so its median hides the sampled step: the mean overhead is reported, and the cost of a
sampled step alone (median of sampled steps vs the baseline median) divided by K, the amortised
overhead, which is what the ≤5% target refers to.

    .venv/bin/python benchmarks/telemetry_overhead.py [--rounds 4 --steps 30 --every 10 --threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import positive_int  # noqa: E402


def overheads(times: dict[str, list[float]], sampled: list[float], every: int) -> dict:
    """The printed figures, from each variant's step times (seconds; "baseline" among them) and the sampled
    steps' times of the "on" variant: per variant its median, mean and overhead vs the baseline's mean
    (mean) and median (median); the sampled steps' median, its excess over the baseline median, and that
    excess divided by every (amortised)."""
    base_mean, base_med = statistics.fmean(times["baseline"]), statistics.median(times["baseline"])
    variants = {}
    for name, ts in times.items():
        med, mean = statistics.median(ts), statistics.fmean(ts)
        variants[name] = {"median": med, "mean": mean, "overhead_mean": mean / base_mean - 1,
                          "overhead_median": med / base_med - 1}
    extra = statistics.median(sampled) / base_med - 1
    return {"variants": variants, "sampled_median": statistics.median(sampled), "sampled_extra": extra,
            "amortised": extra / every}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=4)
    ap.add_argument("--steps", type=positive_int, default=30, help="steps per variant per round")
    ap.add_argument("--every", type=positive_int, default=10)
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "amp_bf16", "pure_bf16"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import transformers

    from precswitch.telemetry import ActivationTelemetry

    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=8000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=512, max_position_embeddings=128, attn_implementation="eager")
    model = transformers.BertForMaskedLM(cfg)
    if args.precision == "pure_bf16":
        model = model.to(torch.bfloat16)
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "amp_bf16"
                else torch.autocast("cpu", enabled=False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 8000, (32, 64), generator=g)
    labels = ids.clone()
    labels[torch.rand(ids.shape, generator=g) > 0.15] = -100
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    tel_off = ActivationTelemetry(model, every=0)
    tel_on = ActivationTelemetry(model, every=args.every)
    variants = {"baseline": None, "off": tel_off, f"on_every{args.every}": tel_on}
    times: dict[str, list[float]] = {k: [] for k in variants}
    counter = {k: 0 for k in variants}

    def one_step(tel) -> float:
        t = time.perf_counter()
        if tel is None:
            with autocast:
                loss = model(**batch).loss
        else:
            with tel.step(counter_value[0]), autocast:
                loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    counter_value = [0]
    for _ in range(5):  # warm-up
        one_step(None)
    names = list(variants)
    sampled: list[float] = []
    for r in range(args.rounds):
        for i in range(args.steps):  # step-level interleaving: load drift hits every variant alike
            k = (r * args.steps + i) % len(names)
            for name in names[k:] + names[:k]:
                counter_value[0] = counter[name]
                dt = one_step(variants[name])
                times[name].append(dt)
                if variants[name] is tel_on and tel_on.is_sampled(counter[name]):
                    sampled.append(dt)
                counter[name] += 1

    fig = overheads(times, sampled, args.every)
    print(f"tiny BERT MLM (hidden 128, 2 layers, seq 64, batch 32), {args.precision}, threads={args.threads}, "
          f"{args.rounds * args.steps} steps per variant, interleaved step by step")
    print(f"{'variant':<14} {'median ms':>10} {'mean ms':>9} {'overhead (mean)':>16} {'overhead (median)':>18}")
    for name in names:
        v = fig["variants"][name]
        print(f"{name:<14} {1e3 * v['median']:>10.2f} {1e3 * v['mean']:>9.2f} {100 * v['overhead_mean']:>15.2f}% "
              f"{100 * v['overhead_median']:>17.2f}%")
    print(f"sampled steps only (every {args.every}th): median {1e3 * fig['sampled_median']:.2f} ms = "
          f"{100 * fig['sampled_extra']:+.1f}% vs baseline median -> amortised at every={args.every}: "
          f"{100 * fig['amortised']:+.2f}% ({len(tel_on.modules)} modules watched, {tel_on.steps_sampled} steps sampled)")
    print(f"hooks registered now: off={tel_off.hooks_registered}, on={tel_on.hooks_registered}; "
          f"max |activation| seen: {tel_on.summary()['max_abs']:.3g} in {tel_on.summary()['max_abs_layer']}")


if __name__ == "__main__":
    main()
