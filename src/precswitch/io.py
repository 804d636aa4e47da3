"""Atomic writes (no reader ever sees a half-written file or directory) and the lock files of GPU slots and run dirs."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _clean(o: Any) -> Any:
    """Replace NaN/inf with None so the JSON is strict (readers in any language can parse it)."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, (str, bytes)):
        try:
            return _clean(o.item())
        except (TypeError, ValueError):
            return o
    return o


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it: set, then restore at once
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates the file 0600; give it the mode open() would (0666 minus the umask), so
        # results (metrics.json, verdict.md, tables) stay readable by the group like every other output
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_clean(obj), indent=2, sort_keys=False, default=_json_default) + "\n")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False  # kernel or file system without it: the two-step replace below
    raise OSError(err, os.strerror(err), str(b))


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path`` (file or directory).

    On failure the temporary is removed and an existing ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    _remove(tmp, ignore_errors=False)
    try:
        yield tmp
        _fsync_tree(tmp)  # the contents reach the disk before the rename makes them the result
        if path.is_dir() and not path.is_symlink():
            # one atomic step where it can: tmp then holds the old directory (removed below)
            if not _exchange(tmp, path):
                old = path.parent / f".{path.name}.old-{os.getpid()}"
                _remove(old, ignore_errors=False)  # left by a crashed process of this pid: path is the current one
                os.replace(path, old)
                try:
                    os.replace(tmp, path)
                except BaseException:
                    os.replace(old, path)  # the new one could not go in: put the old one back
                    raise
                shutil.rmtree(old, ignore_errors=True)
        elif (path.is_symlink() or path.is_file()) and tmp.is_dir() and not tmp.is_symlink():
            # a directory cannot be renamed over a link or a file (ENOTDIR): swap the two (tmp then holds the
            # link or file, removed below; a directory a link points to is left alone), else unlink it first
            if not _exchange(tmp, path):
                path.unlink()
                os.replace(tmp, path)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)  # and the rename itself
    finally:
        _remove(tmp, ignore_errors=True)


def _fsync_dir(d: Path) -> None:
    """Flush a directory's entries (a rename in it) to disk; a file system that cannot is left as it is."""
    try:
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # EINVAL on some network and FUSE file systems: nothing more can be done
        pass
    finally:
        os.close(fd)


def _fsync_tree(p: Path) -> None:
    """Flush a file, or every file and directory under ``p`` (links are not followed), to disk.

    Without it a machine crash (not a process crash) right after the rename can leave the renamed
    ``state.pt`` or checkpoint empty: the rename reaches the disk before the data does.
    """
    if p.is_symlink() or not p.exists():
        return
    if p.is_dir():
        for root, dirs, files in os.walk(p):
            for name in files:
                f = Path(root, name)
                if not f.is_symlink():
                    _fsync_file(f)
            _fsync_dir(Path(root))
    else:
        _fsync_file(p)


