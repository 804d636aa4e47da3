"""WordPiece tokenizer, copying a pretrained tokenizer, and `prepare` (DatasetDict + meta.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precswitch.data.loading import source_texts
from precswitch.data.prepare import prepare
from precswitch.data.synthetic import write_synthetic
from precswitch.data.tokenizer import SPECIAL_TOKENS, build_tokenizer, copy_pretrained, load_tokenizer
from precswitch.errors import PrecswitchError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
MRPC = SHARED / "glue" / "MRPC"


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    d = write_synthetic(root / "synth", seed=1, n_corpus=1500, n_train=120, n_dev=50, n_test=30)
    spec = {"kind": "synthetic", "dir": str(d)}
    tok = build_tokenizer(source_texts(spec), root / "tok", vocab_size=3000, model_max_length=128, source=spec)
    return root, spec, tok


def test_tokenizer_is_a_saved_fast_bert_tokenizer(synth):
    root, spec, tokdir = synth
    assert sorted(p.name for p in tokdir.iterdir()) == ["precswitch_tokenizer.json", "tokenizer.json",
                                                         "tokenizer_config.json"]
    tok = load_tokenizer(tokdir)
    assert tok.is_fast and tok.model_max_length == 128
    assert json.loads((tokdir / "tokenizer_config.json").read_text())["model_max_length"] == 128
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tok.pad_token, tok.mask_token, tok.cls_token, tok.sep_token) == ("[PAD]", "[MASK]", "[CLS]", "[SEP]")
    enc = tok("The cat sat .", "a dog ran")
    toks = tok.convert_ids_to_tokens(enc["input_ids"])
    assert toks[0] == "[CLS]" and toks.count("[SEP]") == 2 and toks[-1] == "[SEP]"
    assert enc["token_type_ids"][-1] == 1 and enc["token_type_ids"][0] == 0
    assert "the" in toks  # lowercased
    # the synthetic words are whole tokens (no [UNK], no splits)
    line = (Path(spec["dir"]) / "corpus.txt").read_text().splitlines()[0]
    assert tok.tokenize(line) == line.split()


def test_tokenizer_is_deterministic(synth, tmp_path):
    root, spec, tokdir = synth
    again = build_tokenizer(source_texts(spec), tmp_path / "tok2", vocab_size=3000, model_max_length=128, source=spec)
    assert (again / "tokenizer.json").read_bytes() == (tokdir / "tokenizer.json").read_bytes()


def test_copy_pretrained_refuses_a_model_dir_without_tokenizer_files(tmp_path):
    """transformers 5 builds a 5-token tokenizer from a save_pretrained model dir that lacks tokenizer files;
    every word would become [UNK] and the study would record stage 1 as diverged. Refused, naming the cure."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertForMaskedLM(cfg).save_pretrained(tmp_path / "model_only")
    with pytest.raises(PrecswitchError, match=r"has no vocabulary \(only its \d special tokens\): no "
                                              r"tokenizer.json or vocab.txt there\?"):
        copy_pretrained(str(tmp_path / "model_only"), tmp_path / "tok")
    assert not (tmp_path / "tok").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(PrecswitchError, match="cannot load tokenizer") as e:
        copy_pretrained(str(tmp_path / "empty"), tmp_path / "tok")
    assert "\n" not in str(e.value) and not str(e.value).endswith("one of: ")  # the whole reason, on one line


def test_copy_pretrained_passes_the_hub_revision(synth, tmp_path, monkeypatch):
    import transformers

    root, spec, tokdir = synth
    real = transformers.AutoTokenizer.from_pretrained
    calls = []

    def from_pretrained(name, *a, **kw):
        calls.append((name, kw.get("revision")))
        return real(str(tokdir))  # the "hub" tokenizer

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    out = copy_pretrained("acme/tiny-bert", tmp_path / "copy", revision="v1")
    assert calls == [("acme/tiny-bert", "v1")]
    assert json.loads((out / "precswitch_tokenizer.json").read_text())["revision"] == "v1"
    monkeypatch.undo()
    with pytest.raises(PrecswitchError, match="--revision 'v1' is for hub models; .* is a local directory"):
        copy_pretrained(str(tokdir), tmp_path / "copy2", revision="v1")


