# Analysis: the tables, statistics, plots and the verdict (precswitch.analysis). Every file a rule
# reads is one of its inputs: aggregate reads each run's metrics.json and steps.csv (outputs of the
# training rules), the later rules read only the tables.


rule aggregate:
    input:
        # functions: a sequential study knows its runs only as its looks are made (sequential.smk)
        metrics=lambda w: pretrain_metrics() + finetune_metrics(),
        steps=lambda w: steps_logs(pretrain_metrics() + finetune_metrics()),
    output:
        runs=report(
            f"{RESULTS}/runs.csv",
            caption=caption("runs"),
            category="Tables",
            labels={"table": "runs (one row per stage run)"},
        ),
        runs_parquet=f"{RESULTS}/runs.parquet",
        schedules=report(
            f"{RESULTS}/schedules.csv",
            caption=caption("schedules"),
            category="Tables",
            labels={"table": "schedules (one row per schedule and seed)"},
        ),
        schedules_parquet=f"{RESULTS}/schedules.parquet",
        steps=f"{RESULTS}/steps.csv",
        steps_parquet=f"{RESULTS}/steps.parquet",
        activations=f"{RESULTS}/activations.csv",
    log:
        f"{LOGS}/analysis/aggregate.log",
    benchmark:
        f"{BENCHMARKS}/analysis/aggregate.tsv"
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    params:
        out_dir=lambda w, output: os.path.dirname(output.runs),
    shell:
        "precswitch aggregate --metrics {input.metrics} --steps {input.steps}"
        " --out-dir {params.out_dir} > {log} 2>&1"


rule stats:
    input:
        runs=f"{RESULTS}/runs.csv",
        schedules=f"{RESULTS}/schedules.csv",
    output:
        settings=f"{RESULTS}/analysis.json",
        summary_csv=report(
            f"{RESULTS}/summary.csv",
            caption=caption("summary"),
            category="Tables",
            labels={"table": "summary (per schedule, mean and CI)"},
        ),
        summary_md=f"{RESULTS}/summary.md",
        deltas_csv=report(
            f"{RESULTS}/deltas.csv",
            caption=caption("deltas"),
            category="Tables",
            labels={"table": "deltas (paired contrasts)"},
        ),
        stats_json=f"{RESULTS}/stats.json",
    log:
        f"{LOGS}/analysis/stats.log",
    benchmark:
        f"{BENCHMARKS}/analysis/stats.tsv"
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    params:
        settings=analysis_json(),
    shell:
        "printf '%s\\n' {params.settings:q} > {output.settings}"
        " && precswitch stats --runs {input.runs} --schedules {input.schedules}"
        " --settings {output.settings} --summary-csv {output.summary_csv}"
        " --summary-md {output.summary_md} --deltas-csv {output.deltas_csv}"
        " --stats-json {output.stats_json} > {log} 2>&1"


rule plots:
    input:
        runs=f"{RESULTS}/runs.csv",
        schedules=f"{RESULTS}/schedules.csv",
        steps=f"{RESULTS}/steps.csv",
        activations=f"{RESULTS}/activations.csv",
        stats=f"{RESULTS}/stats.json",
    output:
        [
            report(
                f"{RESULTS}/plots/{name}.svg",
                caption=caption(name),
                category=PLOTS[name]["category"],
                labels=PLOTS[name]["labels"],
            )
            for name in PLOTS
        ],
        [f"{RESULTS}/plots/{name}.png" for name in PLOTS],
    log:
        f"{LOGS}/analysis/plots.log",
    benchmark:
        f"{BENCHMARKS}/analysis/plots.tsv"
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    shell:
        "precswitch plots --runs {input.runs} --schedules {input.schedules}"
        " --steps {input.steps} --activations {input.activations}"
        " --stats {input.stats} --out {output} > {log} 2>&1"


rule verdict:
    input:
        stats=f"{RESULTS}/stats.json",
        sequential=[f"{RESULTS}/sequential.json"] if SEQUENTIAL else [],
    output:
        verdict=report(
            f"{RESULTS}/verdict.md",
            caption=caption("verdict"),
            category="Verdict",
            labels={"document": "verdict"},
        ),
        # the same answer in reST for the report's landing page (workflow/report/workflow.rst includes it)
        front=f"{RESULTS}/report_front.rst",
    log:
        f"{LOGS}/analysis/verdict.log",
    benchmark:
        f"{BENCHMARKS}/analysis/verdict.tsv"
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    params:
        sequential=lambda w, input: (
            f"--sequential {input.sequential}" if input.sequential else ""
        ),
    shell:
        "precswitch verdict --stats {input.stats} {params.sequential} --out {output.verdict} --front {output.front} > {log} 2>&1"
