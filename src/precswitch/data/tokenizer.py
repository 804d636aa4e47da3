"""WordPiece tokenizer training (``tokenizers``) and saving as a ``transformers`` fast BERT tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ..errors import PrecswitchError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DEFAULT_VOCAB_SIZE = 8000
DEFAULT_MODEL_MAX_LENGTH = 512
#: transformers leaves ``model_max_length`` at this sentinel (1e30) when nothing set it.
_HUGE = int(1e29)


def train_wordpiece(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, *, lowercase: bool = True,
                    min_frequency: int = 1):
    """Train a BERT-style WordPiece ``tokenizers.Tokenizer`` (deterministic for the same texts)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise PrecswitchError(f"--vocab-size must be > {len(SPECIAL_TOKENS)}, got {vocab_size}")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=SPECIAL_TOKENS, show_progress=False,
                                        continuing_subword_prefix="##")
    texts = list(texts)
    if not any(t.strip() for t in texts):
        raise PrecswitchError("tokenizer: the source has no text to train on")
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def wrap_fast(tok, model_max_length: int = DEFAULT_MODEL_MAX_LENGTH, *, lowercase: bool = True):
    """Wrap a ``tokenizers.Tokenizer`` as a transformers fast BERT tokenizer."""
    from transformers import BertTokenizerFast

    return BertTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
        mask_token="[MASK]", do_lower_case=lowercase, model_max_length=int(model_max_length),
    )


def _save(hf_tok, out: str | Path, extra: dict) -> Path:
    import json

    from ..io import atomic_path

    out = Path(out)
    with atomic_path(out) as tmp:
        hf_tok.save_pretrained(str(tmp))
        (tmp / "precswitch_tokenizer.json").write_text(json.dumps(extra, indent=2) + "\n", encoding="utf-8")
    return out


def build_tokenizer(texts: Iterable[str], out: str | Path, vocab_size: int = DEFAULT_VOCAB_SIZE, *,
                    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH, lowercase: bool = True,
                    source: dict | None = None) -> Path:
    """Train on ``texts`` and ``save_pretrained`` into ``out`` (atomically)."""
    if model_max_length < 8:
        raise PrecswitchError(f"--model-max-length must be >= 8, got {model_max_length}")
    tok = train_wordpiece(texts, vocab_size, lowercase=lowercase)
    hf = wrap_fast(tok, model_max_length, lowercase=lowercase)
    return _save(hf, out, {"kind": "wordpiece", "vocab_size_requested": vocab_size,
                           "vocab_size": tok.get_vocab_size(), "lowercase": lowercase,
                           "model_max_length": model_max_length, "source": source})


def copy_pretrained(name_or_dir: str, out: str | Path, *, model_max_length: int | None = None) -> Path:
    """Copy a pretrained tokenizer (local dir, or hub name if cached / online) into ``out``."""
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(name_or_dir)
    except Exception as e:  # noqa: BLE001 - missing dir, offline hub, bad files
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PrecswitchError(f"--pretrained: cannot load tokenizer {name_or_dir!r}: {msg}") from None
    if model_max_length is not None:
        hf.model_max_length = int(model_max_length)
    elif not hf.model_max_length or hf.model_max_length >= _HUGE:
        hf.model_max_length = DEFAULT_MODEL_MAX_LENGTH
    return _save(hf, out, {"kind": "pretrained", "pretrained": name_or_dir,
                           "vocab_size": len(hf), "model_max_length": hf.model_max_length})


def load_tokenizer(path: str | Path):
    """Load a tokenizer written by :func:`build_tokenizer` / :func:`copy_pretrained`."""
    from transformers import AutoTokenizer

    p = Path(path)
    if not p.is_dir():
        raise PrecswitchError(f"--tokenizer: directory not found: {p} (write it with `precswitch tokenizer`)")
    try:
        return AutoTokenizer.from_pretrained(str(p))
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PrecswitchError(f"--tokenizer: cannot load tokenizer from {p}: {msg}") from None
