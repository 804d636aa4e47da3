"""Warm start: one server process imports torch, transformers, datasets and scikit-learn once, then
forks a fresh child for every ``precswitch`` command that asks it to.

Why: a training stage is one process (clean clocks, clean peak memory), and on a laptop-sized stage
importing the libraries costs ~5 s per process, 20-30 % of the embedded default study's wall time.
A forked child starts with those modules already in memory and otherwise behaves like a fresh
process: its own pid, the client's argv, working directory, environment and stdin/stdout/stderr, its
own exit status, and signals sent to the client (SIGTERM from Snakemake or a scheduler) forwarded to it.

Who uses it: ``snakemake`` with ``warm_start: true`` (the default) starts one server per run for
local execution (``onstart`` in the Snakefile) and points the jobs at it through the environment
variable ``PRECSWITCH_WARM_SOCKET``. ``precswitch`` (cli.main) hands its command to the server
when that variable names a live server (waiting for one still importing: onstart writes its pid file
at once), and runs it in-process (a cold start) when it does not, or when the server declines: a
client on another host (a cluster job), or an environment variable that is read while importing the
libraries (HF_*, TORCH*, PYTHON*, ...) that differs from the server's. The run's metrics.json records
``process_start: warm`` or ``cold``.

The server runs no computation itself (CUDA is never initialised in it, no OpenMP pool is started),
so its children fork from a quiet process. It exits when the process that started it (Snakemake)
goes away, when told to (``precswitch warm stop``) or after ``--idle-timeout`` seconds without work;
children still running then get SIGTERM (a training stage saves its resumable state and exits 75).

    precswitch warm serve --socket /tmp/x.sock --parent-pid PID   # usually started by the Snakefile
    precswitch warm stop --socket /tmp/x.sock
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback

#: The environment variable that points ``precswitch`` at a server.
SOCKET_ENV = "PRECSWITCH_WARM_SOCKET"
#: The Snakefile puts the socket in a fresh directory named so; the server removes it when it stops.
SOCKET_DIR_PREFIX = "precswitch-warm-"
#: The longest Unix socket path Linux binds (sun_path is 108 bytes with its NUL). The server binds
#: ``<socket>.<pid>.tmp`` first (pid up to 7 digits), so the socket path itself must be 12 bytes shorter.
MAX_SOCKET_PATH = 107
_TMP_SUFFIX = ".4194304.tmp"

#: Modules a training stage (and data preparation) imports: what the server loads once.
PRELOAD = (
    "torch",
    "numpy",
    "transformers",
    "transformers.models.bert.modeling_bert",
    "transformers.data.data_collator",
    "transformers.tokenization_utils_tokenizers",
    "datasets",
    "sklearn.metrics",
    "tqdm.auto",
    "precswitch.cli",
    "precswitch.train.engine",
    "precswitch.data.prepare",
    "precswitch.data.tokenizer",
)

#: Environment variables read while those modules are imported: a request whose value differs from
#: the server's is declined (it would silently run with the server's value). Thread counts are not
#: among them: the child applies OMP_NUM_THREADS itself (torch.set_num_threads), as a fresh process would.
IMPORT_TIME_ENV_PREFIXES = ("HF_", "HUGGINGFACE", "TRANSFORMERS_", "DATASETS_", "TORCH", "PYTORCH_", "PYTHON",
                            "KMP_", "GOMP_", "MKL_", "OMP_", "LD_", "SKLEARN_", "NUMPY_")
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")

#: Set in a forked child; read by the engine for metrics.json's ``process_start``.
_IN_WARM_CHILD = False

_HEADER = struct.Struct("!I")

#: How long a client waits for a server that is still importing the libraries (its pid file exists,
#: its socket not yet) before it starts cold. Jobs that start right after Snakemake's onstart would
#: otherwise race the server's imports (seconds, more on a loaded machine) and some run cold.
STARTUP_WAIT_S = 300.0

#: The server's own sockets (listener and client connections): a forked child closes its copies.
_SERVER_SOCKETS: list[socket.socket] = []


def process_start() -> str:
    """'warm' in a child forked by the server, else 'cold'."""
    return "warm" if _IN_WARM_CHILD else "cold"


# ------------------------------------------------------------------------------------------ wire
def _send(sock: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    msg = _HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [msg], fds)  # one sendmsg: may send only part of a large message
        if sent < len(msg):
            sock.sendall(msg[sent:])
    else:
        sock.sendall(msg)


def _recv(sock: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message (None at EOF) and the file descriptors that came with it (closed here when the
    rest of the message fails: a server holding a client's stdout would keep its reader waiting)."""
    fds: list[int] = []
    if with_fds:
        buf, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, with_fds)
    else:
        buf = sock.recv(1 << 20)
    try:
        return _recv_rest(sock, buf), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _recv_rest(sock: socket.socket, buf: bytes) -> dict | None:
    if not buf:
        return None
    while len(buf) < _HEADER.size:
        more = sock.recv(1 << 20)
        if not more:
            return None
        buf += more
    (n,) = _HEADER.unpack(buf[: _HEADER.size])
    while len(buf) < _HEADER.size + n:
        more = sock.recv(1 << 20)
        if not more:
            return None
        buf += more
    return json.loads(buf[_HEADER.size : _HEADER.size + n])


