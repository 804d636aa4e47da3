"""What each precision name does to the process, checked the way a precision researcher would (mutation audit 2):
the TF32 switches each precision sets and that the caller gets its own back, the GradScaler's place in the step,
the LR schedule on skipped steps, 16-bit optimizer state, the CUDA-only clocks and memory counters (faked), and
the numbers metrics.json and steps.csv record."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

sys.path.insert(0, str(Path(__file__).parent))
from engine_fixtures import TINY, preempted_then_resumed, prepared_both, steps_rows  # noqa: E402

from precswitch import precision as P  # noqa: E402
from precswitch.errors import PrecisionUnsupported  # noqa: E402
from precswitch.train.engine import loop as engine  # noqa: E402
from precswitch.train.engine import STEP_FIELDS, run_stage  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_both(tmp_path_factory)


def _legacy_switches() -> tuple:
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(), torch.get_num_threads())


@contextlib.contextmanager
def _switches_put_back():
    """Whatever the test sets, the process's own switches afterwards (independent of the code under test)."""
    before = _legacy_switches()
    try:
        yield before
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[0], before[1]
        torch.set_float32_matmul_precision(before[2])
        torch.use_deterministic_algorithms(before[3], warn_only=before[4])
        torch.set_num_threads(before[5])


@contextlib.contextmanager
def _caller_switches(tf32_matmul: bool, tf32_cudnn: bool, matmul_precision: str, deterministic: bool, threads: int):
    """Set the process-wide switches as a caller might have them; put the process's own back afterwards."""
    with _switches_put_back():
        torch.set_float32_matmul_precision(matmul_precision)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32_matmul, tf32_cudnn
        torch.use_deterministic_algorithms(deterministic, warn_only=deterministic)
        torch.set_num_threads(threads)
        yield _legacy_switches()


# ====================================================================== TF32 and the caller's switches
def test_tf32_turns_every_tf32_switch_on_and_fp32_turns_them_off():
    """Each precision sets all three switches itself: tf32 on (cuBLAS, cuDNN, matmul precision 'high'); every
    other precision off ('highest'), and the returned (recorded) flags are the ones now in force."""
    with _switches_put_back():
        for start in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = start
            torch.set_float32_matmul_precision("high" if start else "highest")
            on = P.get("tf32").apply_backend_flags()
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                    torch.get_float32_matmul_precision()) == (True, True, "high")
            assert (on["tf32_matmul"], on["tf32_cudnn"], on["float32_matmul_precision"]) == (True, True, "high")
            for name in ("fp32", "amp_fp16", "amp_bf16", "pure_fp16", "pure_bf16", "pure_bf16_kahan", "fp8"):
                P.get("tf32").apply_backend_flags()
                off = P.get(name).apply_backend_flags()
                assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                        torch.get_float32_matmul_precision()) == (False, False, "highest"), name
                assert (off["tf32_matmul"], off["tf32_cudnn"], off["float32_matmul_precision"]) == \
                    (False, False, "highest"), name


def test_an_fp32_stage_runs_tf32_off_throughout_and_gives_the_caller_its_switches_back(data, tmp_path, monkeypatch):
    """A caller with TF32 on, matmul precision 'high', deterministic algorithms (warn only) and 2 threads runs an fp32
    stage: every training forward and the evaluation run with TF32 off, 'highest', deterministic off and the stage's
    1 thread; when run_stage returns, the caller has its own switches back (nothing flipped behind its back)."""
    seen = []
    real_fwd, real_eval = engine.forward_loss, engine.evaluate

    def fwd(*a):
        seen.append(("train",) + _legacy_switches())
        return real_fwd(*a)

    def ev(*a, **k):
        seen.append(("eval",) + _legacy_switches())
        return real_eval(*a, **k)

    monkeypatch.setattr(engine, "forward_loss", fwd)
    monkeypatch.setattr(engine, "evaluate", ev)
    with _caller_switches(True, True, "high", True, 2) as caller:
        m = run_stage({"data": str(data["mlm"]), "precision": "fp32", "steps": 3, "model": TINY, "threads": 1,
                       "save_checkpoint": False}, tmp_path / "r")
        after = _legacy_switches()
    assert [s[0] for s in seen] == ["train"] * 3 + ["eval"]
    assert all(s[1:] == (False, False, "highest", False, False, 1) for s in seen), seen
    assert (m["tf32_matmul"], m["tf32_cudnn"], m["float32_matmul_precision"], m["deterministic"]) == \
        (False, False, "highest", False)
    assert after == caller


