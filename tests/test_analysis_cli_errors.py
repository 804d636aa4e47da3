"""Error paths of the analysis sub-commands: one line naming the file or option, exit 2, nothing written."""

from precswitch.analysis.aggregate import aggregate
from precswitch.analysis.fakes import write_stage
from precswitch.cli import main

ACC = {"accuracy": 0.8, "f1": 0.8, "mcc": 0.5, "majority_accuracy": 0.5}


def _tables(tmp_path):
    paths = [write_stage(tmp_path / "s" / name, run_id=f"fin-{name}", stage="finetune", precision="fp32", seed=1,
                         schedule=name, metrics=ACC) for name in ("fp32-fp32", "other")]
    aggregate(paths, tmp_path / "t")
    return tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv"


def _err(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_stats_and_verdict_name_a_missing_or_unreadable_input(tmp_path, capsys):
    rc = main(["stats", "--runs", str(tmp_path / "runs.csv"), "--schedules", str(tmp_path / "schedules.csv"),
               "--out-dir", str(tmp_path / "o")])
    assert rc == 2 and f"input table not found: {tmp_path / 'runs.csv'}" in _err(capsys)
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    rc = main(["verdict", "--stats", str(tmp_path / "stats.json"), "--out", str(tmp_path / "v.md")])
    assert rc == 2 and f"stats file not found: {tmp_path / 'stats.json'} (run `precswitch stats` first)" in _err(capsys)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    rc = main(["verdict", "--stats", str(bad), "--out", str(tmp_path / "v.md")])
    assert rc == 2 and f"stats file {bad} is not valid JSON" in _err(capsys)
    assert not (tmp_path / "v.md").exists()


def _stats_with_settings(tmp_path, capsys, runs, sched, text):
    """`precswitch stats` with a settings file of `text`: (exit status, stderr, the --out-dir it was given)."""
    cfg = tmp_path / "a.yaml"
    cfg.write_text(text)
    out = tmp_path / "o"
    rc = main(["stats", "--runs", str(runs), "--schedules", str(sched), "--settings", str(cfg), "--out-dir", str(out)])
    return rc, _err(capsys), out


def test_stats_settings_of_the_wrong_type_name_their_key(tmp_path, capsys):
    """A numeric analysis setting that is not one names its key and value: 'margin: abc' said only 'a numeric
    setting is not a number (could not convert string to float: 'abc')', 'bootstrap_resamples: .inf' ended in a
    traceback (OverflowError) and 'bootstrap_resamples: 1.5' silently ran 1 resample."""
    runs, sched = _tables(tmp_path)
    for text, want in (("margin: abc\n", "analysis setting 'margin' must be a number, got 'abc'"),
                       ("bootstrap_resamples: .inf\n", "analysis setting 'bootstrap_resamples' must be a whole number, got inf"),
                       ("bootstrap_resamples: 1.5\n", "analysis setting 'bootstrap_resamples' must be a whole number, got 1.5"),
                       ("seed: x\n", "analysis setting 'seed' must be a whole number, got 'x'"),
                       ("power: [0.8]\n", "analysis setting 'power' must be a number, got [0.8]"),
                       ("alpha: true\n", "analysis setting 'alpha' must be a number, got True"),
                       ("contrasts: A vs B\n", "analysis setting 'contrasts' must be a list of [A, B] pairs")):
        rc, err, out = _stats_with_settings(tmp_path, capsys, runs, sched, text)
        assert rc == 2 and want in err and err.count("\n") == 1 and not out.exists(), (text, err)
    cfg = tmp_path / "a.yaml"
    cfg.write_text("bootstrap_resamples: 200.0\nseed: 3\nmargin: 2\n")  # whole numbers written as floats are fine
    from precswitch.analysis.settings import load_settings

    s = load_settings(cfg)
    assert (s["bootstrap_resamples"], s["seed"], s["margin"]) == (200, 3, 2.0) and type(s["bootstrap_resamples"]) is int


# ------------------------------------------------------------------ mutation audit 7 (analysis cli/fakes/sweeps)
def _stats_json(tmp_path, runs, sched):
    assert main(["stats", "--runs", str(runs), "--schedules", str(sched), "--bootstrap-resamples", "0",
                 "--out-dir", str(tmp_path / "st")]) == 0
    return tmp_path / "st" / "stats.json"


def test_a_wrong_table_or_stats_file_is_named_not_analysed(tmp_path, capsys):
    """--runs and --schedules swapped, a schedules table given as both, any other CSV or a binary file gave
    stats (exit 0) without the stage-1 analysis, or a traceback; a stats.json that is a JSON list ended plots and
    verdict in a traceback (exit 1), `{}` gave an empty verdict and plots (exit 0), and plots met invalid JSON
    with a traceback. Each is now one line naming the option or file, exit 2, nothing written."""
    runs, sched = _tables(tmp_path)
    stats = _stats_json(tmp_path, runs, sched)
    capsys.readouterr()
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 50)
    out = tmp_path / "o"
    for r, s, want in ((sched, runs, f"--runs {sched}: not a runs table (runs.csv|parquet) of precswitch aggregate: "
                                     "it has no column(s) run_id, stage"),
                       (runs, runs, f"--schedules {runs}: not a schedules table (schedules.csv|parquet) of precswitch "
                                    "aggregate: it has no column(s) stage2_precision"),
                       (runs, runs.with_suffix(".parquet"), f"--schedules {runs.with_suffix('.parquet')}: not a "
                                                            "schedules table (schedules.csv|parquet) of precswitch "
                                                            "aggregate: it has no column(s) stage2_precision"),
                       (other, sched, f"--runs {other}: not a runs table (runs.csv|parquet) of precswitch aggregate: "
                                      "it has no column(s) run_id, stage, seed"),
                       (binary, sched, f"--runs {binary}: not a table (CSV or parquet) that precswitch aggregate "
                                       "wrote: UnicodeDecodeError")):
        for argv in (["stats", "--runs", str(r), "--schedules", str(s), "--out-dir", str(out)],
                     ["plots", "--runs", str(r), "--schedules", str(s), "--stats", str(stats), "--out-dir", str(out)]):
            rc, err = main(argv), _err(capsys)
            assert rc == 2 and err.startswith(f"precswitch: error: {want}") and err.count("\n") == 1, (argv, err)
            assert not out.exists()
    for text, want in (("[1]", "(got a JSON list)"), ("{}", "(it has no key(s) settings, baseline, schedules, deltas)"),
                       ("{", "is not valid JSON")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        for argv in (["plots", "--runs", str(runs), "--schedules", str(sched), "--stats", str(bad), "--out-dir", str(out)],
                     ["verdict", "--stats", str(bad), "--out", str(out / "verdict.md")]):
            rc, err = main(argv), _err(capsys)
            assert rc == 2 and err.startswith(f"precswitch: error: stats file {bad} ") and want in err, (argv, err)
            assert err.count("\n") == 1 and not out.exists()


def test_an_output_path_that_cannot_be_written_is_named_before_anything_is(tmp_path, capsys):
    """An output directory that is a file, an output file that is a directory, or a file where a folder above an
    output should be, ended in a traceback (exit 1) once the work was done: aggregate's after it had written
    runs.csv and runs.parquet. Each is now one line naming the option and path, exit 2, nothing written; what the
    commands print goes to stderr (stdout stays empty)."""
    runs, sched = _tables(tmp_path)
    stats = _stats_json(tmp_path, runs, sched)
    metrics = [str(p) for p in (tmp_path / "s").glob("*/metrics.json")]
    capsys.readouterr()
    afile = tmp_path / "afile"
    afile.write_text("")
    d = tmp_path / "d"
    (d / "schedules.parquet").mkdir(parents=True)
    (d / "verdict.md").mkdir()
    T = ["--runs", str(runs), "--schedules", str(sched)]
    cases = [
        (["aggregate", "--metrics", *metrics, "--out-dir", str(afile)], f"--out-dir {afile}: is a file, not a directory"),
        (["aggregate", "--metrics", *metrics, "--out-dir", str(afile / "x")],
         f"--out-dir {afile / 'x'}: {afile} is a file, not a directory"),
        (["aggregate", "--metrics", *metrics, "--out-dir", str(d)],
         f"--out-dir {d / 'schedules.parquet'}: is a directory, not a file"),
        (["stats", *T, "--out-dir", str(afile)], f"--out-dir {afile}: is a file, not a directory"),
        (["stats", *T, "--summary-csv", str(tmp_path / "s.csv"), "--summary-md", str(d / "verdict.md"),
          "--deltas-csv", str(tmp_path / "d.csv"), "--stats-json", str(tmp_path / "s.json")],
         f"--summary-md {d / 'verdict.md'}: is a directory, not a file"),
        (["plots", *T, "--stats", str(stats), "--out-dir", str(afile)], f"--out-dir {afile}: is a file, not a directory"),
        (["plots", *T, "--stats", str(stats), "--out", str(afile / "accuracy.png")],
         f"--out {afile / 'accuracy.png'}: {afile} is a file, not a directory"),
        (["verdict", "--stats", str(stats), "--out", str(d / "verdict.md")],
         f"--out {d / 'verdict.md'}: is a directory, not a file"),
    ]
    for argv, want in cases:
        rc = main(argv)
        got = capsys.readouterr()
        assert rc == 2 and got.err == f"precswitch: error: {want}\n" and got.out == "", (argv, got)
    assert sorted(p.name for p in d.iterdir()) == ["schedules.parquet", "verdict.md"]
    assert not (tmp_path / "s.csv").exists() and afile.read_text() == ""
    assert main(["verdict", "--stats", str(stats), "--out", str(d / "v.md")]) == 0
    got = capsys.readouterr()
    assert got.out == "" and got.err == f"precswitch verdict: wrote {d / 'v.md'}\n"