def _sensitive(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV_PREFIXES) and k not in THREAD_ENV}


# ---------------------------------------------------------------------------------------- client
def delegate(argv: list[str]) -> int | None:
    """Run ``precswitch argv`` in a child of the server named by $PRECSWITCH_WARM_SOCKET.

    Returns the child's exit status, or None when there is no usable server (then run cold).
    """
    path = os.environ.get(SOCKET_ENV)
    if not path or (argv and argv[0] == "warm") or not _wait_until_listening(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(30)
        sock.connect(path)
        _send(sock, {"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ),
                     "host": socket.gethostname()}, [0, 1, 2])
        reply, _ = _recv(sock)
    except OSError as e:
        print(f"precswitch: warm-start server {path} not usable ({e}); starting cold", file=sys.stderr)
        sock.close()
        return None
    if not reply or "pid" not in reply:
        why = (reply or {}).get("decline", "no answer")
        print(f"precswitch: warm start declined ({why}); starting cold", file=sys.stderr)
        sock.close()
        return None
    child = int(reply["pid"])

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, forward)
    sock.settimeout(None)
    msg, _ = _recv(sock)  # signals above interrupt it; PEP 475 resumes the wait
    sock.close()
    if not msg or "status" not in msg:
        print(f"precswitch: warm-start server {path} went away while running pid {child}", file=sys.stderr)
        return 1
    return int(msg["status"])


def _wait_until_listening(path: str, timeout: float = STARTUP_WAIT_S) -> bool:
    """True once the socket exists; while it does not, wait as long as the server named by the pid
    file is alive and still starting (False at once when there is no live server, or the pid file's number
    now belongs to another program: a server that died while importing)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        pid = server_pid(path)
        if pid is None or not alive(pid) or not _serves(pid, path):  # gone, or its number reused by another program
            return False
        if time.monotonic() > deadline:
            print(f"precswitch: warm-start server pid {pid} not listening on {path} after {timeout:.0f} s; "
                  "starting cold", file=sys.stderr)
            return False
        time.sleep(0.05)
    return True


# ---------------------------------------------------------------------------------------- server
def _child(req: dict, fds: list[int]) -> None:
    """In the forked child: become the client's process, run the command, exit. Never returns."""
    global _IN_WARM_CHILD
    status = 1
    try:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        for sock in _SERVER_SOCKETS:  # a child must not keep the listener (or other clients) open
            sock.close()
        _die_with_parent()
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ.pop(SOCKET_ENV, None)  # grandchildren start cold, as a fresh process would
        n = os.environ.get("OMP_NUM_THREADS")
        if n and n.isdigit() and int(n) > 0:
            import torch

            torch.set_num_threads(int(n))
        _IN_WARM_CHILD = True
        sys.argv = ["precswitch", *req["argv"]]
        from .cli import main

        status = int(main(req["argv"]) or 0)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - report like a fresh interpreter would
        traceback.print_exc()
        status = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when the server dies (its client has then been told it failed)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the child runs to its end
        pass
    if os.getppid() == 1:  # the server died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def socket_path_fits(path: str) -> bool:
    """Whether the server can bind ``path`` (and its ``.<pid>.tmp`` name) as a Unix socket."""
    return len(os.fsencode(os.path.abspath(path) + _TMP_SUFFIX)) <= MAX_SOCKET_PATH


