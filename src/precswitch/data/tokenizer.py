"""WordPiece tokenizer training (``tokenizers``) and saving as a ``transformers`` fast BERT tokenizer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from ..errors import PrecswitchError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DEFAULT_VOCAB_SIZE = 8000
DEFAULT_MODEL_MAX_LENGTH = 512
#: transformers leaves ``model_max_length`` at this sentinel (1e30) when nothing set it.
_HUGE = int(1e29)


def _learn_vocab(word_counts: dict[str, int], vocab_size: int) -> list[str]:
    """A deterministic WordPiece vocabulary: every character (as ``c`` and ``##c``), then frequent whole words,
    then frequent word-initial pieces and ``##`` continuation pieces of the words left out.

    ``tokenizers``' own WordPieceTrainer breaks ties between equally frequent merges in hash-map order, which
    differs from process to process (the same texts gave different vocabularies), so the vocabulary is chosen
    here, with every tie broken by the string. Tokenization itself is ``tokenizers``' WordPiece model
    (greedy longest match first), the normalizer and pre-tokenizer are BERT's.
    """
    chars = sorted({c for w in word_counts for c in w})
    vocab: list[str] = list(SPECIAL_TOKENS) + chars + [f"##{c}" for c in chars]
    seen = set(vocab)
    budget = vocab_size - len(vocab)
    if budget < 0:  # truncating would leave characters (and every word that has one) as [UNK]
        raise PrecswitchError(
            f"tokenizer vocab_size {vocab_size} (--vocab-size) cannot hold the {len(chars)} distinct characters "
            f"of the text (each as c and ##c) and the {len(SPECIAL_TOKENS)} special tokens: every word with a "
            f"character left out would be [UNK]; use at least {len(vocab)}, plus room for whole words and pieces")
    if budget == 0:
        return vocab
    ranked = sorted(word_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    words = [w for w, c in ranked if len(w) > 1 and (c >= 2 or len(ranked) <= budget)]
    n_words = min(len(words), budget if len(words) <= budget else int(budget * 0.8))
    for w in words[:n_words]:
        if w not in seen:
            vocab.append(w)
            seen.add(w)
    budget = vocab_size - len(vocab)
    if budget > 0:  # pieces of the words not in the vocabulary, scored by the words' counts
        pieces: dict[str, int] = {}
        for w, c in word_counts.items():
            if w in seen or len(w) < 3:
                continue
            for k in range(2, len(w)):
                pieces[w[:k]] = pieces.get(w[:k], 0) + c
                pieces["##" + w[-k:]] = pieces.get("##" + w[-k:], 0) + c
        # skip a piece already in the vocabulary (a prefix equal to a whole word) before counting the budget,
        # so that the vocabulary is filled to vocab_size while there are pieces
        for piece, _ in sorted(pieces.items(), key=lambda kv: (-kv[1], kv[0])):
            if len(vocab) >= vocab_size:
                break
            if piece not in seen:
                vocab.append(piece)
                seen.add(piece)
    return vocab


def train_wordpiece(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, *, lowercase: bool = True):
    """Train a BERT-style WordPiece ``tokenizers.Tokenizer``; the same texts give the same tokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise PrecswitchError(f"--vocab-size must be > {len(SPECIAL_TOKENS)}, got {vocab_size}")
    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                            lowercase=lowercase)
    pre = pre_tokenizers.BertPreTokenizer()
    counts: dict[str, int] = {}
    for t in texts:
        for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(t)):
            counts[w] = counts.get(w, 0) + 1
    if not counts:
        raise PrecswitchError("tokenizer: the source has no text to train on")
    vocab = _learn_vocab(counts, vocab_size)
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]",
                                     max_input_chars_per_word=100, continuing_subword_prefix="##"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.add_special_tokens(SPECIAL_TOKENS)
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


def _lowercases(hf) -> bool:
    norm = getattr(getattr(hf, "backend_tokenizer", None), "normalizer", None)
    return norm is not None and norm.normalize_str("Ab") == "ab"


def _cased_vocab(hf) -> bool:
    """At least 1% of the (non-special) vocabulary has an upper-case letter (bert-base-cased: ~30%)."""
    special = set(hf.all_special_tokens)
    words = [t for t in hf.get_vocab() if t not in special]
    return bool(words) and sum(any(c.isupper() for c in t) for t in words) >= 0.01 * len(words)