CONTRACT_META = {"objective", "num_labels", "label_values", "majority_accuracy", "n_train", "n_eval", "max_length",
                 "tokenizer", "source", "source_hash", "n_test", "test_majority_accuracy"}


def test_prepare_classify(synth, tmp_path):
    import datasets

    root, spec, tokdir = synth
    meta = prepare(json.dumps(spec), tokdir, "classify", 64, tmp_path / "cls")
    assert CONTRACT_META <= set(meta)
    assert json.loads((tmp_path / "cls" / "meta.json").read_text()) == json.loads(json.dumps(meta))
    dd = datasets.load_from_disk(str(tmp_path / "cls"))
    assert set(dd) == {"train", "eval", "test"}  # synth's test.tsv: the held-out split the study reports on
    assert dd["train"].column_names == dd["test"].column_names == ["input_ids", "attention_mask", "token_type_ids",
                                                                   "labels"]
    assert dd["train"].features["labels"].dtype == "int64"
    assert (meta["n_train"], meta["n_eval"], meta["n_test"], meta["num_labels"]) == (120, 50, 30, 2)
    for split, n, key in (("eval", 50, "majority_accuracy"), ("test", 30, "test_majority_accuracy")):
        assert meta[key] == max(dd[split]["labels"].count(0), dd[split]["labels"].count(1)) / n
    (Path(spec["dir"]) / "test.tsv").rename(tmp_path / "test.tsv")  # a synth dir from before issue 38
    try:
        old = prepare(spec, tokdir, "classify", 64, tmp_path / "old")
    finally:
        (tmp_path / "test.tsv").rename(Path(spec["dir"]) / "test.tsv")
    assert (old["n_test"], old["test_majority_accuracy"]) == (None, None)
    assert set(datasets.load_from_disk(str(tmp_path / "old"))) == {"train", "eval"}
    row = dd["train"][0]
    assert row["input_ids"][0] == 2 and row["input_ids"][-1] == 3 and len(row["input_ids"]) <= 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cls", "old"]  # atomic: no temp dir left


def test_prepare_mlm_line_pairs_for_synthetic(synth, tmp_path):
    import datasets

    root, spec, tokdir = synth
    meta = prepare(spec, tokdir, "mlm", 48, tmp_path / "mlm")
    assert meta["mlm_examples"] == "pairs"
    lines = (Path(spec["dir"]) / "corpus.txt").read_text().splitlines()
    assert meta["n_train"] + meta["n_eval"] == len(lines) // 2
    dd = datasets.load_from_disk(str(tmp_path / "mlm"))
    tok = load_tokenizer(tokdir)
    first = dd["train"][0]
    assert tok.convert_ids_to_tokens(first["input_ids"]) == ["[CLS]"] + lines[0].split() + ["[SEP]"] + lines[
        1].split() + ["[SEP]"]
    assert first["token_type_ids"][0] == 0 and first["token_type_ids"][-1] == 1
    # eval starts at an even line: its first example is a whole discourse unit too
    n_eval_lines = 2 * meta["n_eval"]
    ev = tok.convert_ids_to_tokens(dd["eval"][0]["input_ids"])
    assert ev[1:-1] == lines[-n_eval_lines].split() + ["[SEP]"] + lines[-n_eval_lines + 1].split()

    with pytest.raises(PrecswitchError, match="mlm_examples 'words' not allowed"):
        prepare({**spec, "mlm_examples": "words"}, tokdir, "mlm", 16, tmp_path / "bad")


def test_prepare_errors_leave_no_output(synth, tmp_path):
    root, spec, tokdir = synth
    with pytest.raises(PrecswitchError, match="--tokenizer: directory not found"):
        prepare(spec, tmp_path / "notok", "classify", 64, tmp_path / "out")
    with pytest.raises(PrecswitchError, match="--objective 'ner' not allowed"):
        prepare(spec, tokdir, "ner", 64, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not MRPC.is_dir(), reason="../shared/data not present")
def test_prepare_real_mrpc(tmp_path):
    spec = {"kind": "tsv", "train": str(MRPC / "train.tsv"), "eval": str(MRPC / "dev.tsv"),
            "columns": {"text_a": "#1 String", "text_b": "#2 String", "label": "Quality"}, "max_train_rows": 500}
    tok = build_tokenizer(source_texts(spec), tmp_path / "tok", vocab_size=2000, model_max_length=128)
    meta = prepare(spec, tok, "classify", 128, tmp_path / "p")
    assert meta["n_train"] == 500 and meta["n_eval"] == 408
    assert meta["majority_accuracy"] == pytest.approx(279 / 408)


