"""One training stage of a BERT-style model under one named precision.

``run_stage`` (loop.py) reads top to bottom: set-up, resume, the loop, evaluation, checkpoint, records. The
package by concern: inputs.py (data, tokenizer, model), batching.py (deterministic batches per (seed, step)),
step.py (the forward pass and one training step), evaluate.py (evaluation, divergence), state.py (the loop's
typed state, resume/state.pt, stop signals, the run-dir lock), records.py (steps.csv, checkpoint, metrics.json).
"""

from ...errors import EXIT_PREEMPTED
from .batching import HEAD_KEYS, Batches, drop_full_attention_mask, eval_batches, make_collator, mlm_head_rows, step_seed
from .evaluate import blown_up, evaluate
from .inputs import STAGE_FILE
from .loop import run_stage
from .state import RUN_LOCK, STEP_FIELDS, Preempted
from .step import StepResult, build_optimizer, clip_grad_norm, cls_only_last_layer, forward_loss, mlm_forward, train_step

__all__ = ["run_stage", "Preempted", "EXIT_PREEMPTED", "STAGE_FILE", "STEP_FIELDS", "RUN_LOCK", "HEAD_KEYS",
           "Batches", "step_seed", "eval_batches", "make_collator", "mlm_head_rows", "drop_full_attention_mask",
           "mlm_forward", "cls_only_last_layer", "forward_loss", "clip_grad_norm", "build_optimizer", "train_step",
           "StepResult", "evaluate", "blown_up"]
