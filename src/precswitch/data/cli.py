"""``precswitch synth | tokenizer | prepare``: the data commands (docs/contracts.md).

Heavy libraries (datasets, tokenizers, transformers) are imported inside the command functions.
"""

from __future__ import annotations

import argparse
import json

SOURCE_HELP = "data source: a JSON object, @file.json, or a .json/.yaml file path (see docs/data.md)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="write the synthetic language (corpus + MRPC-shaped paraphrase task)",
                       description="Write DIR/corpus.txt, DIR/train.tsv, DIR/dev.tsv, DIR/test.tsv (GLUE MRPC columns) and "
                                   "DIR/synth.json, deterministically from --seed.")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--n-corpus", type=int, default=None, help="corpus sentences (default 40000)")
    p.add_argument("--n-train", type=int, default=None, help="train pairs (default 3000)")
    p.add_argument("--n-dev", type=int, default=None, help="dev pairs (default 2000)")
    p.add_argument("--n-test", type=int, default=None, help="test pairs (default 2000)")
    p.add_argument("--language", default=None,
                   help="JSON object overriding LanguageConfig fields (lexicon sizes, rewrite probabilities)")
    p.set_defaults(func=_synth)

    p = sub.add_parser("tokenizer", help="train a WordPiece tokenizer on a source (or copy a pretrained one)",
                       description="Train a WordPiece tokenizer on the texts of --source and save a transformers "
                                   "fast BERT tokenizer in --out; with --pretrained, copy that tokenizer instead.")
    p.add_argument("--source", default=None, help=SOURCE_HELP)
    p.add_argument("--out", required=True)
    p.add_argument("--vocab-size", type=int, default=None, help="WordPiece vocabulary size (default 8000)")
    p.add_argument("--model-max-length", type=int, default=None, help="saved model_max_length (default 512)")
    p.add_argument("--cased", action="store_true", help="keep case (default: lowercase)")
    p.add_argument("--pretrained", default=None, metavar="NAME_OR_DIR",
                   help="copy this tokenizer (local dir, or a hub name in the local cache) instead of training")
    p.add_argument("--revision", default=None,
                   help="hub branch, tag or commit of --pretrained (a hub name; default: its default branch)")
    p.set_defaults(func=_tokenizer)

    p = sub.add_parser("prepare", help="tokenize a source into a DatasetDict (train/eval[/test]) + meta.json",
                       description="Load --source, tokenize it with --tokenizer for --objective and save a "
                                   "datasets.DatasetDict (splits train, eval) and meta.json in --out.")
    p.add_argument("--source", required=True, help=SOURCE_HELP)
    p.add_argument("--tokenizer", required=True, help="tokenizer directory (precswitch tokenizer)")
    p.add_argument("--objective", required=True, choices=["mlm", "classify"])
    p.add_argument("--max-length", required=True, type=int)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_prepare)


def _synth(args) -> int:
    from ..errors import PrecswitchError
    from .synthetic import DEFAULT_SIZES, LanguageConfig, write_synthetic

    cfg = LanguageConfig()
    if args.language:
        try:
            over = json.loads(args.language)
        except json.JSONDecodeError as e:
            raise PrecswitchError(f"--language: not valid JSON ({e.msg})") from None
        allowed = set(LanguageConfig.__dataclass_fields__)
        bad = sorted(set(over) - allowed) if isinstance(over, dict) else ["<not an object>"]
        if bad:
            raise PrecswitchError(f"--language: unknown key(s) {bad} (allowed: {sorted(allowed)})")
        cfg = LanguageConfig(**over)
    sizes = {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in DEFAULT_SIZES.items()}
    out = write_synthetic(args.out, args.seed, cfg=cfg, **sizes)
    print(json.dumps({"out": str(out), "seed": args.seed, **sizes}))
    return 0


def _tokenizer(args) -> int:
    from ..errors import PrecswitchError
    from .tokenizer import DEFAULT_MODEL_MAX_LENGTH, DEFAULT_VOCAB_SIZE, build_tokenizer, copy_pretrained

    if args.revision is not None and not args.pretrained:
        raise PrecswitchError("tokenizer: --revision goes with --pretrained (a hub model name)")
    if args.pretrained:
        out = copy_pretrained(args.pretrained, args.out, model_max_length=args.model_max_length,
                              revision=args.revision)
        print(json.dumps({"out": str(out), "pretrained": args.pretrained, "revision": args.revision}))
        return 0
    if not args.source:
        raise PrecswitchError("tokenizer: --source is required unless --pretrained is given")
    from .loading import parse_source, source_texts

    spec = parse_source(args.source)
    texts = source_texts(spec)
    # `is None`, not `or`: an explicit 0 is refused by build_tokenizer, not replaced by the default
    out = build_tokenizer(texts, args.out, DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size,
                          model_max_length=(DEFAULT_MODEL_MAX_LENGTH if args.model_max_length is None
                                            else args.model_max_length),
                          lowercase=not args.cased, source=spec)
    print(json.dumps({"out": str(out), "texts": len(texts)}))
    return 0


def _prepare(args) -> int:
    from .prepare import prepare

    meta = prepare(args.source, args.tokenizer, args.objective, args.max_length, args.out)
    print(json.dumps({k: meta.get(k) for k in ("objective", "n_train", "n_eval", "n_test", "max_length",
                                               "majority_accuracy", "test_majority_accuracy")}))
    return 0
