"""`precswitch synth | tokenizer | prepare` through the dispatcher (precswitch.cli.main)."""

from __future__ import annotations

import json

import pytest

from precswitch.cli import main


def test_synth_tokenizer_prepare_roundtrip(tmp_path, capsys):
    syn = tmp_path / "synth"
    assert main(["synth", "--out", str(syn), "--seed", "2", "--n-corpus", "800", "--n-train", "80",
                 "--n-dev", "30", "--n-test", "20"]) == 0
    assert {p.name for p in syn.iterdir()} == {"corpus.txt", "train.tsv", "dev.tsv", "test.tsv", "synth.json"}
    spec = {"kind": "synthetic", "dir": str(syn), "labels": None, "max_train_rows": None}
    src_file = tmp_path / "source.json"
    src_file.write_text(json.dumps(spec))
    src_yaml = tmp_path / "source.yaml"
    src_yaml.write_text(f"kind: synthetic\ndir: {syn}\nmax_train_rows: 50\n")
    assert main(["tokenizer", "--source", f"@{src_file}", "--out", str(tmp_path / "tok"), "--vocab-size", "2000",
                 "--model-max-length", "128"]) == 0
    assert main(["prepare", "--source", json.dumps(spec), "--tokenizer", str(tmp_path / "tok"),
                 "--objective", "classify", "--max-length", "64", "--out", str(tmp_path / "cls")]) == 0
    assert main(["prepare", "--source", str(src_yaml), "--tokenizer", str(tmp_path / "tok"),
                 "--objective", "classify", "--max-length", "64", "--out", str(tmp_path / "cls50")]) == 0
    assert main(["prepare", "--source", json.dumps(spec), "--tokenizer", str(tmp_path / "tok"),
                 "--objective", "mlm", "--max-length", "64", "--out", str(tmp_path / "mlm")]) == 0
    meta = json.loads((tmp_path / "cls" / "meta.json").read_text())
    assert (meta["n_train"], meta["n_test"], meta["num_labels"]) == (80, 20, 2)
    assert json.loads((tmp_path / "cls50" / "meta.json").read_text())["n_train"] == 50
    assert json.loads((tmp_path / "mlm" / "meta.json").read_text())["objective"] == "mlm"
    assert main(["tokenizer", "--pretrained", str(tmp_path / "tok"), "--out", str(tmp_path / "tok2")]) == 0
    assert (tmp_path / "tok2" / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["prepare", "--source", '{"kind": "xml"}', "--objective", "mlm"], "unknown kind 'xml' (allowed: synthetic"),
        (["prepare", "--source", '{"kind": "csv", "train": "@MISSING@/a.csv", "eval": "@MISSING@/b.csv", '
          '"columns": {"text_a": "a", "label": "b"}}', "--objective", "classify"], "csv file not found"),
        (["prepare", "--source", "{not json", "--objective", "mlm"], "--source: not valid JSON"),
        (["prepare", "--source", "@nowhere.json", "--objective", "mlm"], "neither a JSON object nor an existing file"),
        (["tokenizer", "--out", "@OUT@"], "--source is required unless --pretrained"),
        (["tokenizer", "--out", "@OUT@", "--revision", "v1"], "--revision goes with --pretrained"),
        (["synth", "--out", "@OUT@", "--seed", "1", "--n-train", "0"], "n_train must be >= 1"),
        (["synth", "--out", "@OUT@", "--seed", "1", "--language", '{"colours": 3}'], "--language: unknown key"),
        (["synth", "--out", "@OUT@", "--seed", "1", "--language", "[1, 2]"], "--language: unknown key(s) ['<not an object>']"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    argv = [a.replace("@MISSING@", str(tmp_path / "missing")).replace("@OUT@", str(out)) for a in argv]
    if argv[0] == "prepare":
        argv += ["--tokenizer", str(tmp_path / "tok"), "--max-length", "64", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("precswitch: error: ") and message in err[0], err
    assert not out.exists()


def test_help_lists_data_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for cmd in ("synth", "tokenizer", "prepare"):
        assert cmd in text


def test_python_dash_m_precswitch_is_the_cli():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "precswitch", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("precswitch "), (r.stdout, r.stderr)




def test_tokenizer_and_prepare_options_reach_the_functions(tmp_path, monkeypatch):
    """--vocab-size, --model-max-length, --cased (and their defaults) and prepare's arguments are passed on
    in their places (the functions themselves: test_data_tokenizer_prepare.py)."""
    from precswitch.data import loading, prepare, tokenizer

    calls = []
    monkeypatch.setattr(loading, "source_texts", lambda spec: ["a b", "c d"])
    monkeypatch.setattr(tokenizer, "build_tokenizer",
                        lambda texts, out, vocab, **kw: calls.append((vocab, kw["model_max_length"], kw["lowercase"]))
                        or out)
    src = '{"kind": "synthetic", "dir": "x"}'
    assert main(["tokenizer", "--source", src, "--out", str(tmp_path / "t1"), "--vocab-size", "150",
                 "--model-max-length", "48", "--cased"]) == 0
    assert main(["tokenizer", "--source", src, "--out", str(tmp_path / "t2")]) == 0
    assert calls == [(150, 48, False), (tokenizer.DEFAULT_VOCAB_SIZE, tokenizer.DEFAULT_MODEL_MAX_LENGTH, True)]
    monkeypatch.setattr(prepare, "prepare", lambda *a: calls.append(a) or {"max_length": a[3]})
    assert main(["prepare", "--source", src, "--tokenizer", "T", "--objective", "classify", "--max-length", "24",
                 "--out", "O"]) == 0
    assert calls[-1] == (src, "T", "classify", 24, "O")


@pytest.mark.parametrize("option, message", [("--vocab-size", "--vocab-size must be > 5, got 0"),
                                             ("--model-max-length", "--model-max-length must be >= 8, got 0")])
def test_tokenizer_zero_sizes_are_refused_not_replaced_by_the_defaults(tmp_path, capsys, option, message):
    """`--vocab-size 0` trained an 8000-token tokenizer and `--model-max-length 0` saved 512 (`x or default`)."""
    syn = tmp_path / "synth"
    assert main(["synth", "--out", str(syn), "--seed", "1", "--n-corpus", "40", "--n-train", "10", "--n-dev", "4",
                 "--n-test", "4"]) == 0
    capsys.readouterr()
    out = tmp_path / "tok"
    assert main(["tokenizer", "--source", json.dumps({"kind": "synthetic", "dir": str(syn)}), "--out", str(out),
                 option, "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("language, message", [
    ('{"n_adj_concepts": 1}', "n_adj_concepts must be >= 3, got 1"),
    ('{"p_synonym": "x"}', "p_synonym must be a number, got 'x'"),
    ('{"p_passive": 1.5}', "p_passive is a probability (0..1), got 1.5"),
    ('{"synonyms": 2.5}', "synonyms must be an integer, got 2.5"),
    ('{"heldout_synonyms": 3}', "heldout_synonyms (3) must be < synonyms (3)"),
    ('{"neg_swap_roles": 0, "neg_replace": 0}', "no kind of negative pair to draw"),
    ('{"n_verb_concepts": 1}', "n_verb_concepts must be >= 2, got 1"),
    ('{"synonyms": true}', "synonyms must be an integer, got True"),  # not taken as 1
    ('{"p_passive": true}', "p_passive must be a number, got True"),
    ('{"neg_replace": -0.5}', "neg_replace is a weight (>= 0), got -0.5"),
    ('{"neg_swap_roles": NaN}', "neg_swap_roles must be a number, got nan"),
    ('{"neg_replace": Infinity}', "neg_replace must be a number, got inf"),
    ('{"p_passive": 0.5', "not valid JSON (Expecting ',' delimiter)"),  # a traceback without the JSON check
    ("n_places=5", "not valid JSON (Expecting value)"),
])
def test_synth_bad_language_values_exit_2_with_one_line(tmp_path, capsys, language, message):
    """Values --language accepted by key used to end in a traceback (exit 1) or be changed silently."""
    out = tmp_path / "s"
    assert main(["synth", "--out", str(out), "--seed", "1", "--n-corpus", "20", "--n-train", "10", "--n-dev", "4",
                 "--language", language]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("precswitch: error: --language: ") and message in err[0], err
    assert not out.exists()
    # the smallest allowed language still draws
    small = '{"n_animate": 2, "n_things": 2, "n_adj_concepts": 3, "n_verb_concepts": 2, "synonyms": 1, ' \
            '"heldout_synonyms": 0, "n_places": 1, "n_foods": 1, "n_materials": 1, "adj_prefs": 3, "neg_replace": 1}'
    assert main(["synth", "--out", str(out), "--seed", "1", "--n-corpus", "50", "--n-train", "40", "--n-dev", "20",
                 "--language", small]) == 0


def test_tokenizer_pretrained_options_reach_copy_pretrained(tmp_path, monkeypatch):
    from precswitch.data import tokenizer

    calls = []
    monkeypatch.setattr(tokenizer, "copy_pretrained", lambda name, out, **kw: calls.append((name, kw)) or out)
    assert main(["tokenizer", "--pretrained", "acme/bert", "--out", str(tmp_path / "t"), "--model-max-length", "48",
                 "--revision", "v2"]) == 0
    assert main(["tokenizer", "--pretrained", "acme/bert", "--out", str(tmp_path / "t2")]) == 0
    assert calls == [("acme/bert", {"model_max_length": 48, "revision": "v2"}),
                     ("acme/bert", {"model_max_length": None, "revision": None})]


def test_data_commands_print_one_json_line_of_what_they_wrote(tmp_path, capsys):
    """stdout is one JSON object a command: synth its seed and sizes (defaults filled in; --language applied),
    tokenizer the number of texts, prepare the objective, split sizes, max_length and majority accuracies."""
    syn = tmp_path / "synth"
    assert main(["synth", "--out", str(syn), "--seed", "4", "--n-corpus", "30", "--n-train", "12", "--n-test", "10",
                 "--language", '{"n_places": 5, "p_passive": 0.0}']) == 0
    assert json.loads(capsys.readouterr().out) == {"out": str(syn), "seed": 4, "n_corpus": 30, "n_train": 12,
                                                   "n_dev": 2000, "n_test": 10}
    meta = json.loads((syn / "synth.json").read_text())
    assert (meta["language"]["n_places"], meta["language"]["p_passive"]) == (5, 0.0)
    spec = json.dumps({"kind": "synthetic", "dir": str(syn)})
    assert main(["tokenizer", "--source", spec, "--out", str(tmp_path / "tok"), "--vocab-size", "400"]) == 0
    from precswitch.data.loading import parse_source, source_texts

    texts = len(source_texts(parse_source(spec)))  # the corpus' training lines and the train pairs' sentences
    assert texts > 24 and json.loads(capsys.readouterr().out) == {"out": str(tmp_path / "tok"), "texts": texts}
    assert main(["prepare", "--source", spec, "--tokenizer", str(tmp_path / "tok"), "--objective", "classify",
                 "--max-length", "32", "--out", str(tmp_path / "p")]) == 0
    assert json.loads(capsys.readouterr().out) == {"objective": "classify", "n_train": 12, "n_eval": 2000,
                                                   "n_test": 10, "max_length": 32, "majority_accuracy": 0.5,
                                                   "test_majority_accuracy": 0.5}
