"""A stage's inputs: the prepared data, the tokenizer and the model (scratch, a checkpoint dir or a hub name)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ...errors import PrecswitchError
from ...io import read_json

#: the file a stage writes into its checkpoint/ saying what it is (read by the next stage)
STAGE_FILE = "precswitch_stage.json"


def quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass


def load_data(hp: dict) -> tuple[dict, dict]:
    """The prepared splits (``train``, ``eval``, and ``test`` where the data holds one) and meta.json."""
    import datasets

    data_dir = Path(hp["data"])
    meta_path = data_dir / "meta.json"
    if not data_dir.is_dir():
        raise PrecswitchError(f"data dir {str(data_dir)!r} does not exist (write it with `precswitch prepare`)")
    if not meta_path.is_file():
        raise PrecswitchError(f"data dir {str(data_dir)!r} has no meta.json: not written by `precswitch prepare`")
    meta = read_json(meta_path)
    if meta.get("objective") != hp["objective"]:
        raise PrecswitchError(
            f"data {str(data_dir)!r} was prepared for objective {meta.get('objective')!r}, "
            f"but this stage's objective is {hp['objective']!r}"
        )
    try:
        dd = datasets.load_from_disk(str(data_dir))
    except Exception as e:  # noqa: BLE001
        raise PrecswitchError(f"data dir {str(data_dir)!r} cannot be read as a prepared dataset: {e}") from None
    needed = ["train", "eval"] + (["test"] if "test" in dd else [])
    for split in needed:
        if split not in dd:
            raise PrecswitchError(f"data dir {str(data_dir)!r} lacks the {split!r} split (has {list(dd)})")
        if len(dd[split]) == 0:
            raise PrecswitchError(f"data dir {str(data_dir)!r}: the {split!r} split is empty")
    return {split: dd[split] for split in needed}, meta


def load_tokenizer(hp: dict, meta: dict):
    from transformers import AutoTokenizer

    tok_dir = hp["tokenizer"] or meta.get("tokenizer")
    if not tok_dir:
        raise PrecswitchError("no tokenizer: set hparams 'tokenizer' (the data's meta.json names none)")
    if not Path(tok_dir).exists():
        raise PrecswitchError(f"tokenizer dir {str(tok_dir)!r} does not exist")
    try:
        return AutoTokenizer.from_pretrained(str(tok_dir))
    except Exception as e:  # noqa: BLE001
        raise PrecswitchError(f"tokenizer {str(tok_dir)!r} cannot be loaded: {e}") from None


def init_info(init: str) -> dict:
    """What the init checkpoint says about itself (its stage file, written by a previous stage); {} for scratch."""
    path = Path(init) / STAGE_FILE
    return read_json(path) if init != "scratch" and path.is_file() else {}


def checkpoint_dtype(init_dir: Path) -> str | None:
    """dtype of the first floating tensor stored in a safetensors checkpoint (what the next stage reads)."""
    files = sorted(init_dir.glob("*.safetensors"))
    if not files:
        return None
    try:
        with open(files[0], "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
    except Exception:  # noqa: BLE001 - reported by from_pretrained later
        return None
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
    for k, v in header.items():
        if k != "__metadata__" and v.get("dtype") in names:
            return names[v["dtype"]]
    return None


def model_pin(hp: dict, init: str, init_stage: dict) -> dict:
    """Hub revision (requested) and commit (resolved, from the cache) of the pretrained model this run's weights
    come from: init itself when it is a hub name, else what the init checkpoint's stage file says (stage 2)."""
    if init == "scratch":
        return {"model_revision": None, "model_commit": None}
    if Path(init).expanduser().is_dir():
        return {"model_revision": init_stage.get("model_revision"), "model_commit": init_stage.get("model_commit")}
    from ...fetch import hub_commit

    return {"model_revision": hp.get("init_revision"), "model_commit": hub_commit(init, hp.get("init_revision"))}


def _attn_kernel(attn: str, device) -> str:
    """model.attn_implementation ``auto``: sdpa on CUDA (fused attention kernels), eager on a CPU (5-10% faster
    for the tiny CPU model, docs/findings.md); eager and sdpa as given."""
    if attn != "auto":
        return attn
    return "sdpa" if device is not None and torch.device(device).type == "cuda" else "eager"


def build_model(hp: dict, tokenizer, meta: dict, device=None) -> tuple[Any, str | None]:
    """Scratch from a BertConfig, or from a checkpoint dir / pretrained name; ``device`` picks the attention
    kernel of ``auto`` (None: a CPU's). Returns the model and the dtype its checkpoint stored (None: scratch/hub)."""
    from transformers import AutoConfig, BertConfig, BertForMaskedLM, BertForSequenceClassification

    model_class = BertForMaskedLM if hp["objective"] == "mlm" else BertForSequenceClassification
    labels = {"num_labels": int(meta["num_labels"])} if hp["objective"] == "classify" else {}
    arch = dict(hp["model"])
    attn = _attn_kernel(arch.pop("attn_implementation", "auto"), device)
    init = str(hp["init"])
    revision = hp.get("init_revision")
    if init == "scratch":
        cfg = BertConfig(vocab_size=arch.pop("vocab_size", None) or len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         attn_implementation=attn, **arch, **labels)
        return model_class(cfg), None
    path = Path(init).expanduser()
    is_dir = path.is_dir()
    if not is_dir and (init.startswith((".", "/", "~")) or init.count("/") > 1 or path.suffix):
        raise PrecswitchError(f"model init {init!r}: directory does not exist")
    if is_dir and not (path / "config.json").is_file():
        raise PrecswitchError(f"model dir {init!r} has no config.json: not a saved model (save_pretrained)")
    if is_dir and revision:
        raise PrecswitchError(f"init_revision {revision!r} is for a hub model; init {init!r} is a local directory")
    rev = {"revision": revision} if revision else {}  # the pinned hub branch/tag/commit (model.revision)
    try:
        cfg = AutoConfig.from_pretrained(init, **labels, **rev)
        cfg._attn_implementation = attn
        model = model_class.from_pretrained(init, config=cfg, dtype=torch.float32, **rev)
    except OSError as e:
        from ...fetch import hub_offline

        if is_dir:
            raise PrecswitchError(f"checkpoint {init!r} is corrupt or incomplete: {str(e).splitlines()[0]}") from None
        raise PrecswitchError(
            f"model {init!r}" + (f" (revision {revision!r})" if revision else "")
            + " is not a local dir and could not be loaded from the hub"
            + (" (offline: HF_HUB_OFFLINE=1 and it is not in the cache; run the download rule first)"
               if hub_offline() else "")
            + f": {str(e).splitlines()[0]}"
        ) from None
    except Exception as e:  # noqa: BLE001 - truncated safetensors etc.
        raise PrecswitchError(f"checkpoint {init!r} cannot be loaded (corrupt or truncated?): {e}") from None
    return model, (checkpoint_dtype(path) if is_dir else None)