def _saved_bert_tokenizer(out: Path, words: list[str], lowercase: bool) -> Path:
    from transformers import BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=lowercase).save_pretrained(out)
    return out


def test_copy_pretrained_keeps_a_cased_tokenizer_cased(tmp_path):
    import json

    from precswitch.data.tokenizer import copy_pretrained, load_tokenizer

    words = ["The", "the", "Witness", "witness", "said", "He", "he", "."]
    src = _saved_bert_tokenizer(tmp_path / "cased", words, lowercase=False)
    # a cased model whose tokenizer_config.json does not say do_lower_case (tokenizer.json's normalizer is
    # cased): transformers 5 lowercases it by default
    cfg = src / "tokenizer_config.json"
    c = json.loads(cfg.read_text())
    c.pop("do_lower_case", None)
    cfg.write_text(json.dumps(c))
    copy_pretrained(str(src), tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    assert tok.tokenize("He said The Witness .") == ["He", "said", "The", "Witness", "."]
    assert json.loads((tmp_path / "tok" / "precswitch_tokenizer.json").read_text())["lowercase"] is False
    # an uncased model stays uncased
    unc = _saved_bert_tokenizer(tmp_path / "uncased", ["the", "witness", "said", "he", "."], lowercase=True)
    copy_pretrained(str(unc), tmp_path / "tok2")
    assert load_tokenizer(tmp_path / "tok2").tokenize("He said The Witness .") == ["he", "said", "the", "witness", "."]


def test_copy_pretrained_offline_names_the_cache_and_the_fetch_rule(tmp_path, monkeypatch):
    """The tokenizer job gave transformers' 'check your internet connection' where prepare, train and fetch
    name the cache and the fetch rule. (The hub's own offline switch is read at import: its failure is faked.)"""
    import transformers

    def not_cached(*a, **k):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                      "in the cached files.\nCheck your internet connection")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", not_cached)
    monkeypatch.setenv("HF_HUB_OFFLINE", "true")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(PrecswitchError, match=r"cannot load tokenizer 'acme/not-cached': offline \(HF_HUB_OFFLINE\) "
                                              r"and it is not in the cache \(HF_HOME=.*hf\): run the fetch rule first"):
        copy_pretrained("acme/not-cached", tmp_path / "tok")


def test_a_vocab_too_small_for_the_texts_characters_is_refused(tmp_path):
    """vocab_size below the texts' characters (each as c and ##c) plus the specials used to be truncated: with
    WikiText's ~200 characters and vocab_size 100, 71% of the tokens were [UNK] and the study ran on. Refused
    now, naming the key and the size needed; at exactly that size every character is still in the vocabulary."""
    texts = ["the café costs 5 € — naïve ±2 °C", "über straße 東京 ß", "plain words"] * 3
    chars = {c for t in texts for c in t.lower() if not c.isspace()}
    with pytest.raises(PrecswitchError, match=r"tokenizer vocab_size 20 \(--vocab-size\) cannot hold the \d+ "
                                              r"distinct characters .* use at least (\d+)") as e:
        build_tokenizer(texts, tmp_path / "small", vocab_size=20)
    need = int(str(e.value).split("use at least ")[1].split(",")[0])
    assert need >= len(SPECIAL_TOKENS) + 2 * len(chars) - 4  # the normalizer may merge a few
    tok = load_tokenizer(build_tokenizer(texts, tmp_path / "exact", vocab_size=need))
    assert "[UNK]" not in tok.tokenize(" ".join(texts))


GREEK = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


@pytest.fixture(scope="module")
def greek_tok(tmp_path_factory):
    """Every word of GREEK a whole token (each occurs 3 times in the training texts)."""
    root = tmp_path_factory.mktemp("greek")
    return build_tokenizer([" ".join(GREEK)] * 3, root / "tok", vocab_size=300, model_max_length=64)


