# Sequential seeds (config key sequential; docs/sequential.md). Every schedule starts with the first
# `start` seeds; checkpoint `look` k decides every comparison from the stage-2 runs so far and names the
# seeds each schedule runs next (only the two schedules of each open comparison: every pair stays
# paired). The input functions walk the looks (checkpoints.look.get) until one says done, so the DAG
# grows one look at a time and each look's new runs go out in parallel. A killed study resumes at its
# last look file; a finished run is never redone (its metrics.json is an output like any other).


checkpoint look:
    input:
        metrics=lambda w: finetune_metrics(sequential_runs(int(w.k))),
    output:
        f"{SEQUENTIAL_DIR}/look{{k}}.json",
    log:
        f"{LOGS}/sequential/look{{k}}.log",
    benchmark:
        f"{BENCHMARKS}/sequential/look{{k}}.tsv"
    wildcard_constraints:
        k=r"\d+",
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    params:
        design=json.dumps(SEQUENTIAL, sort_keys=True),
    shell:
        "precswitch look --design {params.design:q} --look {wildcards.k}"
        " --metrics {input.metrics} --out {output} > {log} 2>&1"


rule sequential:
    input:
        schedules=f"{RESULTS}/schedules.csv",
    output:
        csv=report(
            f"{RESULTS}/sequential.csv",
            caption=caption("sequential"),
            category="Sequential seeds",
            labels={"table": "sequential looks (one row per comparison and look)"},
        ),
        json=f"{RESULTS}/sequential.json",
    log:
        f"{LOGS}/analysis/sequential.log",
    benchmark:
        f"{BENCHMARKS}/analysis/sequential.tsv"
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    params:
        design=json.dumps(SEQUENTIAL, sort_keys=True),
    shell:
        "precswitch sequential --design {params.design:q} --schedules {input.schedules}"
        " --csv {output.csv} --json {output.json} > {log} 2>&1"
