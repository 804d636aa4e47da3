# precswitch: pre-train BERT in one precision, fine-tune in another; what happens to accuracy,
# time and memory? See README.md. Run: snakemake --cores all

import copy

from snakemake.common.configfile import load_configfile
from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from precswitch.io import type_cli_config
from precswitch.catalog import NAMES as PRECISION_NAMES, name_hint

min_version("9.0")

# A schedules map given on the command line replaces the default one instead of merging into it;
# of several --configfile files that each give one, the last one's map is the study's (Snakemake
# would merge them all into one map). --config schedules='{...}' replaces them all (Snakemake would
# merge it into the files' map too).
_cli_schedules = copy.deepcopy(config.get("schedules"))  # merging mutates it
_file_schedules = [
    c["schedules"]
    for c in map(load_configfile, workflow.config_settings.configfiles)
    if isinstance(c, dict) and isinstance(c.get("schedules"), dict)
]
if "schedules" in (workflow.config_settings.config or {}):
    _cli_schedules = copy.deepcopy(workflow.config_settings.config["schedules"])
elif len(_file_schedules) > 1:
    _cli_schedules = copy.deepcopy(_file_schedules[-1])


configfile: "config/config.yaml"


if _cli_schedules is not None:
    config["schedules"] = _cli_schedules


# nested --config values arrive as text (`--config seeds='[1,2]'` gives ['1', '2']): read them as YAML
type_cli_config(workflow.config_settings.config, config)

try:
    validate(config, "workflow/schemas/config.schema.yaml")
except WorkflowError as e:
    # one line naming the key and what is allowed, instead of a dump of the schema
    error = e.__cause__ or e.__context__
    if not hasattr(error, "absolute_path"):
        raise
    key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    allowed = ""
    if error.validator == "additionalProperties":
        allowed = f"; allowed keys: {', '.join(error.schema.get('properties', {}))}"
    if (
        error.validator == "type"
        and "number" in str(error.validator_value)
        and isinstance(error.instance, str)
    ):
        try:  # YAML 1.1 reads 1e-3 (no dot) as a string
            allowed = f" (YAML reads it as text: write {float(error.instance):.1e})"
        except ValueError:
            pass
    if (
        error.validator == "enum"
        and isinstance(error.instance, str)
        and set(error.validator_value) - {"same"}
        <= set(PRECISION_NAMES)  # eval_precision adds 'same'
    ):
        allowed = name_hint(error.instance)  # bf16: amp_bf16 or pure_bf16?
    message = error.message
    if error.validator == "pattern" and key == "results_dir":
        message = (
            f"{error.instance!r} cannot hold a study: no whitespace, no braces (Snakemake reads "
            "{x} as a wildcard), no shell characters ($ ` ' \" \\ ; & | < > ( ) * ? [ ] ! #; every "
            "job's shell command names it), no leading - or ~, not the working directory (.) nor the root (/)"
        )
    raise WorkflowError(f"config key {key}: {message}{allowed}") from None


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/analyze.smk"


report: "workflow/report/workflow.rst"


onstart:
    check_gpu_here()
    keep_previous_runs()


rule all:
    default_target: True
    input:
        f"{RESULTS}/runs.csv",
        f"{RESULTS}/schedules.csv",
        f"{RESULTS}/summary.csv",
        f"{RESULTS}/verdict.md",
        expand(f"{RESULTS}/plots/{{name}}.{{ext}}", name=PLOTS, ext=["png", "svg"]),
