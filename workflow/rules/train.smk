# Training: stage 1 once per (stage-1 precision, seed), shared by every schedule starting with that
# precision; stage 2 once per (schedule, seed). One process per stage, so its clocks and peak memory
# are its own. `threads` keeps --cores from being oversubscribed; `gpu` (limited to 1 by
# profiles/default) keeps two timed jobs off one GPU.


rule pretrain:
    input:
        fetch_inputs(),
        data=PREPARED_DIR.format(stage="pretrain"),
        tokenizer=TOKENIZER_DIR,
    output:
        metrics=f"{PRETRAIN_DIR}/metrics.json",
        steps=f"{PRETRAIN_DIR}/steps.csv",
        checkpoint=directory(f"{PRETRAIN_DIR}/checkpoint"),
    log:
        f"{LOGS}/pretrain/{{precision}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/pretrain/{{precision}}/seed{{seed}}.tsv"
    conda:
        "../../envs/precswitch.yaml"
    threads: config["threads"]
    resources:
        mem_mb=config["resources"]["mem_mb"],
        runtime=config["resources"]["runtime"],
        gpu=GPU_PER_JOB,
    params:
        offline=OFFLINE_ENV,
        hparams=pretrain_hparams,
        out=lambda w, output: os.path.dirname(output.metrics),
    shell:
        "{params.offline}precswitch train --hparams {params.hparams:q} --out {params.out} > {log} 2>&1"


rule finetune:
    input:
        fetch_inputs(),
        unpack(finetune_inputs),
        data=PREPARED_DIR.format(stage="finetune"),
        tokenizer=TOKENIZER_DIR,
    output:
        metrics=f"{FINETUNE_DIR}/metrics.json",
        steps=f"{FINETUNE_DIR}/steps.csv",
    log:
        f"{LOGS}/finetune/{{schedule}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/finetune/{{schedule}}/seed{{seed}}.tsv"
    conda:
        "../../envs/precswitch.yaml"
    threads: config["threads"]
    resources:
        mem_mb=config["resources"]["mem_mb"],
        runtime=config["resources"]["runtime"],
        gpu=GPU_PER_JOB,
    params:
        offline=OFFLINE_ENV,
        hparams=finetune_hparams,
        out=lambda w, output: os.path.dirname(output.metrics),
    shell:
        "{params.offline}precswitch train --hparams {params.hparams:q} --out {params.out} > {log} 2>&1"
