# Models and data from the Hugging Face hub, downloaded ONCE so that compute jobs can run offline.
#
# `fetch` is a local rule: on a cluster it runs where Snakemake runs (a login node, with internet),
# never on a compute node. It calls `precswitch fetch` (src/precswitch/fetch.py), which puts
# model.init (a hub name) and every `kind: hub` data source of the config into the standard caches
# (HF_HOME / HF_HUB_CACHE / HF_DATASETS_CACHE; set HF_HOME to a shared file system on a cluster)
# and writes a manifest of what was resolved where. Local model dirs and data files are validated
# (they must exist). Run with HF_HUB_OFFLINE=1 it downloads nothing and names what the cache lacks.
#
# Rules that read hub models/datasets (tokenizer, prepare, and training from a hub model.init) take
# `fetch_inputs()` as an input, so they run after the download, and prefix their commands with
# OFFLINE_ENV (params.offline) so that they never touch the network. The helpers (FETCH_MANIFEST,
# fetch_needed, fetch_inputs, fetch_config_json, OFFLINE_ENV) are in common.smk (what they decide: in
# precswitch.study): Snakemake's linter wants functions and rules in separate files.


rule fetch:
    output:
        FETCH_MANIFEST,
    log:
        f"{LOGS}/data/fetch.log",
    benchmark:
        f"{BENCHMARKS}/data/fetch.tsv"
    localrule: True
    conda:
        "../../envs/precswitch.yaml"
    params:
        spec=fetch_config_json(),
    shell:
        "precswitch fetch --config {params.spec:q} --manifest {output} > {log} 2>&1"