def _fsync_file(f: Path) -> None:
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(p: Path, ignore_errors: bool) -> None:
    """Remove ``p`` (a file, a directory tree, or a link: the link only, never what it points to), if there."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=ignore_errors)
    elif p.is_symlink() or p.exists():
        p.unlink()


def type_cli_config(cli: Any, config: dict) -> None:
    """Read the text leaves of nested ``snakemake --config`` values as YAML, in ``config`` (in place).

    Snakemake parses a nested --config value with YAML's BaseLoader, so ``--config seeds='[1,2]'``
    gives ``['1', '2']`` and fails validation. Each text leaf of a nested value that YAML reads as a
    number, boolean or null replaces the same leaf of ``config``; text that stays text (a name) is left.
    Top-level scalars are typed by Snakemake itself.
    """
    import yaml

    def has(container: Any, key: Any) -> bool:
        if isinstance(container, dict):
            return key in container
        return isinstance(container, list) and isinstance(key, int) and key < len(container)

    def walk(src: Any, dst: Any) -> None:
        for key, value in (src.items() if isinstance(src, dict) else enumerate(src)):
            if not has(dst, key):
                continue
            if isinstance(value, (dict, list)):
                walk(value, dst[key])
            elif isinstance(value, str):
                try:
                    typed = yaml.safe_load(value)
                except yaml.YAMLError:
                    continue
                if not isinstance(typed, (str, dict, list)):
                    dst[key] = typed

    for key, value in dict(cli or {}).items():
        if isinstance(value, (dict, list)) and key in config:
            walk(value, config[key])


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_mapping_arg(value: str | os.PathLike, option: str) -> dict:
    """Parse a command-line mapping: a JSON object string, ``@file.json``, or a .json/.yaml/.yml path.

    Bad input raises PrecswitchError naming ``option`` (e.g. ``--source``) and what is allowed.
    """
    from .errors import PrecswitchError

    text = str(value).strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise PrecswitchError(f"{option}: not valid JSON ({e.msg} at char {e.pos})") from None
    else:
        path = Path(text[1:] if text.startswith("@") else text)
        if not path.is_file():
            raise PrecswitchError(
                f"{option}: {text!r} is neither a JSON object nor an existing file "
                "(allowed: '{...}', @file.json, file.yaml)"
            )
        try:
            raw = path.read_text(encoding="utf-8")  # not UTF-8 text, or unreadable: a user error too
            if path.suffix.lower() in (".yaml", ".yml"):
                import yaml

                obj = yaml.safe_load(raw)
            else:
                obj = json.loads(raw)
        except Exception as e:  # noqa: BLE001 - any parse error is a user error
            raise PrecswitchError(f"{option}: cannot parse {path}: {e}") from None
    if not isinstance(obj, dict):
        raise PrecswitchError(f"{option}: expected a mapping (JSON object), got {type(obj).__name__}")
    return obj


def flock_and_sign(fd: int, holder: str) -> bool:
    """Take an exclusive non-blocking flock on ``fd``; False if another process holds it. Taken, the file is
    overwritten with ``holder`` (who holds it: for messages only, the lock is the flock, which goes with its
    process). Other OSErrors of flock propagate."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return False
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
    except OSError:
        pass
    return True


def lock_holder(path: str | os.PathLike, unknown: str = "holder unknown") -> str:
    """What the holder of a lock file wrote into it (flock_and_sign), or ``unknown``."""
    try:
        return Path(path).read_text(errors="replace").strip()[:400] or unknown
    except OSError:
        return unknown


def disk_write_error(error: BaseException) -> str | None:
    """Why a write failed where the disk refused it (full, over quota, read-only), whatever the writing library's
    error type: an ``OSError``'s own words, or the OS error a library names in its message (safetensors raises
    ``SafetensorError("... I/O error: No space left on device (os error 28)")``). None for any other error: a bug,
    to be shown in full, not as a disk's."""
    if isinstance(error, OSError):
        return error.strerror or str(error)
    code = re.search(r"\(os error (\d+)\)", str(error))
    return os.strerror(int(code.group(1))) if code else None


class WriteRefused(Exception):
    """A write the disk refused (full, over quota, read-only): ``path`` and ``why`` (the OS's words)."""

    def __init__(self, path: str | os.PathLike, why: str):
        super().__init__(f"cannot write {str(path)!r}: {why}")
        self.path, self.why = str(path), why


@contextmanager
def refused_writes(path: str | os.PathLike) -> Iterator[None]:
    """Raise :class:`WriteRefused` naming ``path`` where a write inside the block fails on the disk, whatever the
    library's error type (:func:`disk_write_error`); any other error passes unchanged."""
    try:
        yield
    except WriteRefused:
        raise
    except Exception as e:  # noqa: BLE001 - only a disk's refusal is converted; the rest is re-raised
        why = disk_write_error(e)
        if why is None:
            raise
        raise WriteRefused(getattr(e, "filename", None) or path, why) from None
