# Models and data from the Hugging Face hub, downloaded ONCE so that compute jobs can run offline.
#
# `fetch` is a local rule: on a cluster it runs where Snakemake runs (a login node, with internet),
# never on a compute node. It calls `precswitch fetch` (src/precswitch/fetch.py), which puts
# model.init (a hub name) and every `kind: hub` data source of the config into the standard caches
# (HF_HOME / HF_HUB_CACHE / HF_DATASETS_CACHE; set HF_HOME to a shared file system on a cluster)
# and writes a manifest of what was resolved where. Local model dirs and data files are validated
# (they must exist). Run with HF_HUB_OFFLINE=1 it downloads nothing and names what the cache lacks.
#
# Included from the top-level Snakefile after common.smk (it uses config, STAGES, LOGS). Rules that
# read hub models/datasets (tokenizer, prepare, and training from a hub model.init) take
# `fetch_inputs()` as an input, so they run after the download; their shell commands may then be
# prefixed with `{OFFLINE_ENV}` so that they never touch the network.

FETCH_MANIFEST = "results/data/fetch-manifest.json"


def _hub_model_init():
    """model.init when it names a hub model (not scratch, not an existing local directory)."""
    init = str(config["model"]["init"])
    if init == "scratch" or os.path.exists(os.path.expanduser(init)):
        return None
    return init


def fetch_needed():
    """True when the config reads anything from the hub (a model or a data source)."""
    return _hub_model_init() is not None or any(
        config["data"][stage]["kind"] == "hub" for stage in STAGES
    )


def fetch_inputs(wildcards=None):
    """Input function: the fetch manifest when the config needs the hub, else nothing."""
    return [FETCH_MANIFEST] if fetch_needed() else []


def fetch_config_json():
    """The part of the config `precswitch fetch` reads (changing it reruns the fetch)."""
    spec = {
        "model": {"init": config["model"]["init"]},
        "data": {stage: config["data"][stage] for stage in STAGES},
    }
    return json.dumps(spec, sort_keys=True)


# Environment prefix for jobs that must not download (compute nodes): everything is in the cache.
OFFLINE_ENV = (
    "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "
    if fetch_needed()
    else ""
)


rule fetch:
    localrule: True
    output:
        FETCH_MANIFEST,
    log:
        f"{LOGS}/data/fetch.log",
    conda:
        "../../envs/precswitch.yaml"
    params:
        spec=fetch_config_json(),
    shell:
        "precswitch fetch --config {params.spec:q} --manifest {output} > {log} 2>&1"
