# precswitch: pre-train BERT in one precision, fine-tune in another; what happens to accuracy,
# time and memory? See README.md. Run: snakemake --cores all

import os
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

# this checkout's package first, in case another copy is installed
if os.path.join(workflow.basedir, "src") not in sys.path:
    sys.path.insert(0, os.path.join(workflow.basedir, "src"))
import precswitch.study as study
from precswitch.io import type_cli_config

min_version("9.0")

# a schedules map given on the command line replaces the default one (precswitch.study.given_schedules)
_schedules = study.given_schedules(
    config,
    workflow.config_settings.config,
    workflow.config_settings.configfiles,
)


configfile: "config/config.yaml"


if _schedules is not None:
    config["schedules"] = _schedules
# nested --config values arrive as text (`--config seeds='[1,2]'` gives ['1', '2']): read them as YAML
type_cli_config(workflow.config_settings.config, config)
try:  # the schema (filling its defaults), then the checks it cannot express: one line naming the key
    study.validate(config)
    STUDY = study.plan(config)
except study.ConfigError as e:
    raise WorkflowError(str(e)) from None


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/analyze.smk"
include: "workflow/rules/sequential.smk"


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
        [f"{RESULTS}/sequential.csv"] if SEQUENTIAL else [],
