"""precswitch.fetch: local dirs/files resolve to themselves, offline caches are checked, and a missing
model/dataset is named. Nothing here touches the network: every hub call runs with HF_HUB_OFFLINE=1
in a subprocess with its own HF_HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from precswitch import fetch
from precswitch.errors import PrecswitchError

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the a red blue old young fox dog cat bird chased saw liked met quickly slowly".split()


def make_tiny_model(out: Path, objective: str = "mlm", max_positions: int = 64) -> Path:
    """A tiny BERT (+ its tokenizer) written with save_pretrained: a stand-in for bert-base-cased (whose
    512 positions a study's max_length is checked against: ``max_positions``)."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {t: i for i, t in enumerate(specials + WORDS + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_positions)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=max_positions, pad_token_id=0)
    model = (BertForMaskedLM if objective == "mlm" else BertForSequenceClassification)(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


def make_hub_cache(hf_home: Path, repo_id: str, sha: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """Lay out a model in the Hugging Face hub cache format, as snapshot_download would have."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    make_tiny_model(repo / "snapshots" / sha)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    return repo / "snapshots" / sha


def run_fetch(args: list[str], env_extra: dict, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(PYTHONPATH=str(ROOT / "src"), **env_extra)
    return subprocess.run([sys.executable, "-m", "precswitch.fetch", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def test_requirements_of_the_gpu_configs():
    cfg, _ = fetch.load_config(str(ROOT / "config" / "bert-base-mrpc.yaml"))
    need = fetch.requirements(cfg)
    assert need[0] == {"role": "model.init", "kind": "model", "name": "bert-base-cased", "revision": None}
    assert need[1]["kind"] == "hub_dataset" and need[1]["name"] == "Salesforce/wikitext"
    assert need[1]["config"] == "wikitext-103-raw-v1" and need[1]["splits"] == ["train", "validation"]
    assert need[2]["name"] == "nyu-mll/glue" and need[2]["config"] == "mrpc"
    cfg, _ = fetch.load_config(str(ROOT / "config" / "bert-small-scratch.yaml"))
    roles = [(n["role"], n.get("name")) for n in fetch.requirements(cfg)]
    assert roles == [("data.pretrain", "Salesforce/wikitext"), ("data.finetune", "nyu-mll/glue")]  # scratch model
    # the default study needs nothing from outside
    cfg, _ = fetch.load_config(str(ROOT / "config" / "config.yaml"))
    assert {n["kind"] for n in fetch.requirements(cfg)} == {"synthetic"}


def test_local_dirs_and_files_resolve_to_themselves(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_tiny_model(tmp_path / "models" / "tiny")
    (tmp_path / "corpus.txt").write_text("the red fox\nthe old dog\n")
    (tmp_path / "train.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta\tb\n")
    (tmp_path / "dev.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t1\t2\ta\tc\n")
    cfg = {"model": {"init": "./models/tiny"},
           "data": {"pretrain": {"kind": "text", "train": ["corpus.txt"]},
                    "finetune": {"kind": "tsv", "train": "train.tsv", "eval": "dev.tsv"}}}
    res = fetch.fetch(cfg, tmp_path / "out" / "manifest.json")
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk["items"] == res["items"]
    model, pre, fin = res["items"]
    assert model["kind"] == "local_dir" and model["path"] == str((tmp_path / "models" / "tiny").resolve())
    assert model["weights"] == ["model.safetensors"] and "tokenizer.json" in model["files"]
    assert pre == {"role": "data.pretrain", "kind": "local_files",
                   "files": [{"path": "corpus.txt", "resolved": str(tmp_path / "corpus.txt"), "bytes": 24}]}
    assert [f["path"] for f in fin["files"]] == ["train.tsv", "dev.tsv"]
    assert res["schema_version"] == 1 and "hub_cache" in res


def test_missing_local_things_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PrecswitchError, match=r"model.init: local model directory './nope' does not exist"):
        fetch.fetch({"model": {"init": "./nope"}})
    (tmp_path / "empty").mkdir()
    with pytest.raises(PrecswitchError, match="has no config.json"):
        fetch.fetch({"model": {"init": "./empty"}})
    with pytest.raises(PrecswitchError, match=r"data.finetune: file 'dev.tsv' does not exist"):
        (tmp_path / "train.tsv").write_text("x\n")
        fetch.fetch({"data": {"finetune": {"kind": "tsv", "train": "train.tsv", "eval": "dev.tsv"}}},
                    tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()  # nothing written on failure
    with pytest.raises(PrecswitchError, match="required for kind hub"):
        fetch.fetch({"data": {"pretrain": {"kind": "hub"}}})
    with pytest.raises(PrecswitchError, match="does not exist"):
        fetch.load_config(str(tmp_path / "no.yaml"))


def test_offline_empty_cache_names_what_is_missing(tmp_path):
    hf_home = tmp_path / "hf"
    cfg = {"model": {"init": "bert-base-cased"},
           "data": {"pretrain": {"kind": "hub", "name": "Salesforce/wikitext", "config": "wikitext-103-raw-v1",
                                 "text_column": "text"},
                    "finetune": {"kind": "hub", "name": "nyu-mll/glue", "config": "mrpc"}}}
    r = run_fetch(["--config", json.dumps(cfg), "--manifest", str(tmp_path / "m.json")],
                  {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}, tmp_path)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip()
    assert err.startswith("precswitch: error: 3 requirements unavailable")
    assert "hub model 'bert-base-cased' is not available offline" in err
    assert "hub dataset 'Salesforce/wikitext' config 'wikitext-103-raw-v1' split 'train'" in err
    assert "hub dataset 'nyu-mll/glue' config 'mrpc'" in err
    assert str(hf_home / "hub") in err and "Traceback" not in r.stderr
    assert not (tmp_path / "m.json").exists()


def test_offline_cached_model_resolves_and_loads(tmp_path):
    hf_home = tmp_path / "hf"
    snap = make_hub_cache(hf_home, "acme/tiny-bert")
    r = run_fetch(["--config", json.dumps({"model": {"init": "acme/tiny-bert"}}), "--manifest",
                   str(tmp_path / "m.json")], {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}, tmp_path)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "m.json").read_text())
    item = m["items"][0]
    assert item["kind"] == "hub_model" and item["name"] == "acme/tiny-bert"
    assert item["path"] == str(snap) and item["revision"] == snap.name
    assert item["verified"] and item["offline"] is True and m["hub_offline"] is True
    assert m["hub_cache"] == str(hf_home / "hub")
    # a snapshot without weights is reported, not silently accepted
    (snap / "model.safetensors").unlink()
    r = run_fetch(["--config", json.dumps({"model": {"init": "acme/tiny-bert"}}), "--manifest",
                   str(tmp_path / "m2.json")], {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}, tmp_path)
    assert r.returncode == 2 and "the cached snapshot lacks weights" in r.stderr


def test_revision_is_for_hub_sources_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    need = fetch.requirements({"model": {"init": "bert-base-cased", "revision": "v1.0"},
                               "data": {"finetune": {"kind": "hub", "name": "nyu-mll/glue", "config": "mrpc",
                                                     "revision": "abc123"}}})
    assert need[0]["revision"] == "v1.0" and need[2]["revision"] == "abc123" and need[1]["kind"] == "synthetic"
    with pytest.raises(PrecswitchError, match=r"config key model.revision: 'v1' is for hub models only; "
                                              r"model.init is scratch"):
        fetch.requirements({"model": {"revision": "v1"}})
    make_tiny_model(tmp_path / "tiny")
    with pytest.raises(PrecswitchError, match=r"config key model.revision: .*local directory './tiny'"):
        fetch.requirements({"model": {"init": "./tiny", "revision": "v1"}})
    with pytest.raises(PrecswitchError, match=r"config key data.pretrain.revision: 'v1' is for kind hub only"):
        fetch.requirements({"data": {"pretrain": {"kind": "text", "train": ["c.txt"], "revision": "v1"}}})
    with pytest.raises(PrecswitchError, match=r"config key data.finetune.revision: .* or null, got 3"):
        fetch.requirements({"data": {"finetune": {"kind": "hub", "name": "x/y", "revision": 3}}})


def test_offline_pinned_revision_resolves_to_its_commit(tmp_path):
    """A tag in the cache (refs/v1) resolves offline to its snapshot; the manifest records both the
    requested revision and the commit; a revision the cache lacks is named."""
    hf_home = tmp_path / "hf"
    main_snap = make_hub_cache(hf_home, "acme/tiny-bert")
    old = "fedcba9876543210fedcba9876543210fedcba98"
    make_tiny_model(main_snap.parent / old)
    (main_snap.parent.parent / "refs" / "v1").write_text(old)
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    for revision, commit in (("v1", old), (None, main_snap.name)):
        cfg = {"model": {"init": "acme/tiny-bert", "revision": revision}}
        r = run_fetch(["--config", json.dumps(cfg), "--manifest", str(tmp_path / "m.json")], env, tmp_path)
        assert r.returncode == 0, r.stderr
        item = json.loads((tmp_path / "m.json").read_text())["items"][0]
        assert item["revision_requested"] == revision and item["commit"] == commit, item
        assert item["path"] == str(main_snap.parent / commit) and item["verified"]
        assert f"@ {commit}" in r.stdout
    cfg = {"model": {"init": "acme/tiny-bert", "revision": "v2"}}
    r = run_fetch(["--config", json.dumps(cfg), "--manifest", str(tmp_path / "m2.json")], env, tmp_path)
    assert r.returncode == 2 and "hub model 'acme/tiny-bert' at revision 'v2' is not available offline" in r.stderr


def test_hub_calls_receive_the_revision(tmp_path, monkeypatch):
    """snapshot_download, the verifying from_pretrained calls and load_dataset all get revision=."""
    import datasets
    import huggingface_hub
    import transformers

    calls = []
    snap = make_tiny_model(tmp_path / "snapshots" / "c0ffee")

    def snapshot_download(name, **kw):
        calls.append(("snapshot_download", name, kw.get("revision")))
        return str(snap)

    def loader(what):
        def from_pretrained(name, *a, **kw):
            calls.append((what, name, kw.get("revision")))
        return from_pretrained

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(fetch, "_weights_patterns", lambda name, rev: calls.append(("list", name, rev)) or [])
    monkeypatch.setattr(fetch, "hub_offline", lambda: False)
    for cls in ("AutoConfig", "AutoTokenizer", "AutoModel"):
        monkeypatch.setattr(getattr(transformers, cls), "from_pretrained", loader(cls))
    entry = fetch.resolve_hub_model("acme/tiny-bert", revision="v1")
    assert entry["revision_requested"] == "v1" and entry["commit"] == "c0ffee"
    assert calls == [("list", "acme/tiny-bert", "v1"), ("snapshot_download", "acme/tiny-bert", "v1"),
                     ("AutoConfig", "acme/tiny-bert", "v1"), ("AutoTokenizer", "acme/tiny-bert", "v1"),
                     ("AutoModel", "acme/tiny-bert", "v1")]

    class DS(list):
        column_names = ["text"]

    got = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **kw: got.append((a, kw)) or DS(["x"]))
    monkeypatch.setattr(fetch, "_dataset_commit", lambda name, rev, offline: "d00d" if rev == "abc" else None)
    entry = fetch.resolve_hub_dataset("nyu-mll/glue", "mrpc", ["train"], "data.finetune", revision="abc")
    assert got == [(("nyu-mll/glue", "mrpc"), {"split": "train", "revision": "abc"})]
    assert entry["revision_requested"] == "abc" and entry["commit"] == "d00d"


def test_a_config_without_split_names_fetches_the_schema_defaults():
    """`precswitch fetch --config study.yaml` on a file that leaves the split names out fetches the splits the
    workflow reads (the schema defaults train and validation), not others."""
    need = fetch.requirements({"data": {"finetune": {"kind": "hub", "name": "nyu-mll/glue", "config": "mrpc"}}})
    assert need[1]["splits"] == ["train", "validation"]


def test_local_things_that_are_not_what_they_should_be_are_named(tmp_path, monkeypatch):
    """A data file that is a directory, a model directory without weights: named now, not by the job that
    reads them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.tsv").mkdir()
    with pytest.raises(PrecswitchError, match=r"data.finetune: file 'train.tsv' does not exist \(it is a directory\)"):
        fetch.fetch({"data": {"finetune": {"kind": "tsv", "train": "train.tsv", "eval": "train.tsv"}}})
    make_tiny_model(tmp_path / "tiny")
    (tmp_path / "tiny" / "model.safetensors").unlink()
    with pytest.raises(PrecswitchError, match=r"model directory './tiny' holds no weights"):
        fetch.fetch({"model": {"init": "./tiny"}})


# --------------------------------------------------------------------------- mutation audit 2 (fetch): in-process


def test_config_forms_and_values_fetch_refuses(tmp_path):
    """Inline JSON may start with whitespace (a YAML block scalar, a shell heredoc); a config that is not a
    mapping, a blank revision and an unknown data kind are refused naming the key; a source without kind is the
    schema default, synthetic."""
    assert fetch.load_config('\n  {"model": {"init": "scratch"}}') == ({"model": {"init": "scratch"}}, "<inline>")
    lst = tmp_path / "list.yaml"
    lst.write_text("- model\n- data\n")
    with pytest.raises(PrecswitchError, match=r"^config '.*list.yaml': expected a mapping, got list$"):
        fetch.load_config(str(lst))
    with pytest.raises(PrecswitchError, match=r"^--config: inline JSON is not valid"):
        fetch.load_config('{"model": ')
    with pytest.raises(PrecswitchError, match=r"^config key data.finetune.revision: a branch, tag or commit .*got '  '"):
        fetch.requirements({"data": {"finetune": {"kind": "hub", "name": "x/y", "revision": "  "}}})
    with pytest.raises(PrecswitchError, match=r"^config key data.pretrain.kind: unknown kind 'xml'; allowed: synthetic"):
        fetch.requirements({"data": {"pretrain": {"kind": "xml", "train": "a.xml"}}})
    need = fetch.requirements({"data": {"pretrain": {"eval_fraction": 0.1}}})
    assert [n["kind"] for n in need] == ["synthetic", "synthetic"]


# --------------------------------------------------------------------------- mutation audit 4 (fetch)


def test_a_missing_relative_data_file_says_what_it_is_relative_to(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PrecswitchError, match=rf"^data.pretrain: file 'c.txt' does not exist \(relative paths are "
                                              rf"relative to {tmp_path}\)$"):
        fetch.resolve_local_files(["c.txt"], "data.pretrain")


def _online(monkeypatch):
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)


def test_an_online_download_failure_is_not_called_offline(monkeypatch):
    """huggingface_hub raises LocalEntryNotFoundError online too (network down, no cached copy): that is a
    download failure of the named model and revision, not 'not available offline (HF_HUB_OFFLINE=1)'."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def snapshot_download(name, **kw):
        raise LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub.")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(fetch, "_weights_patterns", lambda name, rev: [])
    _online(monkeypatch)
    with pytest.raises(PrecswitchError, match=r"^model.init: hub model 'acme/m' \(revision 'v1'\) could not be "
                                              r"downloaded: An error happened") as e:
        fetch.resolve_hub_model("acme/m", revision="v1", verify=False)
    assert "offline" not in str(e.value)


def test_hub_dataset_offline_switch_alone_and_online(monkeypatch):
    """HF_DATASETS_OFFLINE=1 alone (the hub online) makes a dataset missing from the cache 'not available offline'
    with the way out, in fetch and in the loader; with no switch set, it is a load failure without that hint."""
    import datasets

    from precswitch.data.loading import load_source

    def load_dataset(*a, **kw):
        raise ConnectionError("Couldn't find 'acme/d' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    _online(monkeypatch)
    spec = {"kind": "hub", "name": "acme/d", "text_column": "text"}
    with pytest.raises(PrecswitchError, match=r"^data.pretrain: hub dataset 'acme/d' split 'train' could not be "
                                              r"loaded: Couldn't find"):
        fetch.resolve_hub_dataset("acme/d", None, ["train"], "data.pretrain")
    with pytest.raises(PrecswitchError, match=r"^source: cannot load hub dataset 'acme/d' config None split 'train': "
                                              r"Couldn't find"):
        load_source(spec, "mlm")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(PrecswitchError, match=r"^data.pretrain: hub dataset 'acme/d' split 'train' is not available "
                                              r"offline .*Run `precswitch fetch`"):
        fetch.resolve_hub_dataset("acme/d", None, ["train"], "data.pretrain")
    with pytest.raises(PrecswitchError, match=r"split 'train' \(HF_HUB_OFFLINE/HF_DATASETS_OFFLINE/TRANSFORMERS_OFFLINE "
                                              r"is set and it is not in the local cache"):
        load_source(spec, "mlm")


def test_a_local_dataset_folder_is_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    """Online, a hub dataset's commit is asked of the hub; a local dataset folder given as the name is not (no
    network call with a path as the repo id), and has no commit."""
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", lambda self, name, revision=None: asked.append(name))
    assert fetch._dataset_commit(str(tmp_path), None, offline=False) is None and asked == []


