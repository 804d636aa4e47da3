# precswitch: pre-train BERT in one precision, fine-tune in another; what happens to accuracy,
# time and memory? See README.md. Run: snakemake --cores all

import os
import sys

from snakemake.utils import min_version

# this checkout's package first, in case another copy is installed
if os.path.join(workflow.basedir, "src") not in sys.path:
    sys.path.insert(0, os.path.join(workflow.basedir, "src"))
import precswitch.study as study
from precswitch.io import type_cli_config

min_version("9.0")


try:
    # a key written twice in a config file (YAML keeps the last without a word)
    study.check_config_files(
        [
            *workflow.config_settings.configfiles,
            os.path.join(workflow.basedir, "config", "config.yaml"),
        ]
    )
    # a schedules map given on the command line replaces the default one (precswitch.study.given_schedules)
    _schedules = study.given_schedules(
        config,
        workflow.config_settings.config,
        workflow.config_settings.configfiles,
    )
except study.ConfigError as e:
    study.refuse(e)


configfile: "config/config.yaml"


if _schedules is not None:
    config["schedules"] = _schedules
# nested --config values arrive as text (`--config seeds='[1,2]'` gives ['1', '2']): read them as YAML
type_cli_config(workflow.config_settings.config, config)
try:  # the schema (filling its defaults), then the checks it cannot express: one line naming the key
    study.validate(config)
    STUDY = study.plan(config)
except study.ConfigError as e:
    study.refuse(e)


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
    cpu_time_note()


onsuccess:
    data_notes()


rule all:
    default_target: True
    input:
        f"{RESULTS}/runs.csv",
        f"{RESULTS}/schedules.csv",
        f"{RESULTS}/summary.csv",
        f"{RESULTS}/verdict.md",
        f"{RESULTS}/report_front.rst",
        expand(f"{RESULTS}/plots/{{name}}.{{ext}}", name=PLOTS, ext=["png", "svg"]),
        [f"{RESULTS}/sequential.csv"] if SEQUENTIAL else [],
