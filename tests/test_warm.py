"""Warm start (src/precswitch/warm.py): a server imports the libraries once and forks one child per
`precswitch` command. A warm run must be the same run as a cold one: same results bit for bit, the
client's exit status, signals forwarded, bad environments declined, no orphans when things die."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
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
    return _listening(p, sock, limit=120, poll=0.1, what="server")


def _listening(p: subprocess.Popen, sock: Path, *, limit: float, poll: float, what: str) -> subprocess.Popen:
    """Wait until the server process ``p`` listens on ``sock`` (failing if it dies or takes over ``limit`` s)."""
    t = time.time()
    while not sock.exists():
        assert p.poll() is None, p.stdout.read()
        assert time.time() - t < limit, f"{what} never listened"
        time.sleep(poll)
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
    """A live process that names the socket (as `precswitch warm serve --socket PATH` does) but never listens is
    waited for up to the timeout; a live process that does not name it (the dead server's pid, reused) is not
    waited for at all: each client used to wait the full 300 s for it."""
    sock = tmp_path / "s"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--socket", str(sock)])
    other = subprocess.Popen(["sleep", "60"])
    try:
        warm.write_pid(str(sock), sleeper.pid)
        t = time.monotonic()
        assert not warm._wait_until_listening(str(sock), timeout=0.5)
        assert 0.5 <= time.monotonic() - t < 5
        warm.write_pid(str(sock), other.pid)
        t = time.monotonic()
        assert not warm._wait_until_listening(str(sock), timeout=30)
        assert time.monotonic() - t < 5
    finally:
        for p in (sleeper, other):
            p.kill()
            p.wait()


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


def test_the_server_removes_its_socket_dir():
    d = Path(warm.make_socket_dir())  # as the Snakefile makes it
    assert d.name.startswith(warm.SOCKET_DIR_PREFIX)
    p = _start_server(d / "socket")
    p.terminate()
    assert p.wait(timeout=60) == 0
    assert not d.exists()


def test_a_temp_dir_too_long_for_a_unix_socket_falls_back_to_tmp(tmp_path, monkeypatch):
    """A cluster job's TMPDIR can be long; a Unix socket path may have 107 bytes. The socket dir then goes
    under /tmp, and the server refuses a path it could not bind with a message, not an OSError traceback."""
    import tempfile

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    d = warm.make_socket_dir()
    try:
        assert d is not None and Path(d).parent == Path("/tmp") and Path(d).name.startswith(warm.SOCKET_DIR_PREFIX)
        assert warm.socket_path_fits(os.path.join(d, "socket"))
    finally:
        os.rmdir(d)
    assert list(deep.iterdir()) == []  # the too-long dir it tried is not left behind
    assert not warm.socket_path_fits(str(deep / "socket"))
    with pytest.raises(SystemExit, match="too long for a Unix socket"):
        warm.serve(str(deep / "socket"), None, 0, preload=())
    assert not (deep / "socket").exists()
    # the limit is Linux's: a path of exactly 107 bytes with the server's temporary name binds
    assert warm.socket_path_fits("/" + "x" * (warm.MAX_SOCKET_PATH - 1 - len(".4194304.tmp")))
    assert not warm.socket_path_fits("/" + "x" * (warm.MAX_SOCKET_PATH - len(".4194304.tmp")))


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


# ------------------------------------------------------------------ mutation audit (warm): a fake-command server
# A real server (warm.serve) whose precswitch.cli.main is replaced by a few test commands, and that
# imports nothing (preload=()): it starts in well under a second. Its "torch" only records
# set_num_threads, which a child calls for the client's OMP_NUM_THREADS.
FAKE_SERVER = r"""
import json, os, signal, sys, time, types
import precswitch.cli as cli
from precswitch import warm

THREADS = []
sys.modules["torch"] = types.SimpleNamespace(set_num_threads=THREADS.append)


def main(argv):
    cmd, *rest = argv
    print(f"fake {cmd} stdout", flush=True)
    if cmd == "report":
        with open(rest[0], "w") as f:
            json.dump({"cwd": os.getcwd(), "env": dict(os.environ), "sys_argv": sys.argv, "threads": THREADS,
                       "process_start": warm.process_start()}, f)
        return 0
    if cmd == "sleep":
        time.sleep(float(rest[0]))
        return 0
    if cmd == "exit":
        raise SystemExit(rest[0])
    if cmd == "exit-int":
        raise SystemExit(int(rest[0]))
    if cmd == "exit-none":
        sys.exit()
    if cmd == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if cmd == "slow-stop":  # like a training stage: SIGTERM saves its state (here: until rest[0] exists), exits 75
        def save_state(*a):
            t = time.monotonic()
            while not os.path.exists(rest[0]) and time.monotonic() - t < 20:
                time.sleep(0.02)
            os._exit(75)

        signal.signal(signal.SIGTERM, save_state)
        print("saving on SIGTERM", flush=True)
        time.sleep(60)
        return 0
    return 42


cli.main = main
warm.write_pid(sys.argv[1], os.getpid())
warm.serve(sys.argv[1], None, float(sys.argv[2]), preload=())
"""

# A client: hands argv to the server; exit 99 when it was not served (would start cold).
CLIENT = r"""
import socket, sys
from precswitch import warm

if sys.argv[1] == "--short-timeouts":  # the client's 30 s socket timeouts as 0.3 s
    class Fast(socket.socket):
        def settimeout(self, t):
            super().settimeout(None if t is None else t / 100)

    socket.socket = Fast
    del sys.argv[1]
status = warm.delegate(sys.argv[1:])
sys.exit(99 if status is None else status)
"""

#: what the Snakefile's onstart gives the server: no thread pools in it, the children set their own
SERVER_THREADS = {k: "1" for k in warm.THREAD_ENV}


def _fake_server(sock: Path, idle: float = 0, **env) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, str(sock), str(idle)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env=_env(**SERVER_THREADS, **env))
    return _listening(p, sock, limit=60, poll=0.02, what="fake server")


def _stop(p: subprocess.Popen) -> str:
    if p.poll() is None:
        p.terminate()
    try:
        return p.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        return p.communicate()[0]


def _client(sock: Path, args: list[str], *, short_timeouts: bool = False, cwd=None,
            **env) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", CLIENT, *(["--short-timeouts"] if short_timeouts else []), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=_env(**{warm.SOCKET_ENV: str(sock)}, **env))


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory):
    sock = tmp_path_factory.mktemp("fakewarm") / "s"
    p = _fake_server(sock, PRECSWITCH_TEST_SERVER_ONLY="1")
    yield sock
    _stop(p)


def test_a_warm_child_is_the_clients_process(fake_server, tmp_path):
    """The child has the client's environment (not the server's, and no socket variable: its own
    subprocesses start cold), working directory, argv, thread count (the client's OMP_NUM_THREADS,
    which differs from the server's without a decline) and stdout."""
    out = tmp_path / "report.json"
    r = _client(fake_server, ["report", str(out)], cwd=tmp_path, PRECSWITCH_TEST_CLIENT_ONLY="yes", OMP_NUM_THREADS="2")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "fake report stdout\n" and "declined" not in r.stderr
    rep = json.loads(out.read_text())
    assert rep["env"]["PRECSWITCH_TEST_CLIENT_ONLY"] == "yes" and rep["env"]["OMP_NUM_THREADS"] == "2"
    assert "PRECSWITCH_TEST_SERVER_ONLY" not in rep["env"] and warm.SOCKET_ENV not in rep["env"]
    assert rep["cwd"] == str(tmp_path) and rep["sys_argv"] == ["precswitch", "report", str(out)]
    assert rep["threads"] == [2] and rep["process_start"] == "warm"


@pytest.mark.parametrize("args, code, err", [
    (["exit", "no such file: x.yaml"], 1, "no such file: x.yaml"),  # sys.exit("message"): 1, the message on stderr
    (["exit-int", "3"], 3, ""),
    (["kill"], 128 + signal.SIGKILL, ""),  # killed by a signal: 128 + its number, as a shell reports it
    (["exit-none"], 0, ""),  # sys.exit(): 0
    (["no-such-fake-command"], 42, ""),  # main's return value is the status
])
def test_a_warm_childs_exit_status_is_a_fresh_processs(fake_server, args, code, err):
    r = _client(fake_server, args)
    assert r.returncode == code, r.stderr
    assert err in r.stderr and "declined" not in r.stderr


def test_a_command_longer_than_the_clients_socket_timeout_still_reports(fake_server):
    """The client's 30 s timeout is for connecting and the server's first reply only: a training stage of
    hours must not end in a socket timeout (here 0.3 s, the command 1 s)."""
    r = _client(fake_server, ["sleep", "1"], short_timeouts=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "fake sleep stdout\n"


def test_warm_subcommands_are_never_handed_to_the_server(fake_server):
    """`precswitch warm serve|stop` with the socket variable set (a shell inside a job) must run itself,
    not in a child of the very server it would start or stop."""
    for args in (["warm", "stop", "--socket", str(fake_server)], ["warm", "serve", "--socket", "x"]):
        r = _client(fake_server, args)
        assert r.returncode == 99, (r.returncode, r.stdout, r.stderr)  # not served: runs cold
        assert r.stdout == ""


def test_a_zombie_or_another_users_process_counts_right(monkeypatch):
    p = subprocess.Popen(["true"])
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    try:
        assert not warm.alive(p.pid)
    finally:
        p.wait()
    assert warm.alive(os.getpid())

    def not_yours(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(warm.os, "kill", not_yours)  # exists, but belongs to another user
    assert warm.alive(os.getpid())


def test_the_idle_timeout_counts_from_the_last_command_not_during_one(tmp_path):
    """A stage longer than --idle-timeout is no idle server: it runs to its end, and the server stops
    once it has been idle that long after it."""
    sock = tmp_path / "s"
    p = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, str(sock), "1.0"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True, env=_env(**SERVER_THREADS))
    warm.write_pid(str(sock), p.pid)  # as onstart does: the client waits for the server's imports
    try:
        r = _client(sock, ["sleep", "1.5"])
        assert r.returncode == 0, r.stderr
        assert p.wait(timeout=30) == 0  # then idle: it stops by itself
    finally:
        out = _stop(p)
    assert "idle for 1 s" in out and "served 1 commands" in out and not sock.exists()


def test_stopping_the_server_terminates_its_running_commands(tmp_path):
    """`precswitch warm stop`: running children get SIGTERM (a stage saves its state), and stop returns
    once the server is gone, not before."""
    sock = tmp_path / "s"
    p = _fake_server(sock)
    try:
        c = subprocess.Popen([sys.executable, "-c", CLIENT, "sleep", "60"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=_env(**{warm.SOCKET_ENV: str(sock)}))
        assert c.stdout.readline() == "fake sleep stdout\n"  # the child runs
        t = time.monotonic()
        assert warm.stop_server(str(sock), timeout=20)
        assert not warm.alive(p.pid)
        assert c.wait(timeout=20) == 128 + signal.SIGTERM
        assert time.monotonic() - t < 15
    finally:
        out = _stop(p)
        if c.poll() is None:
            c.kill()
            c.wait()
    assert "served 1 commands" in out


def _request(host: str, env: dict, n_fds: int = 3) -> tuple:
    """A request as delegate sends it (stdin, stdout and stderr: one pipe's write end), on a socket pair:
    (the pipe's read end, the server's end, the client's end)."""
    import socket as socketlib

    server_end, client_end = socketlib.socketpair(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    r, w = os.pipe()
    warm._send(client_end, {"argv": ["--version"], "cwd": "/", "env": env, "host": host}, [w] * n_fds)
    os.close(w)
    return r, server_end, client_end


def test_a_request_the_server_cannot_serve_like_a_fresh_process_is_declined(monkeypatch):
    """Declined: a client on another host, an import-time variable the server has and the client has not
    (the child would silently run with it), a request without stdin/stdout/stderr. Nothing is forked, and
    the server lets go of the client's output at once."""
    import socket as socketlib

    forked = []
    monkeypatch.setattr(os, "fork", lambda: forked.append(1) or os.getpid())  # a fork would be a bug here
    host = socketlib.gethostname()
    cases = [
        ("elsewhere", {"PATH": "/bin"}, {}, 3, "client on host 'elsewhere'"),
        (host, {"PATH": "/bin"}, {"HF_HUB_OFFLINE": "1"}, 3, "environment differs from the server's in HF_HUB_OFFLINE"),
        (host, {"PATH": "/bin"}, {}, 1, None),  # one fd instead of three: dropped, no answer
    ]
    for req_host, env, base_env, n_fds, why in cases:
        r, server_end, client_end = _request(req_host, env, n_fds)
        assert warm._accept(server_end, base_env, {}, host) is None
        reply = warm._recv(client_end)[0]
        assert (reply is None) if why is None else (why in reply["decline"]), reply
        assert os.read(r, 1) == b""  # EOF: the server holds no copy of the client's stdout
        os.close(r)
        client_end.close()
    assert forked == []


def test_a_server_made_variable_never_overrides_the_clients(tmp_path, monkeypatch):
    """What the server's imports put into the environment (KMP_INIT_AT_FORK, ...) reaches a child only
    where its client does not set the variable itself."""
    import socket as socketlib

    report = tmp_path / "env.json"

    def child(req, fds):  # in the forked child: report the environment it would run with, and exit
        with open(report, "w") as f:
            json.dump(req["env"], f)
        os._exit(0)

    monkeypatch.setattr(warm, "_child", child)
    r, server_end, client_end = _request(socketlib.gethostname(), {"PATH": "/bin", "PRECSWITCH_TEST_X": "client"})
    pid = warm._accept(server_end, {}, {"PRECSWITCH_TEST_X": "server", "PRECSWITCH_TEST_Y": "server"},
                       socketlib.gethostname())
    assert pid is not None and warm._recv(client_end)[0] == {"pid": pid}
    assert os.waitpid(pid, 0)[1] == 0
    os.close(r)
    server_end.close()
    client_end.close()
    assert json.loads(report.read_text()) == {"PATH": "/bin", "PRECSWITCH_TEST_X": "client",
                                              "PRECSWITCH_TEST_Y": "server"}


def test_serve_removes_only_its_own_socket_dir(tmp_path, monkeypatch):
    """The pid file always goes; the parent dir only when it is the Snakefile's precswitch-warm-* dir,
    never a user's own (empty) dir that happens to hold the socket."""
    import argparse

    monkeypatch.setattr(warm, "serve", lambda *a, **k: 0)
    for name, kept in (("mine", True), (warm.SOCKET_DIR_PREFIX + "abc", False)):
        d = tmp_path / name
        d.mkdir()
        assert warm._cmd_serve(argparse.Namespace(socket=str(d / "socket"), parent_pid=None, idle_timeout=0)) == 0
        assert d.exists() == kept
        assert not (d / "socket.pid").exists()


def test_a_dead_servers_children_hold_neither_its_listener_nor_their_clients(tmp_path):
    """Killed hard, the server's children get SIGTERM and may take a while to save their state. Meanwhile
    a new client is refused at once and starts cold (a child holding the listener would leave it waiting
    in a backlog nobody accepts from), and the running child's client is told at once."""
    sock = tmp_path / "s"
    server = _fake_server(sock)
    saved = tmp_path / "saved"
    c = subprocess.Popen([sys.executable, "-c", CLIENT, "slow-stop", str(saved)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(**{warm.SOCKET_ENV: str(sock)}))
    try:
        assert c.stdout.readline() == "fake slow-stop stdout\n" and c.stdout.readline() == "saving on SIGTERM\n"
        (child,) = _children_of(server.pid)
        server.kill()
        server.wait()
        assert c.wait(timeout=30) == 1  # its pipes stay open: the child still writes to them
        r = _client(sock, ["report", str(tmp_path / "r.json")])
        assert warm.alive(child)  # still saving its state
        assert r.returncode == 99 and "Connection refused" in r.stderr, r.stderr
        saved.touch()
        assert "went away" in c.communicate(timeout=30)[1]
    finally:
        saved.touch()
        _stop(server)
        if c.poll() is None:
            c.kill()
            c.wait()


def test_stop_leaves_alone_a_process_that_took_a_stale_pid_files_number(tmp_path):
    """A pid file left by a server that died (a crashed Snakemake) may name a pid the system has since
    given to another program: `precswitch warm stop` must not SIGTERM it."""
    sock = tmp_path / "s"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        warm.write_pid(str(sock), other.pid)
        assert warm.stop_server(str(sock), timeout=2)  # the server on sock is not running
        time.sleep(0.2)
        assert other.poll() is None  # and the other program was not signalled
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_the_client_ends_a_command_that_does_not_catch_it(fake_server, sig):
    """SIGTERM (Snakemake's cancel) or Ctrl-C to the client of a command that installs no handler of its own (not
    a training stage: `precswitch prepare`, ...): forwarded, it ends the child as it would end a fresh process, and
    the client reports 128 + the signal. (The child must not keep the server's own handlers, which only note a
    stop request: the command would run on and the client wait for it.)"""
    c = subprocess.Popen([sys.executable, "-c", CLIENT, "sleep", "30"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(**{warm.SOCKET_ENV: str(fake_server)}))
    try:
        assert c.stdout.readline() == "fake sleep stdout\n"  # the child runs
        t = time.monotonic()
        while not _catches(c.pid, signal.SIGUSR2):  # the client forwards signals (its last handler is set)
            assert time.monotonic() - t < 10, "the client never set its signal forwarding"
            time.sleep(0.01)
        c.send_signal(sig)
        assert c.wait(timeout=10) == 128 + sig, c.stderr.read()
    finally:
        if c.poll() is None:
            c.kill()
            c.wait()


def _catches(pid: int, sig: int) -> bool:
    """Process ``pid`` has a handler for ``sig`` (SigCgt in /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


# ------------------------------------------------------------------ mutation audit 4 (gpu): declines, pid files
@pytest.mark.parametrize("var", ["TORCH_HOME", "PYTORCH_CUDA_ALLOC_CONF", "PYTHONHASHSEED", "TRANSFORMERS_CACHE",
                                 "HF_HOME", "DATASETS_VERBOSITY", "MKL_ENABLE_INSTRUCTIONS", "KMP_AFFINITY",
                                 "LD_PRELOAD"])
def test_any_import_time_variable_the_client_sets_and_the_server_has_not_is_declined(monkeypatch, var):
    """Each family of variables read while torch, transformers, datasets or MKL are imported declines a warm start
    when only the client sets it (the child would run without it), naming the variable; nothing is forked."""
    import socket as socketlib

    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked a request that must be declined"))
    host = socketlib.gethostname()
    r, server_end, client_end = _request(host, {"PATH": "/bin", var: "x"})
    try:
        assert warm._accept(server_end, {}, {}, host) is None
        assert warm._recv(client_end)[0] == {"decline": f"environment differs from the server's in {var}"}
    finally:
        os.close(r)
        client_end.close()


def test_a_pid_file_without_a_number_means_no_server(tmp_path):
    """A pid file that names no process (empty, or not a number) is no server starting: the client starts cold at
    once, and `warm stop` has nothing to stop."""
    sock = tmp_path / "s"
    for text in ("", "not-a-pid\n"):
        Path(str(sock) + ".pid").write_text(text)
        assert warm.server_pid(str(sock)) is None
        t = time.monotonic()
        assert not warm._wait_until_listening(str(sock))
        assert time.monotonic() - t < 1
        assert warm.stop_server(str(sock), timeout=1)


def test_stop_reports_a_server_that_does_not_go(tmp_path):
    """`precswitch warm stop` tells the truth: a server that outlives its timeout (stuck, ignoring SIGTERM) is a
    failed stop (False: exit 1), not a stopped one."""
    sock = tmp_path / "s"
    stuck = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)", str(sock)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert stuck.stdout.readline() == "ready\n"  # its SIGTERM handler is set
        warm.write_pid(str(sock), stuck.pid)  # its command line names the socket, as a server's does
        assert warm.stop_server(str(sock), timeout=0.3) is False
        assert stuck.poll() is None
    finally:
        stuck.kill()
        stuck.wait()


# ------------------------------------------------------------------ mutation audit 7 (warm/io): malformed requests
@pytest.mark.parametrize("req", [["--version"], "text", {"argv": ["--version"], "cwd": "/", "env": ["PATH"], "host": "h"}])
def test_a_request_that_is_json_but_no_mapping_is_dropped_not_fatal(monkeypatch, req):
    """A request that parses as JSON but is no mapping (or whose env is none) is a bad request like any other:
    dropped, the client's output let go, nothing forked. It used to raise AttributeError out of the serve loop,
    which stopped the server and SIGTERMed every running command of every other client."""
    import socket as socketlib

    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked a malformed request"))
    host = socketlib.gethostname()
    if isinstance(req, dict):
        req = {**req, "host": host}
    server_end, client_end = socketlib.socketpair(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    r, w = os.pipe()
    warm._send(client_end, req, [w] * 3)
    os.close(w)
    try:
        assert warm._accept(server_end, {}, {}, host) is None
        assert warm._recv(client_end)[0] is None  # no answer: the client starts cold
        assert os.read(r, 1) == b""  # the server holds no copy of the client's stdout
    finally:
        os.close(r)
        client_end.close()


def test_serve_refuses_to_take_over_a_file_or_a_live_servers_socket(tmp_path, monkeypatch):
    """serve unlinked whatever was at --socket: a mistyped --socket naming a config file deleted it, and a second
    server took over a live one's socket and pid file. Both are refused before anything is written; a stale
    socket (its server gone) is still replaced, and a negative idle timeout (which stopped the server at once)
    is refused."""
    import argparse

    served = []
    monkeypatch.setattr(warm, "serve", lambda path, *a, **k: served.append(path) or 0)

    def cmd(path, idle=0.0):
        return warm._cmd_serve(argparse.Namespace(socket=str(path), parent_pid=None, idle_timeout=idle))

    cfg = tmp_path / "config.yaml"
    cfg.write_text("seeds: [1]\n")
    with pytest.raises(SystemExit, match=r"--socket .*config\.yaml exists and is not a socket; not replacing it"):
        cmd(cfg)
    assert cfg.read_text() == "seeds: [1]\n" and not (tmp_path / "config.yaml.pid").exists() and not served
    live = tmp_path / "live"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(live))
    listener.listen(1)
    warm.write_pid(str(live), 4242)
    try:
        with pytest.raises(SystemExit, match=r"a server already serves on .*live \(pid 4242\); stop it first"):
            cmd(live)
        assert warm.server_pid(str(live)) == 4242 and live.exists() and not served
    finally:
        listener.close()
    assert cmd(live) == 0 and served == [str(live)]  # its server gone: a stale socket, replaced
    with pytest.raises(SystemExit, match=r"--idle-timeout -1: must be >= 0"):
        cmd(tmp_path / "new", idle=-1)