def test_prepare_pack_blocks_are_the_token_stream_in_order(greek_tok, tmp_path):
    """pack: the lines' tokens concatenated in order and cut into [CLS] + L-2 tokens + [SEP] blocks; no token
    lost or repeated inside the blocks, the short tail dropped; one segment (token type 0), no padding."""
    import datasets

    lines = [" ".join(GREEK[(i + j) % 12] for j in range(i % 4 + 1)) for i in range(9)]  # 1,2,3,4,1,... = 21 words
    f = tmp_path / "c.txt"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    meta = prepare({"kind": "text", "train": [str(f)], "eval": [str(f)], "mlm_examples": "pack"}, greek_tok, "mlm", 8,
                   tmp_path / "p")
    stream = " ".join(lines).split()
    expect = [["[CLS]"] + stream[i:i + 6] + ["[SEP]"] for i in (0, 6, 12)]  # 21 tokens: 3 blocks of 6, 3 dropped
    tok = load_tokenizer(greek_tok)
    dd = datasets.load_from_disk(str(tmp_path / "p"))
    for split in ("train", "eval"):
        assert [tok.convert_ids_to_tokens(x) for x in dd[split]["input_ids"]] == expect, split
        assert dd[split]["token_type_ids"] == [[0] * 8] * 3 and dd[split]["attention_mask"] == [[1] * 8] * 3
    assert (meta["n_train"], meta["train_tokens"], meta["mean_train_length"]) == (3, 24, 8)
    assert (meta["objective"], meta["num_labels"], meta["majority_accuracy"]) == ("mlm", None, None)