def test_a_refused_stage_gives_the_caller_its_switches_back_too(data, tmp_path):
    """The switches are set before the precision check refuses tf32 on a CPU: the caller still gets its own back."""
    with _caller_switches(True, False, "high", False, 2) as caller:
        with pytest.raises(PrecisionUnsupported):
            run_stage({"data": str(data["mlm"]), "precision": "tf32", "steps": 1, "model": TINY}, tmp_path / "r")
        assert _legacy_switches() == caller


_NEW_API_CALLER = r"""
import json, sys, torch
from precswitch.train.engine import loop as engine
mk = torch.backends.mkldnn.matmul
mk.fp32_precision = "bf16"  # the caller: oneDNN may run fp32 matmuls in bf16 (AMX), set with torch's new API
seen = []
real = engine.forward_loss
def spy(*a):
    seen.append(mk.fp32_precision)
    return real(*a)
engine.forward_loss = spy
m = engine.run_stage({"data": sys.argv[1], "precision": "fp32", "steps": 2, "model": json.loads(sys.argv[3]),
                      "save_checkpoint": False}, sys.argv[2])
print(json.dumps({"during": seen, "after": mk.fp32_precision, "recorded": m["float32_matmul_precision"]}))
"""


def test_fp32_on_cpu_runs_ieee_matmuls_even_if_the_caller_asked_onednn_for_bf16(data, tmp_path):
    """torch >= 2.9: a caller may set oneDNN's fp32 matmul precision to bf16 with the new per-backend API (on an
    AMX CPU those matmuls would really run in bf16). An fp32 stage must run them in IEEE fp32 and hand the caller's
    bf16 setting back (through the same API: the legacy getters refuse to read a mixed state). In a subprocess:
    the new API leaves torch's legacy getters unusable for the rest of the process."""
    import json
    import subprocess

    if not hasattr(torch.backends.mkldnn, "matmul") or not hasattr(torch.backends.mkldnn.matmul, "fp32_precision"):
        pytest.skip("torch without per-backend fp32_precision")
    r = subprocess.run([sys.executable, "-c", _NEW_API_CALLER, str(data["mlm"]), str(tmp_path / "r"), json.dumps(TINY)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"during": ["ieee", "ieee"], "after": "bf16", "recorded": "highest"}


# ====================================================================== scaler, clipping, LR on skipped steps
def test_skipped_steps_advance_the_lr_schedule_as_in_every_other_precision(data, tmp_path, monkeypatch):
    """engine.py documents it: a step the GradScaler skips still advances the LR scheduler (PyTorch's AMP recipe),
    so step t has the same LR in every precision. An amp_fp16 run whose first steps overflow logs exactly the LRs
    of an fp32 run, skipped rows included."""
    stock = P.Precision.make_scaler
    monkeypatch.setattr(P.Precision, "make_scaler", lambda self, d: None if stock(self, d) is None
                        else torch.amp.GradScaler(d, init_scale=2.0**40))
    hp = {"data": str(data["mlm"]), "steps": 8, "lr": 1e-3, "warmup_ratio": 0.25, "model": TINY, "log_every": 1,
          "max_nonfinite": 100, "max_nonfinite_fraction": 1.0, "save_checkpoint": False}
    amp = run_stage({**hp, "precision": "amp_fp16"}, tmp_path / "amp")
    fp32 = run_stage({**hp, "precision": "fp32"}, tmp_path / "fp32")
    assert amp["skipped_steps"] >= 3 and fp32["skipped_steps"] == 0
    lr = {d: [float(r["lr"]) for r in steps_rows(tmp_path / d)] for d in ("amp", "fp32")}
    assert lr["amp"] == lr["fp32"] and len(lr["amp"]) == 8
    assert lr["amp"] == pytest.approx([1e-3 * t / 2 if t < 2 else 1e-3 * (8 - t) / 6 for t in range(8)])


# ====================================================================== pure 16-bit: weights, grads, optimizer state
@pytest.mark.parametrize("prec, dtype, impl", [("pure_bf16", torch.bfloat16, "fused"),
                                               ("pure_fp16", torch.float16, "foreach"),
                                               ("pure_bf16_kahan", torch.bfloat16, "fused")])
def test_pure_precisions_keep_weights_grads_and_adam_state_in_16_bits(data, tmp_path, prec, dtype, impl):
    """pure_*: after every optimizer step the weights, their gradients and AdamW's exp_avg / exp_avg_sq are in the
    16-bit dtype (no fp32 master copy or state hiding anywhere); AdamW's step counter stays fp32 (a bf16 counter
    stops at 256); eps is the hparam's."""
    seen = []

    def after_step(opt, args, kwargs):
        if prec.endswith("kahan") and not hasattr(opt, "optimizer"):
            return  # the inner AdamW, called inside the wrapper's step on transient fp32 copies
        inner = getattr(opt, "optimizer", opt)
        for g in inner.param_groups:
            for p in g["params"]:
                st = inner.state[p]
                seen.append((p.dtype, p.grad.dtype, st["exp_avg"].dtype, st["exp_avg_sq"].dtype, st["step"].dtype,
                             g["eps"]))

    handle = register_optimizer_step_post_hook(after_step)
    try:
        m = run_stage({"data": str(data["mlm"]), "precision": prec, "steps": 2, "model": TINY, "adam_eps": 1e-4,
                       "optimizer_impl": impl, "save_checkpoint": False}, tmp_path / "r")
    finally:
        handle.remove()
    assert m["status"] == "ok" and m["param_dtype"] == P.dtype_name(dtype)
    assert seen and set(seen) == {(dtype, dtype, dtype, dtype, torch.float32, 1e-4)}


@pytest.mark.parametrize("name", ["fp32", "amp_fp16", "amp_bf16", "pure_fp16", "pure_bf16", "pure_bf16_sr"])
def test_prepare_model_casts_every_float_tensor_to_the_precisions_storage_dtype(name):
    """prepare_model turns any model (say a bf16 one loaded from a pure_bf16 checkpoint, or an fp32 one) into the
    precision's storage: every weight, embeddings and LayerNorms included, and every float buffer, in param_dtype
    (fp32 master weights for amp_*); integer buffers (position ids) stay integers."""
    from transformers import BertConfig, BertForMaskedLM

    prec = P.get(name)
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=16)
    for start in (torch.float32, torch.bfloat16, torch.float16):
        model = prec.prepare_model(BertForMaskedLM(cfg).to(start))
        dtypes = {n: t.dtype for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_floating_point()}
        assert set(dtypes.values()) == {prec.param_dtype}, (start, dtypes)
        assert "bert.embeddings.word_embeddings.weight" in dtypes and "bert.embeddings.LayerNorm.weight" in dtypes
        assert all(not t.is_floating_point() for n, t in model.named_buffers() if "ids" in n)


