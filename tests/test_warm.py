"""Warm start (src/precswitch/warm.py): a server imports the libraries once and forks one child per
`precswitch` command. A warm run must be the same run as a cold one: same results bit for bit, the
client's exit status, signals forwarded, bad environments declined, no orphans when things die."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from engine_fixtures import make_prepared  # noqa: E402

from precswitch import warm  # noqa: E402
from precswitch.errors import EXIT_PREEMPTED  # noqa: E402

TINY = {"max_position_embeddings": 64, "hidden_size": 32, "intermediate_size": 64}


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != warm.SOCKET_ENV}
    env.update(extra)
    return env


def _start_server(sock: Path, parent_pid: int | None = None, idle: float = 0, wait: bool = True) -> subprocess.Popen:
    """Start a server on ``sock``; ``wait``: return once it listens (else at once, while it imports)."""
    cmd = [sys.executable, "-m", "precswitch.cli", "warm", "serve", "--socket", str(sock),
           "--idle-timeout", str(idle)]
    if parent_pid:
        cmd += ["--parent-pid", str(parent_pid)]
    p = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    if not wait:
        return p
    t = time.time()
    while not sock.exists():
        assert p.poll() is None, p.stdout.read()
        assert time.time() - t < 120, "server never listened"
        time.sleep(0.1)
    return p


def _precswitch(args: list[str], sock: Path | None, **kw) -> subprocess.Popen:
    env = _env(**({warm.SOCKET_ENV: str(sock)} if sock else {}))
    return subprocess.Popen([sys.executable, "-m", "precswitch.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("warm")
    sock = d / "s"
    p = _start_server(sock)
    yield sock
    p.terminate()
    assert p.wait(timeout=60) == 0
    assert not sock.exists()  # the server removes its socket


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_prepared(tmp_path_factory.mktemp("warmdata"), "classify", n_train=96)


def test_warm_run_is_the_cold_run(server, data, tmp_path):
    hp = json.dumps({"data": str(data), "objective": "classify", "precision": "amp_bf16", "steps": 12,
                     "seed": 3, "model": TINY, "threads": 1})
    outs = {}
    for kind, sock in (("cold", None), ("warm", server)):
        outs[kind] = tmp_path / kind
        p = _precswitch(["train", "--hparams", hp, "--out", str(outs[kind])], sock)
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "starting cold" not in err  # the warm one was not declined
    mc, mw = (json.loads((outs[k] / "metrics.json").read_text()) for k in ("cold", "warm"))
    assert (mc["process_start"], mw["process_start"]) == ("cold", "warm")
    for key in ("eval_loss", "accuracy", "f1", "final_train_loss", "grad_norm", "steps_completed"):
        assert mc[key] == mw[key], key
    steps = [[r.split(",")[:4] for r in (outs[k] / "steps.csv").read_text().splitlines()] for k in ("cold", "warm")]
    assert steps[0] == steps[1]  # every step's loss, lr and grad norm
    # the point of it: the child started with the libraries imported (the time saved is measured by
    # benchmarks/pipeline_overhead.py, not here)
    assert mw["hparams"] == mc["hparams"]


def test_exit_status_and_stderr_come_back(server, tmp_path):
    p = _precswitch(["train", "--hparams", json.dumps({"data": str(tmp_path / "nope"), "precision": "fp99"}),
                     "--out", str(tmp_path / "o")], server)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2
    assert "fp99" in err and "starting cold" not in err
    assert not (tmp_path / "o" / "metrics.json").exists()


def _long_run(tmp_path: Path, sock: Path, **hp) -> tuple[subprocess.Popen, Path]:
    """A warm `precswitch train` of 5000 tiny steps (to be interrupted) and its output dir."""
    data = make_prepared(tmp_path, "mlm", n_train=256)
    out = tmp_path / "run"
    hp = {"data": str(data), "precision": "fp32", "steps": 5000, "seed": 1, "model": TINY, "threads": 1, **hp}
    return _precswitch(["train", "--hparams", json.dumps(hp), "--out", str(out)], sock), out


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, EXIT_PREEMPTED), (signal.SIGINT, 130)])
def test_stop_signal_to_the_client_reaches_the_stage(server, tmp_path, sig, code):
    """SIGTERM and SIGINT (Ctrl-C) reach the forked stage, which saves its state (a warm child used to die of
    SIGINT at once, with nothing saved and exit 130)."""
    p, out = _long_run(tmp_path, server, checkpoint_every_steps=2)
    t = time.time()
    while not (out / "resume" / "state.pt").exists():
        assert p.poll() is None, p.communicate()
        assert time.time() - t < 120
        time.sleep(0.05)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert "preempted" in err and "state saved" in err
    assert (out / "resume" / "state.pt").is_file() and not (out / "metrics.json").exists()


def test_client_killed_hard_takes_its_child_along(server, tmp_path):
    p, _ = _long_run(tmp_path, server)
    t = time.time()
    while not (children := _children_of(_server_pid(server))):
        assert p.poll() is None, p.communicate()
        assert time.time() - t < 60, "no forked child seen"
        time.sleep(0.05)
    time.sleep(1.0)
    p.kill()
    p.wait()
    t = time.time()
    while any(warm.alive(c) for c in children):
        assert time.time() - t < 30, "the child outlived its killed client"
        time.sleep(0.1)


def test_import_time_environment_difference_is_declined(server, tmp_path):
    env = _env(**{warm.SOCKET_ENV: str(server), "HF_HUB_OFFLINE": "1"})
    r = subprocess.run([sys.executable, "-m", "precswitch.cli", "synth", "--out", str(tmp_path / "s"), "--seed", "1",
                        "--n-corpus", "50", "--n-train", "20", "--n-dev", "20"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "warm start declined (environment differs from the server's in HF_HUB_OFFLINE)" in r.stderr
    assert any((tmp_path / "s").iterdir())  # ran cold, correctly


def test_no_server_means_cold_start(tmp_path):
    r = subprocess.run([sys.executable, "-m", "precswitch.cli", "--version"],
                       env=_env(**{warm.SOCKET_ENV: str(tmp_path / "missing")}), capture_output=True, text=True)
    assert r.returncode == 0 and "precswitch" in r.stdout


def test_a_client_waits_for_a_server_that_is_still_starting(tmp_path):
    """Jobs Snakemake starts right after onstart race the server's imports: with the server's pid file
    written (as onstart does, right after starting it) they wait for it instead of starting cold."""
    sock = tmp_path / "s"
    server = _start_server(sock, wait=False)
    warm.write_pid(str(sock), server.pid)
    assert not sock.exists()  # still importing torch & co.
    r = subprocess.run([sys.executable, "-m", "precswitch.cli", "--version"], capture_output=True, text=True,
                       env=_env(**{warm.SOCKET_ENV: str(sock)}), timeout=300)
    server.terminate()
    out = server.communicate(timeout=60)[0]
    assert r.returncode == 0 and "precswitch" in r.stdout and "cold" not in r.stderr
    assert "served 1 commands" in out


def test_a_dead_server_pid_means_cold_start_at_once(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    sock = tmp_path / "s"
    warm.write_pid(str(sock), dead.pid)
    t = time.monotonic()
    assert not warm._wait_until_listening(str(sock))
    assert time.monotonic() - t < 1
    r = subprocess.run([sys.executable, "-m", "precswitch.cli", "--version"], capture_output=True, text=True,
                       env=_env(**{warm.SOCKET_ENV: str(sock)}), timeout=120)
    assert r.returncode == 0 and "precswitch" in r.stdout


def test_a_server_that_never_listens_is_given_up_on(tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        sock = tmp_path / "s"
        warm.write_pid(str(sock), sleeper.pid)
        t = time.monotonic()
        assert not warm._wait_until_listening(str(sock), timeout=0.5)
        assert 0.5 <= time.monotonic() - t < 5
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_large_environment_still_runs_warm(server, tmp_path):
    """A request over one sendmsg's worth (a big environment) used to arrive cut off: dropped, run cold."""
    r = subprocess.run([sys.executable, "-m", "precswitch.cli", "--version"], capture_output=True, text=True,
                       env=_env(**{warm.SOCKET_ENV: str(server)}, **{f"PRECSWITCH_TEST_BIG{i}": "x" * 100_000 for i in range(4)}),
                       timeout=120)
    assert r.returncode == 0 and "precswitch" in r.stdout and "cold" not in r.stderr, r.stderr


