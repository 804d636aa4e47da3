# Data: the synthetic language (once), the tokenizer (once, on the stage-1 source) and one prepared
# dataset per stage. A refused data source is said on the console too (the log's last line: the
# one-line error), not only in the job's log.

from precswitch.data.synthetic import LanguageConfig

LANGUAGE_KEYS = set(LanguageConfig.__dataclass_fields__)


rule synth:
    output:
        SYNTH_FILES,
    log:
        f"{LOGS}/data/synth.log",
    benchmark:
        f"{BENCHMARKS}/data/synth.tsv"
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    params:
        out=lambda w, output: os.path.dirname(output[0]),
        seed=config["data"]["synthetic"]["seed"],
        n_corpus=config["data"]["synthetic"]["n_corpus"],
        n_train=config["data"]["synthetic"]["n_train"],
        n_dev=config["data"]["synthetic"]["n_dev"],
        n_test=config["data"]["synthetic"]["n_test"],
        # the language's knobs set in data.synthetic (the others keep synthetic.LanguageConfig's values)
        language=lambda w: json.dumps(
            {
                k: v
                for k, v in config["data"]["synthetic"].items()
                if k in LANGUAGE_KEYS
            },
            sort_keys=True,
        ),
    shell:
        "precswitch synth --out {params.out} --seed {params.seed}"
        " --n-corpus {params.n_corpus} --n-train {params.n_train} --n-dev {params.n_dev}"
        " --n-test {params.n_test} --language {params.language:q} > {log} 2>&1"


rule tokenizer:
    input:
        fetch_inputs(),
        source_inputs("pretrain"),
    output:
        directory(TOKENIZER_DIR),
    log:
        f"{LOGS}/data/tokenizer.log",
    benchmark:
        f"{BENCHMARKS}/data/tokenizer.tsv"
    conda:
        "../../envs/precswitch.yaml"
    params:
        offline=OFFLINE_ENV,
        source=source_json("pretrain"),
        options=tokenizer_options(),
    shell:
        "{params.offline}precswitch tokenizer --source {params.source:q} --out {output} {params.options}"
        " > {log} 2>&1 || (tail -n 1 {log} >&2; exit 1)"


rule prepare:
    input:
        fetch_inputs(),
        source=lambda w: source_inputs(w.stage),
        tokenizer=TOKENIZER_DIR,
    output:
        directory(PREPARED_DIR),
    log:
        f"{LOGS}/data/prepare-{{stage}}.log",
    benchmark:
        f"{BENCHMARKS}/data/prepare-{{stage}}.tsv"
    # before any training job (priority 1): a fine-tuning table that cannot be used (one class, a
    # malformed line, no rows) then stops the study before stage 1 trains, not after it
    priority: 2
    conda:
        "../../envs/precswitch.yaml"
    params:
        offline=OFFLINE_ENV,
        source=lambda w: source_json(w.stage),
        objective=lambda w: OBJECTIVE[w.stage],
        max_length=lambda w: config["train"][w.stage]["max_length"],
    shell:
        "{params.offline}precswitch prepare --source {params.source:q} --tokenizer {input.tokenizer}"
        " --objective {params.objective} --max-length {params.max_length} --out {output}"
        " > {log} 2>&1 || (tail -n 1 {log} >&2; exit 1)"
