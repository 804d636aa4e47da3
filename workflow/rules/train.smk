# Training: stage 1 once per (stage-1 spec, seed), shared by every schedule whose stage 1 is the same
# (same precision and same in-stage switch, if any: results/runs/pretrain/amp_fp16-to-fp32-at80/);
# stage 2 once per (schedule, seed). One process per stage, so its clocks and peak memory are its
# own. `threads` keeps --cores from being oversubscribed; `gpu` (limited to 1 by profiles/default)
# keeps two timed jobs off one GPU. A stage skipped on this device (on_unsupported: skip) writes
# metrics.json, a header-only steps.csv and (stage 1) a checkpoint/ holding only its stage file:
# the stage 2 started from it is then recorded as skipped too.
# `--log {log}`, not `> {log}`: the trainer opens its log only once it holds the run dir, so a run refused
# because another process trains there leaves that run's log as it was (and says why on the console).


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
    # stage-1 jobs gate every fine-tuning job: run them first, so that the short stage-2 jobs fill
    # the end of the study instead of one late stage 1 leaving slots idle
    priority: 1
    conda:
        "../../envs/precswitch.yaml"
    threads: config["threads"]
    resources:
        mem_mb=config["resources"]["mem_mb"],
        runtime=config["resources"]["runtime"],
        gpu=training_gpus,
    params:
        offline=OFFLINE_ENV,
        hparams=pretrain_hparams,
        out=lambda w, output: os.path.dirname(output.metrics),
    shell:
        "{params.offline}precswitch train --hparams {params.hparams:q} --out {params.out} --log {log}"


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
        gpu=training_gpus,
    params:
        offline=OFFLINE_ENV,
        hparams=finetune_hparams,
        out=lambda w, output: os.path.dirname(output.metrics),
    shell:
        "{params.offline}precswitch train --hparams {params.hparams:q} --out {params.out} --log {log}"
