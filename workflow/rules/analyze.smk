# Analysis: the two tables, statistics, plots and the verdict (precswitch.analysis).


rule aggregate:
    input:
        pretrain_metrics(),
        finetune_metrics(),
    output:
        runs=report(
            "results/runs.csv",
            caption="../report/runs.rst",
            category="Tables",
            labels={"table": "runs (one row per stage run)"},
        ),
        runs_parquet="results/runs.parquet",
        schedules=report(
            "results/schedules.csv",
            caption="../report/schedules.rst",
            category="Tables",
            labels={"table": "schedules (one row per schedule and seed)"},
        ),
        schedules_parquet="results/schedules.parquet",
    log:
        f"{LOGS}/analysis/aggregate.log",
    benchmark:
        f"{BENCHMARKS}/analysis/aggregate.tsv"
    conda:
        "../../envs/precswitch.yaml"
    shell:
        "precswitch aggregate --metrics {input} --out-dir results > {log} 2>&1"