def make_socket_dir() -> str | None:
    """A fresh directory for the server's socket: under the temp dir ($TMPDIR), or under /tmp when the
    temp dir's path is too long for a Unix socket (a cluster's per-job TMPDIR can be); None if neither fits.
    """
    import tempfile

    for where in (None, "/tmp"):
        try:
            d = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX, dir=where)
        except OSError:
            continue
        if socket_path_fits(os.path.join(d, "socket")):
            return d
        os.rmdir(d)
    return None


def serve(path: str, parent_pid: int | None, idle_timeout: float, preload: tuple[str, ...] = PRELOAD) -> int:
    import importlib

    if not socket_path_fits(path):
        raise SystemExit(
            f"precswitch warm: socket path {path} is too long for a Unix socket (with the server's "
            f"'{_TMP_SUFFIX}' name, at most {MAX_SOCKET_PATH} bytes): use a shorter directory"
        )
    before = dict(os.environ)
    t0 = time.perf_counter()
    for name in preload:
        importlib.import_module(name)
    print(f"precswitch warm: imported {len(preload)} modules in {time.perf_counter() - t0:.1f} s", flush=True)
    os.chdir("/")
    base_env = _sensitive(before)
    # what the imports themselves put into the environment (KMP_INIT_AT_FORK, ...): a child gets these
    # as a fresh process would have them after its own imports, unless its client sets them
    added = {k: v for k, v in os.environ.items() if k not in before}
    host = socket.gethostname()

    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}.tmp"
    listener.bind(tmp)
    listener.listen(64)
    os.rename(tmp, path)  # clients see the socket only once it accepts
    _SERVER_SOCKETS.append(listener)
    print(f"precswitch warm: serving on {path} (pid {os.getpid()})", flush=True)

    stop = False

    def on_term(_signum, _frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    children: dict[int, socket.socket] = {}  # child pid -> its client's connection
    last_busy = time.monotonic()
    served = 0
    try:
        while not stop:
            if parent_pid and not alive(parent_pid):
                print(f"precswitch warm: parent {parent_pid} is gone; stopping", flush=True)
                break
            if not children and idle_timeout and time.monotonic() - last_busy > idle_timeout:
                print(f"precswitch warm: idle for {idle_timeout:.0f} s; stopping", flush=True)
                break
            watch = [listener, *children.values()]
            try:
                ready, _, _ = select.select(watch, [], [], 0.2)
            except InterruptedError:
                continue
            for sock in ready:
                if sock is listener:
                    conn, _ = listener.accept()
                    pid = _accept(conn, base_env, added, host)
                    if pid is not None:
                        children[pid] = conn
                        _SERVER_SOCKETS.append(conn)
                        served += 1
                else:  # a client's connection is readable only when the client died: mirror it
                    pid = next(p for p, c in children.items() if c is sock)
                    _kill(pid, signal.SIGKILL)
            last_busy = _reap(children) or last_busy
            if children:
                last_busy = time.monotonic()
    finally:
        for pid in list(children):
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while children and time.monotonic() < deadline:
            _reap(children)
            time.sleep(0.1)
        listener.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        print(f"precswitch warm: served {served} commands; stopped", flush=True)
    return 0


def _accept(conn: socket.socket, base_env: dict, added: dict, host: str) -> int | None:
    """Read one request, fork its child; returns the child's pid (None if declined)."""
    fds: list[int] = []
    try:
        conn.settimeout(10)
        req, fds = _recv(conn, with_fds=3)
        if req is None or len(fds) != 3:
            raise OSError("incomplete request")
        if not isinstance(req, dict) or not isinstance(req.get("env"), dict) or not isinstance(req.get("argv"), list):
            raise ValueError("a request is a mapping with an env mapping and an argv list")
        reason = None
        if req.get("host") != host:
            reason = f"client on host {req.get('host')!r}, server on {host!r}"
        else:
            diff = sorted(k for k in set(base_env) | set(_sensitive(req["env"]))
                          if base_env.get(k) != req["env"].get(k))
            if diff:
                reason = "environment differs from the server's in " + ", ".join(diff)
        if reason:
            _send(conn, {"decline": reason})
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            conn.close()
            os.close(go_w)
            # run only once the client knows this pid: a server killed before telling it leaves a
            # client that starts cold, and this child must then not run the same command as well
            go = os.read(go_r, 1)
            if go != b"g":
                os._exit(1)
            os.close(go_r)
            req["env"] = {**added, **req["env"]}
            _child(req, fds)
        os.close(go_r)
        try:
            _send(conn, {"pid": pid})
            os.write(go_w, b"g")
        finally:
            os.close(go_w)
        conn.settimeout(None)
        return pid
    except (OSError, ValueError, KeyError, TypeError) as e:  # a bad request never stops the server
        print(f"precswitch warm: dropped a request: {e!r}", flush=True)
        conn.close()
        return None
    finally:
        for fd in fds:
            os.close(fd)


def _reap(children: dict[int, socket.socket]) -> float | None:
    """Collect finished children and tell their clients; returns now() if any finished."""
    done = None
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        conn = children.pop(pid, None)
        if conn in _SERVER_SOCKETS:
            _SERVER_SOCKETS.remove(conn)
        code = os.waitstatus_to_exitcode(status)
        if code < 0:  # killed by a signal: what a shell reports
            code = 128 - code
        if conn is not None:
            try:
                _send(conn, {"status": code})
            except OSError:
                pass
            conn.close()
        done = time.monotonic()
    return done


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (exited, not yet reaped: as good as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (not Linux): existence is all we know
        return True


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_server(path: str, timeout: float = 30.0) -> bool:
    """Ask the server on ``path`` to stop (SIGTERM to the pid it serves under); True once it is gone."""
    pid = server_pid(path)
    if pid is None or not _serves(pid, path):
        return True
    _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def _serves(pid: int, path: str) -> bool:
    """False when ``pid`` is provably not the server on ``path``: gone, or (a stale pid file whose
    number the system gave to another program) its command line does not name ``path``. True where
    /proc cannot tell (not Linux)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return os.fsencode(path) in argv


def server_pid(path: str) -> int | None:
    try:
        with open(path + ".pid") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def write_pid(path: str, pid: int) -> None:
    """Name the server serving (or about to serve) on ``path``: clients wait for it while it starts.
    Written by whoever starts the server as soon as it has the pid (the Snakefile's onstart), and by
    the server itself; written whole (rename), so a client never reads half a pid."""
    tmp = f"{path}.pid.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(str(pid))
    os.replace(tmp, path + ".pid")


def register(sub) -> None:
    """``precswitch warm serve|stop`` (cli.COMMAND_MODULES)."""
    p = sub.add_parser("warm", help="warm-start server: import the libraries once, fork a child per command",
                       description=__doc__.split("\n\n")[0])
    wsub = p.add_subparsers(dest="warm_cmd", required=True)
    s = wsub.add_parser("serve", help="import the libraries once and fork a child per request")
    s.add_argument("--socket", required=True, help="Unix socket path to serve on")
    s.add_argument("--parent-pid", type=int, default=None, help="stop when this process is gone")
    s.add_argument("--idle-timeout", type=float, default=3600.0, help="stop after this many idle seconds (default %(default).0f; 0: never)")
    s.set_defaults(func=_cmd_serve)
    t = wsub.add_parser("stop", help="stop the server on --socket")
    t.add_argument("--socket", required=True)
    t.set_defaults(func=lambda a: 0 if stop_server(a.socket) else 1)


def _check_serve_path(path: str, idle_timeout: float) -> None:
    """Refused before anything is written: serving replaces what is at ``path``, so a file that is no socket (a
    mistyped --socket naming a config) or the socket of a server that still answers must not be taken over."""
    import stat

    if idle_timeout < 0:
        raise SystemExit(f"precswitch warm: --idle-timeout {idle_timeout:g}: must be >= 0 (0: never)")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SystemExit(f"precswitch warm: --socket {path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:  # a stale socket of a server that is gone: serve replaces it
        return
    finally:
        probe.close()
    pid = server_pid(path)
    raise SystemExit(f"precswitch warm: a server already serves on {path}"
                     + (f" (pid {pid})" if pid else "") + "; stop it first (precswitch warm stop --socket ...)")


def _cmd_serve(args) -> int:
    _check_serve_path(args.socket, args.idle_timeout)
    write_pid(args.socket, os.getpid())
    try:
        return serve(args.socket, args.parent_pid, args.idle_timeout)
    finally:
        try:
            os.unlink(args.socket + ".pid")
        except FileNotFoundError:
            pass
        # the Snakefile's socket dir: removed here too, for a Snakemake killed before its onerror ran
        parent = os.path.dirname(os.path.abspath(args.socket))
        if os.path.basename(parent).startswith(SOCKET_DIR_PREFIX):
            try:
                os.rmdir(parent)
            except OSError:  # not empty (or gone): not ours to clear
                pass
