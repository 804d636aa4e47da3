"""The study's logic, used by the workflow (``workflow/rules/common.smk`` is its wiring) and unit-tested on dicts.

By concern: :mod:`.validate` (the JSON schema ``workflow/schemas/config.schema.yaml``, filling its defaults; a
mistake is a :class:`ConfigError`, one line ``config key <key>: <problem>``), :mod:`.checks` (what the schema
cannot express), :mod:`.plan` (the runs), :mod:`.jobs` (each job's settings), :mod:`.notes` (console lines),
:mod:`.gpu_checks` and :mod:`.previous` (finished runs a rerun replaces). Torch-free: reading a config (every dry
run) imports no torch; only the GPU checks of a real run ask torch, inside the function.
"""

from .checks import STAGES, source_files
from .gpu_checks import check_cuda_build, check_gpu
from .jobs import OBJECTIVE, OFFLINE_VARS, fetch_needed, fetch_spec, hparams, source_spec, tokenizer_options
from .notes import gpu_limit_line, prepared_notes, threads_note, warmup_notes
from .plan import Plan, analysis_settings, check, plan, seed_sequence, sequential_design
from .previous import keep_previous_runs
from .validate import ConfigError, check_config_files, given_schedules, refuse, schema_error, validate

__all__ = ["STAGES", "OBJECTIVE", "OFFLINE_VARS", "ConfigError", "Plan", "analysis_settings", "check",
           "check_config_files", "check_cuda_build", "check_gpu", "fetch_needed", "fetch_spec", "given_schedules",
           "gpu_limit_line", "hparams", "keep_previous_runs", "plan", "prepared_notes", "refuse", "schema_error",
           "seed_sequence", "sequential_design", "source_files", "source_spec", "threads_note", "tokenizer_options",
           "validate", "warmup_notes"]
