"""Peak memory and throughput vs batch size, per precision (one `precswitch train` process per point).

Hugging Face's BERT-base benchmarks found that fp16 saves memory only from batch >= 16: at small
batches the weights, gradients and optimizer state (which AMP keeps in fp32, plus an fp16 copy of the
weights) dominate, and only the activations (which scale with batch) shrink with 16-bit compute.
This sweep shows where that crossover lies for our model: for each precision and batch size it runs
one short training stage in a fresh process (benchmarks/_bench.py) and reads ``peak_memory_bytes``
and ``samples_per_second`` from its metrics.json.

On CPU the memory is the process peak RSS (``VmHWM``, reset just before the loop), which includes the
Python + torch + data baseline (``memory_baseline_bytes``); the table also shows peak - baseline (the
training loop's own growth). On CUDA it is ``torch.cuda.max_memory_allocated``.

    .venv/bin/python benchmarks/batch_size_sweep.py [--batch-sizes 4 8 16 32 64]
        [--precisions fp32 amp_bf16 pure_bf16] [--objective mlm] [--steps 15] [--out results/bench/batch_size_sweep]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench
from _bench import positive_int
from precswitch.precision import NAMES

MIB = 1024 * 1024


def _num(v, spec: str) -> str:
    """v formatted with spec ('8.1f'), or '-' at the same width for a run that measured nothing (skipped)."""
    return format(v, spec) if v is not None and v == v else format("-", ">" + spec.split(".")[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[4, 8, 16, 32, 64])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "amp_bf16", "pure_bf16"], choices=NAMES)
    ap.add_argument("--objective", choices=["mlm", "classify"], default="mlm")
    ap.add_argument("--steps", type=positive_int, default=15)
    ap.add_argument("--timing-warmup-steps", type=int, default=5)
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--hidden", type=positive_int, default=128, help="hidden size (layers 2, heads 2, FFN 4x)")
    ap.add_argument("--out", default="results/bench/batch_size_sweep")
    args = ap.parse_args()
    # refused before any run: a point given twice made the table's pivot fail after the whole sweep, and a
    # warm-up leaving no step timed makes the engine time every step (its warm-up included)
    for opt, vals in (("--batch-sizes", args.batch_sizes), ("--precisions", args.precisions)):
        dup = sorted({str(v) for v in vals if vals.count(v) > 1})
        if dup:
            ap.error(f"{opt}: {', '.join(dup)} given twice")
    if not 0 <= args.timing_warmup_steps < args.steps:
        ap.error(f"--timing-warmup-steps {args.timing_warmup_steps}: needs 0 <= warm-up < --steps ({args.steps}), "
                 "or no step is timed")
    if args.hidden % _bench.MODEL["num_attention_heads"]:
        ap.error(f"--hidden {args.hidden}: must be a multiple of the {_bench.MODEL['num_attention_heads']} attention heads")

    import pandas as pd

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = {**_bench.MODEL, "hidden_size": args.hidden, "intermediate_size": 4 * args.hidden}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        data = _bench.prepare(Path(tmp), n_corpus=6000, n_train=max(2000, 2 * max(args.batch_sizes)))
        print(f"prepared tiny data in {time.perf_counter() - t0:.0f}s", flush=True)
        for bs in args.batch_sizes:
            for prec in args.precisions:
                t = time.perf_counter()
                m = _bench.engine_run(
                    data[args.objective], args.objective, prec, model=model, batch_size=bs, steps=args.steps,
                    timing_warmup_steps=args.timing_warmup_steps, threads=args.threads, device=args.device,
                    adam_eps=1e-4 if prec == "pure_fp16" else 1e-8, eval_batch_size=64,
                )
                base = m.get("memory_baseline_bytes")
                peak = m.get("peak_memory_bytes")
                rows.append({
                    "precision": prec, "batch_size": bs, "status": m["status"],
                    "peak_memory_mib": peak / MIB if peak else None,
                    "baseline_mib": base / MIB if base else None,
                    "loop_growth_mib": (peak - base) / MIB if peak and base else None,
                    "memory_kind": m.get("memory_kind"),
                    "samples_per_second": m.get("samples_per_second"),
                    "step_seconds_median": m.get("step_seconds_median"),
                    "device": m.get("device"),
                })
                r = rows[-1]
                print(f"  bs={bs:<3} {prec:<10} peak {_num(r['peak_memory_mib'], '8.1f')} MiB  "
                      f"growth {_num(r['loop_growth_mib'], '7.1f')} MiB  "
                      f"{_num(r['samples_per_second'], '8.1f')} samples/s  ({time.perf_counter() - t:.0f}s)"
                      + ("" if r["status"] == "ok" else f"  {r['status']}"), flush=True)

    df = pd.DataFrame(rows)
    df.to_csv(out / "sweep.csv", index=False)
    kind = df["memory_kind"].dropna().iloc[0] if df["memory_kind"].notna().any() else "?"
    print()
    print(f"objective {args.objective}, hidden {args.hidden}, {args.steps} steps, threads {args.threads}, "
          f"memory = {kind}" + (" (process peak RSS incl. the Python/torch/data baseline; 'growth' = peak - "
                                "RSS just before the loop)" if kind == "cpu_peak_rss" else ""))
    cols = ["peak_memory_mib", "loop_growth_mib", "samples_per_second"]
    table = df.pivot(index="batch_size", columns="precision", values=cols).round(1)
    print(table.to_string())
    if "fp32" in args.precisions:
        print("\nmemory relative to fp32 (peak; growth):")
        for prec in args.precisions:
            if prec == "fp32":
                continue
            rel = []
            for bs in args.batch_sizes:
                a = df[(df.precision == prec) & (df.batch_size == bs)].iloc[0]
                b = df[(df.precision == "fp32") & (df.batch_size == bs)].iloc[0]
                g = (a.loop_growth_mib / b.loop_growth_mib
                     if pd.notna(a.loop_growth_mib) and pd.notna(b.loop_growth_mib) and b.loop_growth_mib else None)
                p = (a.peak_memory_mib / b.peak_memory_mib
                     if pd.notna(a.peak_memory_mib) and pd.notna(b.peak_memory_mib) else None)
                rel.append(f"bs{bs}: {_num(p, '.2f')}; {_num(g, '.2f')}")
            print(f"  {prec:<10} " + " | ".join(rel))
    _plot(df, out / "sweep.png", kind, args)
    print(f"\nwrote {out / 'sweep.csv'} and {out / 'sweep.png'}")


def _plot(df, path: Path, kind: str, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    mem_col = "loop_growth_mib" if kind == "cpu_peak_rss" else "peak_memory_mib"
    mem_label = ("peak RSS growth during the loop (MiB)" if kind == "cpu_peak_rss"
                 else "peak CUDA memory allocated (MiB)")
    for ax, col, label in ((axes[0], mem_col, mem_label), (axes[1], "samples_per_second", "samples / s")):
        sns.lineplot(data=df, x="batch_size", y=col, hue="precision", marker="o", ax=ax)
        ax.set_xscale("log", base=2)
        ax.set_xticks(args.batch_sizes, [str(b) for b in args.batch_sizes])
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
    fig.suptitle(f"tiny BERT {args.objective} (hidden {args.hidden}, 2 layers): memory and throughput vs batch size "
                 f"[{kind}]", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