def test_a_bad_request_is_dropped_and_lets_go_of_the_clients_output(server, tmp_path):
    """A request that never completes (or is not JSON) is dropped; the server must not keep the client's
    stdout open (a caller reading it would wait forever) nor stop serving."""
    import socket as socketlib

    for payload in (warm._HEADER.pack(1000) + b"{", warm._HEADER.pack(3) + b"{x}"):
        r_fd, w_fd = os.pipe()
        s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        s.connect(str(server))
        socketlib.send_fds(s, [payload], [0, w_fd, w_fd])
        os.close(w_fd)
        # EOF: the server closed its copies (after its 10 s read timeout at most)
        readable, _, _ = select.select([r_fd], [], [], 60)
        assert readable and os.read(r_fd, 1) == b"", "the server still holds the client's stdout"
        os.close(r_fd)
        s.close()
    r = subprocess.run([sys.executable, "-m", "precswitch.cli", "--version"], capture_output=True, text=True,
                       env=_env(**{warm.SOCKET_ENV: str(server)}), timeout=60)
    assert r.returncode == 0 and "precswitch" in r.stdout and "cold" not in r.stderr


def test_the_server_removes_its_socket_dir(tmp_path):
    d = tmp_path / (warm.SOCKET_DIR_PREFIX + "x")
    d.mkdir()
    p = _start_server(d / "socket")
    p.terminate()
    assert p.wait(timeout=60) == 0
    assert not d.exists()