def test_stochastic_rounding_noise_follows_the_runs_seed(data, tmp_path, monkeypatch):
    """pure_bf16_sr's rounding generator is seeded by the run's seed (wrap_optimizer(seed=hp seed)): the engine hands
    it the seed, not a constant."""
    seeds = []
    real = P.Precision.wrap_optimizer

    def spy(self, optimizer, seed):
        seeds.append(seed)
        return real(self, optimizer, seed)

    monkeypatch.setattr(P.Precision, "wrap_optimizer", spy)
    run_stage({"data": str(data["mlm"]), "precision": "pure_bf16_sr", "steps": 1, "seed": 7, "model": TINY,
               "save_checkpoint": False}, tmp_path / "r")
    assert seeds == [7]


# ====================================================================== switch, resume, eval
def test_amp_fp16_to_fp32_resumed_after_the_switch_has_no_loss_scaler(data, tmp_path, monkeypatch):
    """Resumed past its switch point, an amp_fp16 -> fp32 stage continues in fp32 without a loss scaler (not with
    the scaler of the precision it started in): its steps.csv equals the uninterrupted run's."""
    hp = {"data": str(data["mlm"]), "precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.5, "steps": 4,
          "model": TINY, "log_every": 1, "save_checkpoint": False}
    run_stage(hp, tmp_path / "whole")
    resumed = preempted_then_resumed(monkeypatch, hp, tmp_path / "resumed", 3)  # step 3: past the switch (step 2)
    assert resumed["resumed"] is True
    cols = [c for c in STEP_FIELDS if c != "step_seconds"]
    rows = {d: [[r[c] for c in cols] for r in steps_rows(tmp_path / d)] for d in ("whole", "resumed")}
    assert [r[cols.index("loss_scale")] for r in rows["resumed"]] == ["65536.0", "65536.0", "", ""]
    assert rows["resumed"] == rows["whole"]