def copy_pretrained(name_or_dir: str, out: str | Path, *, model_max_length: int | None = None,
                    revision: str | None = None) -> Path:
    """Copy a pretrained tokenizer (local dir, or hub name if cached / online) into ``out``.

    ``revision``: the hub branch, tag or commit of ``name_or_dir`` (hub names only).
    """
    from transformers import AutoTokenizer

    if model_max_length is not None and model_max_length < 8:  # 0 saved as 0 left prepare's --max-length unbounded
        raise PrecswitchError(f"--model-max-length must be >= 8, got {model_max_length}")
    rev = {"revision": revision} if revision else {}
    if rev and Path(name_or_dir).expanduser().exists():
        raise PrecswitchError(f"--revision {revision!r} is for hub models; {name_or_dir!r} is a local directory")
    try:
        hf = AutoTokenizer.from_pretrained(name_or_dir, **rev)
    except Exception as e:  # noqa: BLE001 - missing dir, offline hub, bad files
        msg = " ".join(str(e).split()) or type(e).__name__  # the whole message on one line, not its first line
        msg = msg if len(msg) <= 400 else msg[:400] + " ..."
        at = f" at revision {revision!r}" if revision else ""
        from ..fetch import hub_offline

        if hub_offline() and not Path(name_or_dir).expanduser().exists():  # a hub name, and no network allowed
            msg = (f"offline (HF_HUB_OFFLINE) and it is not in the cache (HF_HOME="
                   f"{os.environ.get('HF_HOME') or '~/.cache/huggingface'}): run the fetch rule first, online "
                   f"({msg[:200]})")
        raise PrecswitchError(f"--pretrained: cannot load tokenizer {name_or_dir!r}{at}: {msg}") from None
    words = [t for t in hf.get_vocab() if t not in set(hf.all_special_tokens)]
    if not words:
        # transformers 5 builds an empty tokenizer from a model dir without tokenizer files instead of failing:
        # every word would become [UNK], masked LM would have nothing to mask, and the study would record it as
        # a numeric divergence
        raise PrecswitchError(
            f"--pretrained: tokenizer {name_or_dir!r} has no vocabulary (only its {len(hf.get_vocab())} special "
            "tokens): no tokenizer.json or vocab.txt there? Save the tokenizer beside the model "
            "(tokenizer.save_pretrained(dir))")
    if _lowercases(hf) and _cased_vocab(hf):
        # transformers 5 rebuilds a BERT tokenizer's normalizer from tokenizer_config.json, where a missing
        # do_lower_case means True: a cased model whose config omits it would be fed lowercased text that
        # can never produce its capitalised vocabulary (tokenizer.json's own normalizer is cased).
        try:
            cased = AutoTokenizer.from_pretrained(name_or_dir, do_lower_case=False, **rev)
        except Exception:  # noqa: BLE001
            cased = None
        if cased is None or _lowercases(cased):
            raise PrecswitchError(f"--pretrained: tokenizer {name_or_dir!r} lowercases its input but its vocabulary "
                                  "is cased; set do_lower_case: false in its tokenizer_config.json")
        hf = cased
    if model_max_length is not None:
        hf.model_max_length = int(model_max_length)
    elif not hf.model_max_length or hf.model_max_length >= _HUGE:
        hf.model_max_length = DEFAULT_MODEL_MAX_LENGTH
    return _save(hf, out, {"kind": "pretrained", "pretrained": name_or_dir, "revision": revision,
                           "vocab_size": len(hf),
                           "model_max_length": hf.model_max_length, "lowercase": _lowercases(hf)})


def load_tokenizer(path: str | Path):
    """Load a tokenizer written by :func:`build_tokenizer` / :func:`copy_pretrained`. A BERT tokenizer (what
    build_tokenizer writes) loads through its own class, the one AutoTokenizer picks for it: AutoTokenizer imports
    transformers' model configuration code, and with it torch, which data preparation does not need."""
    p = Path(path)
    if not p.is_dir():
        raise PrecswitchError(f"--tokenizer: directory not found: {p} (write it with `precswitch tokenizer`)")
    try:
        config = json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    if isinstance(config, dict) and config.get("tokenizer_class") in ("BertTokenizer", "BertTokenizerFast"):
        from transformers import BertTokenizerFast as cls
    else:
        from transformers import AutoTokenizer as cls
    try:
        return cls.from_pretrained(str(p))
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PrecswitchError(f"--tokenizer: cannot load tokenizer from {p}: {msg}") from None
