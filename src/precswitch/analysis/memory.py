"""Bytes of the model and optimizer state per precision: what a precision by itself must change in memory.

The verdict sets these bytes beside each stage's measured peak (docs/analysis.md, "Memory").
"""

from __future__ import annotations

import math

from ..errors import PrecswitchError

#: bytes per element of a dtype name of the precision catalog
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def tensor_bytes_per_parameter(precision: str) -> int:
    """Bytes each parameter holds during training in ``precision``: the weight and its gradient in the
    catalog's param dtype, AdamW's two moments (torch keeps them in the param's dtype), and a Kahan
    compensation buffer where the precision has one. fp32 and mixed precision: 16; pure 16-bit: 8."""
    from ..catalog import spec

    sp = spec(precision)
    per = DTYPE_BYTES[sp.param_dtype]
    return per * (4 + (sp.update_compensation == "kahan"))


def schedule_tensor_bytes(sub, runs, k: int) -> float:
    """Model and optimizer-state bytes of the schedule's stage ``k``: its runs' parameter count (runs table,
    ``model_parameters``) × :func:`tensor_bytes_per_parameter`, the larger of the two precisions of an in-stage
    switch. NaN when the parameter count or the precision is unknown."""
    import pandas as pd

    from .aggregate import first_value

    ids, prec = sub.get(f"stage{k}_run_id"), first_value(sub, f"stage{k}_precision")
    if ids is None or prec is None or not {"run_id", "model_parameters"} <= set(runs.columns):
        return math.nan
    n = pd.to_numeric(runs.loc[runs["run_id"].isin(set(ids.dropna())), "model_parameters"], errors="coerce").max()
    precs = [prec] + [p for p in [first_value(sub, f"stage{k}_switch_to")] if p]
    try:
        per = max(tensor_bytes_per_parameter(str(p)) for p in precs)
    except PrecswitchError:
        return math.nan
    return float(n * per) if math.isfinite(n) else math.nan
