"""What the steps of a stage share: its settings, its run-wide objects and the loop's state."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ... import precision as P
from ...telemetry import ActivationTelemetry
from .batching import Batches
from .state import LoopState, ResumeFile


@dataclass
class Stage:
    """What the stage's steps share: its settings and run-wide objects, set up in order, and ``loop``, the loop's
    state (saved in state.pt)."""

    hp: dict
    out: Path
    t_setup: float
    prec: P.Precision
    switch_prec: P.Precision | None  # the in-stage switch (e.g. 80% amp_fp16 then fp32): new autocast/scaler/flags
    eval_prec: P.Precision
    device: torch.device
    flags: dict  # the backend flags in force (TF32, matmul precision, deterministic): recorded in metrics.json
    config_hash: str
    base_metrics: dict  # the first keys of every metrics.json, skipped stages' included
    init: str
    init_stage: dict = field(default_factory=dict)  # what the init checkpoint's stage file says (stage 2)
    # setup_data
    meta: dict = field(default_factory=dict)
    tokenizer: Any = None
    total_steps: int = 0
    switch_step: int | None = None
    batches: Batches | None = None
    eval_batches: list = field(default_factory=list)
    test_batches: list | None = None  # the held-out test split's, where the prepared data holds one
    # setup_model, setup_training
    model: Any = None
    checkpoint_dtype_read: str | None = None
    model_pin: dict = field(default_factory=dict)
    optimizer: Any = None
    scheduler: Any = None
    scaler: Any = None
    telemetry: ActivationTelemetry | None = None
    train_loss: Any = None
    cudagraphs: bool = False
    # resume and the loop
    resume: ResumeFile | None = None
    loop: LoopState = field(default_factory=LoopState)
    resumed: bool = False
    current_prec: P.Precision | None = None  # the precision in force (prec, or switch_prec past the switch step)
    setup_seconds: float = 0.0

    def precision_at(self, step: int) -> P.Precision:
        return self.switch_prec if self.switch_prec is not None and step >= self.switch_step else self.prec