def test_peak_memory_is_the_training_loops_not_the_evaluations(data, tmp_path, monkeypatch):
    """peak_memory_bytes is read when the training loop ends: 300 MB touched and freed during the evaluation (which
    may run a converted copy of the model) are not in it."""
    mb = 1 << 20
    real = engine.evaluate

    def alloc_eval(*a, **k):
        import numpy as np

        x = np.ones(300 * mb // 8)
        del x
        return real(*a, **k)

    monkeypatch.setattr(engine, "evaluate", alloc_eval)
    m = run_stage({"data": str(data["mlm"]), "precision": "fp32", "steps": 2, "model": TINY,
                   "save_checkpoint": False}, tmp_path / "r")
    assert m["peak_memory_bytes"] < m["memory_baseline_bytes"] + 250 * mb


# ====================================================================== CUDA-only clocks and memory (faked)


@pytest.mark.parametrize("max_grad_norm", [1.0, 0, None])
def test_pure_fp16_gradient_norm_above_65504_is_finite_and_clips(data, tmp_path, monkeypatch, max_grad_norm):
    """pure_fp16 with finite fp16 gradients whose total norm exceeds fp16's 65504 (the loss is multiplied by 6e4 in
    fp32; a loss scale of 1 keeps every gradient element finite): the recorded norm is finite and the optimizer
    steps on the clipped gradient (norm max_grad_norm), or with clipping off (0 or null: no default clip) on the
    whole finite gradient. torch's
    fp16 norm was inf: the update was zeroed (clip factor 1/inf) or, clipping off, NaN (inf/inf) in every weight."""
    monkeypatch.setattr(P.Precision, "make_scaler", lambda self, d: P.PureFP16GradScaler(d, init_scale=1.0)
                        if self.loss_scaling else None)
    real = engine.forward_loss
    monkeypatch.setattr(engine, "forward_loss", lambda *a: real(*a).float() * 6e4)
    seen = []

    def at_step(opt, args, kwargs):
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        seen.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x, dtype=torch.float32)
                                                                for x in grads]))))

    handle = register_optimizer_step_pre_hook(at_step)
    try:
        m = run_stage({"data": str(data["mlm"]), "precision": "pure_fp16", "steps": 3, "model": TINY,
                       "adam_eps": 1e-4, "max_grad_norm": max_grad_norm, "log_every": 1, "save_checkpoint": False},
                      tmp_path / "r")
    finally:
        handle.remove()
    rows = steps_rows(tmp_path / "r")
    assert m["skipped_steps"] == 0 and [r["skipped"] for r in rows] == ["0"] * 3
    norms = [float(r["grad_norm"]) for r in rows]
    assert all(65504 < n < float("inf") for n in norms), norms
    # the gradient the optimizer applies: clipped to max_grad_norm, or (clipping off) the whole finite one
    assert seen == (pytest.approx([1.0] * 3, rel=1e-2) if max_grad_norm else pytest.approx(norms, rel=1e-2))
    assert m["status"] == "ok" and m["nonfinite_losses"] == 0 and m["eval_loss"] is not None