def test_server_stops_when_its_parent_is_gone(tmp_path):
    parent = subprocess.Popen(["sleep", "600"])
    sock = tmp_path / "s"
    p = _start_server(sock, parent_pid=parent.pid)
    parent.kill()
    parent.wait()
    assert p.wait(timeout=30) == 0
    assert "parent" in p.stdout.read() and not sock.exists()


def _server_pid(sock: Path) -> int:
    return int(Path(str(sock) + ".pid").read_text())


def _children_of(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


def test_server_killed_hard_fails_its_clients_and_children_and_frees_the_socket(tmp_path):
    sock = tmp_path / "s"
    server = _start_server(sock)
    p, out = _long_run(tmp_path, sock)
    t = time.time()
    # the child is running the command (it writes its output dir), so its client knows its pid
    while not ((children := _children_of(server.pid)) and out.exists()):
        assert p.poll() is None, p.communicate()
        assert time.time() - t < 60, "no forked child seen"
        time.sleep(0.05)
    server.kill()
    server.wait()
    _, err = p.communicate(timeout=30)
    assert p.returncode != 0 and "went away" in err
    t = time.time()
    while any(warm.alive(c) for c in children):
        assert time.time() - t < 30, "the child outlived its server"
        time.sleep(0.1)
    # the socket file is left behind, but no process holds the listener any more (the children closed
    # their copies): the connection is refused, instead of waiting in a backlog nobody accepts from
    r = subprocess.run([sys.executable, "-m", "precswitch.cli", "--version"], capture_output=True, text=True,
                       env=_env(**{warm.SOCKET_ENV: str(sock)}), timeout=60)
    assert r.returncode == 0 and "starting cold" in r.stderr and "Connection refused" in r.stderr


def test_a_child_whose_client_never_learned_its_pid_does_not_run(server, tmp_path):
    """A client that gets no answer starts cold; the server's child for that request must then not run
    the command too (it waits for the server to have told the client its pid)."""
    import socket as socketlib

    out = tmp_path / "out.txt"
    pid = _server_pid(server)
    os.kill(pid, signal.SIGSTOP)  # the request waits in the listener's backlog until the client is gone
    try:
        with open(out, "w") as f:
            s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
            s.connect(str(server))
            warm._send(s, {"argv": ["--version"], "cwd": str(tmp_path), "env": _env(),
                           "host": socketlib.gethostname()}, [0, f.fileno(), f.fileno()])
            s.close()  # gone before the server can answer: its reply fails
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(3)
    assert out.read_text() == ""  # `precswitch --version` never ran
    # the server goes on serving
    r = subprocess.run([sys.executable, "-m", "precswitch.cli", "--version"], capture_output=True, text=True,
                       env=_env(**{warm.SOCKET_ENV: str(server)}), timeout=60)
    assert r.returncode == 0 and "precswitch" in r.stdout and "cold" not in r.stderr