def test_prepare_line_pairs_are_lines_2k_and_2k1_across_pack_groups(greek_tok, tmp_path):
    """pairs: every example is lines (2k, 2k+1) -- also past the first group of PACK_GROUP lines -- and an odd
    last line is an example of its own."""
    import datasets

    from precswitch.data.prepare import PACK_GROUP

    n = PACK_GROUP + 3
    lines = [f"{GREEK[i % 12]} {GREEK[(i // 12) % 12]}" for i in range(n)]
    f, ev = tmp_path / "c.txt", tmp_path / "e.txt"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ev.write_text("alpha beta\ngamma\ndelta\n", encoding="utf-8")
    meta = prepare({"kind": "text", "train": [str(f)], "eval": [str(ev)], "mlm_examples": "pairs"}, greek_tok, "mlm",
                   16, tmp_path / "p")
    assert (meta["n_train"], meta["n_eval"]) == (n // 2 + 1, 2)
    tok = load_tokenizer(greek_tok)
    dd = datasets.load_from_disk(str(tmp_path / "p"))
    got = [tok.convert_ids_to_tokens(x) for x in dd["train"]["input_ids"]]
    expect = [["[CLS]", *lines[k].split(), "[SEP]", *lines[k + 1].split(), "[SEP]"] for k in range(0, n - 1, 2)]
    expect.append(["[CLS]", *lines[-1].split(), "[SEP]"])
    assert got == expect
    assert dd["train"][0]["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]
    assert [tok.convert_ids_to_tokens(x) for x in dd["eval"]["input_ids"]] == [
        ["[CLS]", "alpha", "beta", "[SEP]", "gamma", "[SEP]"], ["[CLS]", "delta", "[SEP]"]]


def test_prepare_classify_encodes_both_sentences_truncates_longest_first_and_records_meta(greek_tok, tmp_path):
    """[CLS] a [SEP] b [SEP] with token types 0/1; a pair over max_length loses tokens from the longer
    sentence (both long: both keep about half); labels are the index in labels; meta counts by raw value."""
    import datasets

    long_a, long_b = " ".join(GREEK + GREEK[:8]), " ".join(GREEK[::-1] + GREEK[:8])  # 20 words each
    rows = [("alpha beta", "gamma delta epsilon", "pos"), (long_a, long_b, "neg"), (long_a, "mu eta", "pos")]
    f = tmp_path / "t.csv"
    f.write_text("s1,s2,y\n" + "".join(f"{a},{b},{y}\n" for a, b, y in rows), encoding="utf-8")
    spec = {"kind": "csv", "train": str(f), "eval": str(f), "columns": {"text_a": "s1", "text_b": "s2", "label": "y"},
            "labels": ["pos", "neg"]}
    meta = prepare(spec, greek_tok, "classify", 16, tmp_path / "p")
    tok = load_tokenizer(greek_tok)
    train = datasets.load_from_disk(str(tmp_path / "p"))["train"]
    assert train["labels"] == [0, 1, 0]
    r0 = train[0]
    assert tok.convert_ids_to_tokens(r0["input_ids"]) == ["[CLS]", "alpha", "beta", "[SEP]", "gamma", "delta",
                                                          "epsilon", "[SEP]"]
    assert r0["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1, 1] and r0["attention_mask"] == [1] * 8
    both = tok.convert_ids_to_tokens(train[1]["input_ids"])
    assert len(both) == 16 and both.count("[SEP]") == 2
    cut_a, cut_b = both[1:both.index("[SEP]")], both[both.index("[SEP]") + 1:-1]
    assert cut_a == long_a.split()[:len(cut_a)] and cut_b == long_b.split()[:len(cut_b)]
    assert {len(cut_a), len(cut_b)} == {6, 7}  # 13 tokens shared, not one sentence cut to nothing
    short_b = tok.convert_ids_to_tokens(train[2]["input_ids"])
    assert short_b == ["[CLS]", *long_a.split()[:11], "[SEP]", "mu", "eta", "[SEP]"]  # the short sentence whole
    assert meta["train_label_counts"] == {"pos": 2, "neg": 1} == meta["eval_label_counts"]
    assert meta["majority_accuracy"] == pytest.approx(2 / 3)
    assert (meta["truncated_train"], meta["train_tokens"]) == (2, 40)
    assert meta["mean_train_length"] == pytest.approx(40 / 3)


@pytest.mark.parametrize("bad, msg", [(7, r"must be an integer >= 8, got 7"), (16.0, r"must be an integer >= 8, got 16\.0"),
                                      (65, r"65 exceeds the tokenizer's model_max_length 64 .*<= 64$")])
def test_prepare_max_length_bounds(greek_tok, tmp_path, bad, msg):
    """--max-length may equal the tokenizer's model_max_length (64 here); 65, under 8 or not an integer is refused."""
    f = tmp_path / "c.txt"
    f.write_text("alpha beta\ngamma delta\n" * 4, encoding="utf-8")
    spec = {"kind": "text", "train": [str(f)], "eval": [str(f)], "mlm_examples": "lines"}
    assert prepare(spec, greek_tok, "mlm", 64, tmp_path / "p")["max_length"] == 64
    with pytest.raises(PrecswitchError, match=msg):
        prepare(spec, greek_tok, "mlm", bad, tmp_path / "q")
    assert not (tmp_path / "q").exists()


def test_prepare_classify_meta_counts_each_split_and_hashes_its_own_files(synth, tmp_path):
    """train/eval label counts come from their own split; num_labels and label_values from `labels` (in its
    order; a class absent from eval still counts); classify's source_hash covers train/dev.tsv, not the corpus."""
    import shutil

    from precswitch.data.loading import source_hash

    root, spec, tokdir = synth
    d = tmp_path / "syn"
    shutil.copytree(spec["dir"], d)
    tr = (d / "train.tsv").read_text().splitlines()
    (d / "train.tsv").write_text("\n".join(tr[:1] + [r for r in tr[1:] if r.startswith("1")][:7] +
                                           [r for r in tr[1:] if r.startswith("0")][:3]) + "\n")
    dev = (d / "dev.tsv").read_text().splitlines()
    (d / "dev.tsv").write_text("\n".join(dev[:1] + [r for r in dev[1:] if r.startswith("1")][:5]) + "\n")
    sp = {"kind": "synthetic", "dir": str(d), "labels": [1, 0]}
    meta = prepare(sp, tokdir, "classify", 64, tmp_path / "p")
    assert (meta["num_labels"], meta["label_values"]) == (2, [1, 0])  # the eval split has one class only
    assert meta["train_label_counts"] == {"1": 7, "0": 3} and meta["eval_label_counts"] == {"1": 5}
    assert (meta["n_train"], meta["n_eval"], meta["majority_accuracy"], meta["mlm_examples"]) == (10, 5, 1.0, None)
    assert meta["source_hash"] == source_hash(sp, "classify") != source_hash(sp, "mlm")
    with open(d / "corpus.txt", "a") as fh:
        fh.write("the end .\n")
    assert source_hash(sp, "classify") == meta["source_hash"] != source_hash(sp, "mlm")
    with open(d / "dev.tsv", "a") as fh:
        fh.write("1\t9\t10\tthe end .\tthe end .\n")
    assert source_hash(sp, "classify") != meta["source_hash"]


def test_prepare_lines_truncates_a_long_line_to_max_length(greek_tok, tmp_path):
    import datasets

    f = tmp_path / "c.txt"
    f.write_text(" ".join(GREEK + GREEK) + "\nalpha beta\n", encoding="utf-8")  # 24 words, then 2
    prepare({"kind": "text", "train": [str(f)], "eval": [str(f)], "mlm_examples": "lines"}, greek_tok, "mlm", 10,
            tmp_path / "p")
    tok = load_tokenizer(greek_tok)
    got = [tok.convert_ids_to_tokens(x) for x in datasets.load_from_disk(str(tmp_path / "p"))["train"]["input_ids"]]
    assert got == [["[CLS]", *GREEK[:8], "[SEP]"], ["[CLS]", "alpha", "beta", "[SEP]"]]


def test_prepare_line_pairs_truncate_the_longer_line_first(greek_tok, tmp_path):
    """pairs: a unit over max_length loses tokens from the longer line (longest first), both lines kept."""
    import datasets

    f = tmp_path / "c.txt"
    f.write_text(" ".join(GREEK[:8]) + "\n" + " ".join(GREEK + GREEK) + "\n", encoding="utf-8")  # 8 and 24 words
    prepare({"kind": "text", "train": [str(f)], "eval": [str(f)], "mlm_examples": "pairs"}, greek_tok, "mlm", 12,
            tmp_path / "p")
    tok = load_tokenizer(greek_tok)
    (x,) = datasets.load_from_disk(str(tmp_path / "p"))["train"]["input_ids"]
    t = tok.convert_ids_to_tokens(x)
    assert len(t) == 12 and t[0] == "[CLS]" and t[-1] == "[SEP]" and t.count("[SEP]") == 2
    a, b = t[1:t.index("[SEP]")], t[t.index("[SEP]") + 1:-1]
    assert a == GREEK[:len(a)] and b == GREEK[:len(b)] and {len(a), len(b)} == {4, 5}  # 9 tokens shared


def test_prepare_line_pairs_truncate_an_odd_last_line_and_meta_counts_the_train_tokens(greek_tok, tmp_path):
    """pairs: the odd last line, an example of its own, is truncated to max_length like every pair; meta.json's
    train_tokens and mean_train_length describe the train split (here 9 + 10 tokens), not eval (6 tokens)."""
    import datasets

    f, ev = tmp_path / "c.txt", tmp_path / "e.txt"
    f.write_text("alpha beta gamma\ndelta epsilon zeta\n" + " ".join(GREEK + GREEK) + "\n", encoding="utf-8")
    ev.write_text("alpha beta\ngamma\n", encoding="utf-8")
    meta = prepare({"kind": "text", "train": [str(f)], "eval": [str(ev)], "mlm_examples": "pairs"}, greek_tok, "mlm",
                   10, tmp_path / "p")
    tok = load_tokenizer(greek_tok)
    got = [tok.convert_ids_to_tokens(x) for x in datasets.load_from_disk(str(tmp_path / "p"))["train"]["input_ids"]]
    assert got == [["[CLS]", "alpha", "beta", "gamma", "[SEP]", "delta", "epsilon", "zeta", "[SEP]"],
                   ["[CLS]", *GREEK[:8], "[SEP]"]]
    assert (meta["n_train"], meta["train_tokens"], meta["mean_train_length"]) == (2, 19, 9.5)


def test_a_long_word_is_a_token_or_pieces_not_unk(tmp_path):
    """BERT's 100-character limit per word: a 30-letter word seen twice is one token, an unseen 60-letter word
    of known letters is split into pieces, neither is [UNK]."""
    long = "abcdefghij" * 3
    tok = load_tokenizer(build_tokenizer([f"{long} {long} abc"], tmp_path / "t", vocab_size=200))
    assert tok.tokenize(long) == [long]
    unseen = tok.tokenize("jihgfedcba" * 6)
    assert "[UNK]" not in unseen and "".join(t.removeprefix("##") for t in unseen) == "jihgfedcba" * 6


def test_load_tokenizer_names_a_path_that_is_not_a_directory(tmp_path):
    f = tmp_path / "tok.json"
    f.write_text("{}", encoding="utf-8")
    with pytest.raises(PrecswitchError, match=r"^--tokenizer: directory not found: .*tok\.json \(write it with"):
        load_tokenizer(f)


# WordPiece budget: past the characters (each as c and ##c), 80% of the room goes to whole words seen twice or
# more (one-character words take no slot), the rest to pieces of the words left out, ranked by the occurrences
# of those words (ties by string); a piece equal to a whole word is not counted twice
BUDGET_CASES = [
    ({"abc": 10, "bca": 9, "cab": 8, "aabb": 7, "bbcc": 6, "ccaa": 5, "abab": 4, "bcbc": 3, "caca": 2}, 5,
     {"abc bca cab aabb": ["abc", "bca", "cab", "aabb"]}, ["bbcc", "ccaa", "abab", "bcbc", "caca"]),
    ({"qqqqqx": 50, "qqqqqy": 50, "qqqqqz": 50, "abcde": 2, "abcdf": 2, "abcdg": 2}, 5,
     {"abcdf qqqqqx": ["ab", "##c", "##d", "##f", "qqqqqx"]}, []),
    ({"ab": 10, "abcd": 1, "abce": 1, "abcf": 1}, 2, {"ab abcd": ["ab", "abc", "##d"]}, []),
    ({"abcd": 3, "bcda": 1, "cdab": 1, "dabc": 1}, 3, {"abcd": ["abcd"]}, ["bcda", "cdab", "dabc"]),
    ({"qqqqqa": 50, "qqqqqb": 50, "qqqqqc": 50, "qqqqqd": 50, "abcde": 10, "fghij": 3, "fghik": 3, "fghil": 3}, 5,
     {"qqqqqa abcde fghij": ["qqqqqa", "a", "##bcde", "f", "##g", "##h", "##i", "##j"]}, []),
    ({".": 100, "x": 50, "ab": 3, "cd": 3, "ef": 3, "gh": 3, "ij": 3}, 5,
     {"ab cd ef gh ij . x": ["ab", "cd", "ef", "gh", "ij", ".", "x"]}, []),
]


@pytest.mark.parametrize("counts, room, expect, split", BUDGET_CASES)
def test_wordpiece_budget_fills_vocab_size_with_frequent_words_then_the_best_pieces(tmp_path, counts, room, expect,
                                                                                    split):
    texts = [w for w, c in counts.items() for _ in range(c)]
    base = len(SPECIAL_TOKENS) + 2 * len(set("".join(counts)))
    tok = load_tokenizer(build_tokenizer(texts, tmp_path / "t", vocab_size=base + room))
    assert len(tok) == base + room
    for text, tokens in expect.items():
        assert tok.tokenize(text) == tokens
    for w in split:
        assert tok.tokenize(w) != [w], w


def test_tokenizer_sizes_are_bounded_and_recorded(tmp_path):
    """Fewer tokens than vocab_size asked are recorded; model_max_length: 8 is the smallest, 7 refused, nothing
    written. (Too small a vocab_size: test_a_vocab_too_small_for_the_texts_characters_is_refused.)"""
    out = build_tokenizer(["kappa lambda mu"] * 2, tmp_path / "t", vocab_size=500, model_max_length=8)
    info = json.loads((out / "precswitch_tokenizer.json").read_text())
    assert info["vocab_size_requested"] == 500 and info["vocab_size"] == len(load_tokenizer(out)) < 500
    assert (info["lowercase"], info["model_max_length"], load_tokenizer(out).model_max_length) == (True, 8, 8)
    with pytest.raises(PrecswitchError, match="--model-max-length must be >= 8, got 7"):
        build_tokenizer(["a b"], tmp_path / "small", vocab_size=100, model_max_length=7)
    assert not (tmp_path / "small").exists()


def test_cased_tokenizer_keeps_case_and_accents(tmp_path):
    cased = load_tokenizer(build_tokenizer(["The Cat saw the cat Café"] * 2, tmp_path / "c", vocab_size=100,
                                           lowercase=False))
    assert cased.tokenize("The Cat saw the cat Café") == ["The", "Cat", "saw", "the", "cat", "Café"]


@pytest.mark.parametrize("saved", [0, None, "absent"])
def test_copy_pretrained_bounds_model_max_length(synth, tmp_path, saved):
    """A tokenizer saved with model_max_length 0, null or none at all (transformers' 1e30) is copied with 512,
    so that prepare's --max-length check has a bound; an explicit value under 8 is refused as for a trained
    tokenizer (0 read as "no bound", -1 refused every length), before anything is written; 8 is kept."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(synth[2], src)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    if saved == "absent":
        cfg.pop("model_max_length")
    else:
        cfg["model_max_length"] = saved
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    copied = load_tokenizer(copy_pretrained(str(src), tmp_path / "copy"))
    assert copied.model_max_length == 512 and copied.get_vocab() == load_tokenizer(synth[2]).get_vocab()
    assert load_tokenizer(copy_pretrained(str(src), tmp_path / "c8", model_max_length=8)).model_max_length == 8
    for size in (0, -1, 7):
        with pytest.raises(PrecswitchError, match=rf"^--model-max-length must be >= 8, got {size}$"):
            copy_pretrained(str(src), tmp_path / "bad", model_max_length=size)
    assert not (tmp_path / "bad").exists()


def test_prepare_pack_cuts_each_group_of_lines_and_keeps_a_short_block_only_when_a_split_has_none(greek_tok,
                                                                                                   tmp_path, monkeypatch):
    """docs/data.md: packing (the default for text) runs per group of PACK_GROUP lines and drops each group's
    short tail and a short last group (blocks never span two groups); a split with no block at all keeps its one
    short block."""
    import datasets

    from precswitch.data import prepare as P

    monkeypatch.setattr(P, "PACK_GROUP", 2)
    f, ev = tmp_path / "c.txt", tmp_path / "e.txt"
    f.write_text("alpha beta gamma delta\nepsilon zeta eta\ntheta iota kappa lambda\nmu alpha beta\ngamma delta\n",
                 encoding="utf-8")
    ev.write_text("alpha beta\ngamma\n", encoding="utf-8")
    meta = prepare({"kind": "text", "train": [str(f)], "eval": [str(ev)]}, greek_tok, "mlm", 8, tmp_path / "p")
    assert meta["mlm_examples"] == "pack"
    tok = load_tokenizer(greek_tok)
    dd = datasets.load_from_disk(str(tmp_path / "p"))
    got = {split: [tok.convert_ids_to_tokens(x)[1:-1] for x in dd[split]["input_ids"]] for split in dd}
    assert got == {"train": [["alpha", "beta", "gamma", "delta", "epsilon", "zeta"],
                             ["theta", "iota", "kappa", "lambda", "mu", "alpha"]],
                   "eval": [["alpha", "beta", "gamma"]]}


def test_prepare_single_sentence_classify_and_truncated_counts(greek_tok, tmp_path):
    """One text column: [CLS] a [SEP], token type 0. truncated_train counts only rows that lost tokens: a pair
    exactly max_length long (6 + 7 words + 3 special = 16) is not truncated."""
    import datasets

    f = tmp_path / "t.csv"
    f.write_text("s,y\nalpha beta,1\ngamma,0\ndelta epsilon zeta,1\n", encoding="utf-8")
    spec = {"kind": "csv", "train": str(f), "eval": str(f), "columns": {"text_a": "s", "text_b": None, "label": "y"}}
    prepare(spec, greek_tok, "classify", 16, tmp_path / "p")
    tok = load_tokenizer(greek_tok)
    rows = datasets.load_from_disk(str(tmp_path / "p"))["train"]
    assert tok.convert_ids_to_tokens(rows[0]["input_ids"]) == ["[CLS]", "alpha", "beta", "[SEP]"]
    assert rows["token_type_ids"][2] == [0] * 5 and rows["labels"] == [1, 0, 1]
    pairs = [(" ".join(GREEK[:6]), " ".join(GREEK[:7]), "0"), (" ".join(GREEK[:6]), " ".join(GREEK[:8]), "1"),
             ("alpha", "beta", "1")]
    f.write_text("s1,s2,y\n" + "".join(f"{a},{b},{y}\n" for a, b, y in pairs), encoding="utf-8")
    meta = prepare({**spec, "columns": {"text_a": "s1", "text_b": "s2", "label": "y"}}, greek_tok, "classify", 16,
                   tmp_path / "q")
    assert (meta["truncated_train"], meta["train_tokens"]) == (1, 16 + 16 + 5)