def test_classification_eval_runs_in_the_eval_precisions_autocast():
    """A classifier evaluated in amp_bf16 runs its forward under bf16 autocast (as the mlm eval does): its eval loss
    is the one computed under autocast, and differs from fp32's (the comparison can fail)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64,
                                                     max_position_embeddings=32, num_labels=2)).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 97, (8, 16), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
             "labels": torch.randint(0, 2, (8,), generator=g)}
    cpu, meta = torch.device("cpu"), {"num_labels": 2, "majority_accuracy": 0.5}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = float(model(**batch).loss)
    bf16 = engine.evaluate(model, [batch], "classify", P.get("amp_bf16"), cpu, meta)["eval_loss"]
    fp32 = engine.evaluate(model, [batch], "classify", P.get("fp32"), cpu, meta)["eval_loss"]
    assert bf16 == pytest.approx(want, rel=1e-6) and bf16 != fp32


def test_a_classifier_with_non_finite_logits_gets_no_accuracy_and_a_note():
    """NaN logits (a blown-up model): argmax would still "predict" class 0 and give an accuracy; the eval reports
    none (null accuracy, f1, mcc) and says why, which the engine records as a diverged stage."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=64,
                                                     max_position_embeddings=32, num_labels=2)).eval()
    with torch.no_grad():
        model.classifier.weight[0, 0] = float("nan")
    ids = torch.randint(5, 97, (6, 8), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 0, 1, 0, 0])}
    ev = engine.evaluate(model, [batch], "classify", P.get("fp32"), torch.device("cpu"), {"num_labels": 2})
    assert (ev["accuracy"], ev["f1"], ev["mcc"], ev["eval_loss"]) == (None, None, None, None)
    assert "non-finite logits for 6 of 6" in ev["eval_note"]


def test_a_stage_whose_final_model_is_not_finite_is_recorded_as_diverged(data, tmp_path, monkeypatch):
    """Every training loss finite, but the evaluation finds non-finite outputs: recorded as data (status diverged,
    the reason saying so, exit normally), not as an ok run with null metrics."""
    real = engine.evaluate

    def nan_model(*a, **k):
        return {**real(*a, **k), "eval_loss": None, "eval_note": "non-finite eval loss: model weights or activations are NaN/inf"}

    monkeypatch.setattr(engine, "evaluate", nan_model)
    m = run_stage({"data": str(data["mlm"]), "precision": "fp32", "steps": 2, "model": TINY, "save_checkpoint": False},
                  tmp_path / "r")
    assert m["status"] == "diverged" and m["status_reason"].startswith("final model is not finite: non-finite eval loss")
    assert m["nonfinite_losses"] == 0 and m["steps_completed"] == 2


def test_the_logged_loss_is_the_unscaled_loss(data, tmp_path):
    """steps.csv's loss is the model's loss, not the loss times the loss scale: amp_fp16's first step (same initial
    weights and batch as fp32's) logs about fp32's loss, not 65536 times it."""
    hp = {"data": str(data["mlm"]), "steps": 1, "seed": 4, "model": TINY, "save_checkpoint": False}
    amp = run_stage({**hp, "precision": "amp_fp16"}, tmp_path / "amp")
    fp32 = run_stage({**hp, "precision": "fp32"}, tmp_path / "fp32")
    assert amp["loss_scale_start"] == 65536.0
    assert amp["final_train_loss"] == pytest.approx(fp32["final_train_loss"], rel=1e-2)


# ====================================================================== mutation audit 5 (precision)


def test_autocast_and_loss_scaler_are_built_for_the_stages_device_type(monkeypatch):
    """On a GPU the amp_* forward autocasts on "cuda" (a CPU autocast would leave every CUDA matmul in fp32) and the
    fp16 modes' loss scalers are built for "cuda"; on the CPU for "cpu". (No GPU needed: the objects are only built.)"""
    import warnings

    built = []
    real_init = torch.amp.GradScaler.__init__

    def init(self, device="cuda", *a, **k):
        built.append((type(self).__name__, device))
        real_init(self, device, *a, **k)

    monkeypatch.setattr(torch.amp.GradScaler, "__init__", init)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a CUDA-less torch warns that it disables CUDA autocast / scaling
        for dev in ("cuda", "cpu"):
            for name, dtype in (("amp_fp16", torch.float16), ("amp_bf16", torch.bfloat16)):
                ctx = P.get(name).autocast(dev)
                assert (ctx.device, ctx.fast_dtype) == (dev, dtype), (name, dev)
            P.get("amp_fp16").make_scaler(dev)
            P.get("pure_fp16").make_scaler(dev)
    assert built == [("GradScaler", "cuda"), ("PureFP16GradScaler", "cuda"),
                     ("GradScaler", "cpu"), ("PureFP16GradScaler", "cpu")]


