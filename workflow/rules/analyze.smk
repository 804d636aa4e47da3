# Analysis: the two tables, statistics, plots and the verdict (precswitch.analysis).


rule aggregate:
    input:
        pretrain_metrics(),
        finetune_metrics(),
    output:
        runs=report(
            "results/runs.csv",
            caption=caption("runs"),
            category="Tables",
            labels={"table": "runs (one row per stage run)"},
        ),
        runs_parquet="results/runs.parquet",
        schedules=report(
            "results/schedules.csv",
            caption=caption("schedules"),
            category="Tables",
            labels={"table": "schedules (one row per schedule and seed)"},
        ),
        schedules_parquet="results/schedules.parquet",
    log:
        f"{LOGS}/analysis/aggregate.log",
    benchmark:
        f"{BENCHMARKS}/analysis/aggregate.tsv"
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    shell:
        "precswitch aggregate --metrics {input} --out-dir results > {log} 2>&1"


rule stats:
    input:
        runs="results/runs.csv",
        schedules="results/schedules.csv",
    output:
        settings="results/analysis.json",
        summary_csv=report(
            "results/summary.csv",
            caption=caption("summary"),
            category="Tables",
            labels={"table": "summary (per schedule, mean and CI)"},
        ),
        summary_md="results/summary.md",
        deltas_csv=report(
            "results/deltas.csv",
            caption=caption("deltas"),
            category="Tables",
            labels={"table": "deltas (paired contrasts)"},
        ),
        stats_json="results/stats.json",
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
        runs="results/runs.csv",
        schedules="results/schedules.csv",
        stats="results/stats.json",
    output:
        [
            report(
                f"results/plots/{name}.svg",
                caption=caption(name),
                category=PLOTS[name]["category"],
                labels=PLOTS[name]["labels"],
            )
            for name in PLOTS
        ],
        [f"results/plots/{name}.png" for name in PLOTS],
    log:
        f"{LOGS}/analysis/plots.log",
    benchmark:
        f"{BENCHMARKS}/analysis/plots.tsv"
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    shell:
        "precswitch plots --runs {input.runs} --schedules {input.schedules}"
        " --stats {input.stats} --out {output} > {log} 2>&1"


rule verdict:
    input:
        stats="results/stats.json",
    output:
        report(
            "results/verdict.md",
            caption=caption("verdict"),
            category="Verdict",
            labels={"document": "verdict"},
        ),
    log:
        f"{LOGS}/analysis/verdict.log",
    benchmark:
        f"{BENCHMARKS}/analysis/verdict.tsv"
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    shell:
        "precswitch verdict --stats {input.stats} --out {output} > {log} 2>&1"
