"""Storage backends: a local folder (plain ``os`` calls) or any fsspec URL.

Everything the registry stores goes through five operations with these guarantees:

* ``read(key)``: the bytes, or ``FileNotFoundError``;
* ``create(key, data)``: create-only and whole-or-nothing. A reader sees the complete
  object or nothing; if the key exists, ``FileExistsError`` and nothing changes.
  Locally: write and fsync a temp file, then ``os.link`` it to the final name (``link``
  fails atomically if the name exists). On S3: one ``PutObject`` with ``If-None-Match: *``.
* ``replace(key, data)``: atomic overwrite (temp + ``os.replace`` locally; one PUT on S3);
* ``list(prefix)``: names directly under a folder (``[]`` if there is none; names
  starting with ``.`` are never listed).

A writer killed mid-write leaves at most a hidden ``.tmp-*`` file locally and nothing
on S3 (an unfinished PUT is never visible). The next write into that folder removes
temp files older than ``STALE_TEMP_S`` (no live write takes that long).

Keys are ``/``-joined relative paths built only from validated names. Any failure other
than "missing" or "exists" becomes ``StoreUnavailableError`` (the store could not be
reached or refused access), which the client treats as "serve the last good copy".

A local registry holds only regular files and folders inside its root. A symlink that
leads out of the root (the root itself may be a symlink) and anything that is not a
regular file (a FIFO, which would block a reader forever; a socket; a device) are
refused with ``IntegrityError`` naming the path, before anything is read or written
through them, and so is a symlink loop (damage, not an outage: ``templates verify`` lists
it). A symlink that stays inside the root is followed.

``move(key, new_key)`` moves one object aside (``templates repair`` quarantines bad label
events with it; nothing in the registry is ever deleted): a rename locally, even of a
FIFO or a symlink (the link itself moves, never its target); copy, then delete the
original on an object store.

A backend opened with ``must_exist=True`` (the light client, the ``templates`` CLI:
readers that must never mistake an outage for "no such template") believes "missing"
only from a store that is a registry: before anything is reported as not found,
``check_available`` checks the layout. A local root that does not exist, or holds none
of ``registry.json`` (the marker the first write creates), ``templates/``,
``artifacts/`` and ``runs/`` (an unmounted, empty mount point), is unavailable, and so
is an object-store prefix with none of them. With ``must_exist=False`` (the default:
the pipeline, which creates the registry on its first write) such a root reads as an
empty registry.

Object stores get bounded waits by default (``DEFAULT_S3_OPTIONS``: 2 s to connect,
5 s per read, 2 attempts in botocore, none more in s3fs), instead of s3fs's own defaults,
under which one request to an endpoint that accepts and never answers blocked for
minutes. Options given by the caller win.
"""

from __future__ import annotations

import copy
import errno
import logging
import os
import stat
import time
import uuid
from abc import ABC, abstractmethod
from typing import Any, Mapping

from promptdistill.core.errors import IntegrityError, PromptDistillError, RegistryError

__all__ = ["DEFAULT_S3_OPTIONS", "LAYOUT", "MARKER", "Backend", "LocalBackend", "FsspecBackend", "StoreUnavailableError", "open_backend"]

logger = logging.getLogger("promptdistill.registry")

# Protocols whose create-only write is atomic across processes and machines.
_ATOMIC_CREATE = ("s3", "s3a")
# Protocols where fsspec's check-then-write is enough (one process only).
_SINGLE_PROCESS = ("memory",)
# What a registry root holds once anything was written to it.
MARKER = "registry.json"
LAYOUT = (MARKER, "templates", "artifacts", "runs")
_MARKER_BODY = b'{"format": "promptdistill.registry/1"}\n'
STALE_TEMP_S = 3600.0
"""A local ``.tmp-*`` file older than this is left from a killed writer, and removed."""

DEFAULT_S3_OPTIONS: dict[str, Any] = {
    # s3fs retries a timed-out request itself (5 times by default) on top of botocore's
    # own retries: with its 15 s read timeout, that was minutes per request. botocore's
    # standard mode already retries timeouts, resets and throttling once here.
    "retries": 1,
    "config_kwargs": {"connect_timeout": 2, "read_timeout": 5, "retries": {"total_max_attempts": 2, "mode": "standard"}},
    # One filesystem object per Registry: the retries set below must not leak into
    # other users of a cached instance.
    "skip_instance_cache": True,
}
"""fsspec options for ``s3://`` roots, merged under the caller's (the caller's win)."""


class StoreUnavailableError(RegistryError):
    """The registry store could not be reached, or refused access."""


class Backend(ABC):
    """Byte storage under one root with the guarantees listed in the module docstring."""

    root: str

    @abstractmethod
    def read(self, key: str) -> bytes: ...

    @abstractmethod
    def create(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def replace(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def list(self, prefix: str) -> list[str]: ...

    @abstractmethod
    def move(self, key: str, new_key: str) -> None:
        """Move ``key`` to ``new_key`` (which must not exist); FileNotFoundError if ``key`` is missing."""

    def url(self, key: str) -> str:
        """Where a key lives, for messages."""
        return f"{self.root.rstrip('/')}/{key}"

    _ensured = False
    must_exist = False
    """Whether a root without a registry layout is unavailable rather than empty."""

    def ensure_root(self) -> None:
        """Before a write: create the root if the store needs that, and the registry marker."""
        if self._ensured:
            return
        try:
            self.create(MARKER, _MARKER_BODY)
        except FileExistsError:
            pass
        self._ensured = True

    def check_available(self) -> None:
        """With ``must_exist``: raise StoreUnavailableError unless the root holds a registry."""
        if self.must_exist and not any(n in LAYOUT for n in self.list("")):
            raise StoreUnavailableError(
                f"{self.root}: no registry here (none of {', '.join(n if n == MARKER else n + '/' for n in LAYOUT)}): "
                "the store is empty, not mounted, or the root is wrong"
            )


class LocalBackend(Backend):
    """A folder on a local (or mounted) filesystem."""

    def __init__(self, root: str, *, must_exist: bool = False) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.must_exist = must_exist

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *[p for p in key.split("/") if p])

    def _inside(self, key: str) -> str:
        """The path of ``key``, refused if a symlink on the way leads out of the root."""
        path = self._path(key)
        real, root = os.path.realpath(path), os.path.realpath(self.root)
        if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
            raise IntegrityError(f"{path}: a symlink leads out of the registry root {self.root} (to {real}); "
                                 "the registry does not follow it: replace it with a folder or file inside the root")
        return path

    def _check_root(self, key: str, err: OSError) -> None:
        if self.must_exist and not os.path.isdir(self.root):
            raise StoreUnavailableError(
                f"{self.root}: the registry root does not exist or is not mounted (reading {key})"
            ) from err

    def url(self, key: str) -> str:
        return self._path(key)

    def ensure_root(self) -> None:
        if self._ensured:
            return
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise StoreUnavailableError(f"{self.root}: cannot create the registry root: {e}") from e
        if not os.path.exists(self._path(MARKER)):
            super().ensure_root()
        self._ensured = True

    def read(self, key: str) -> bytes:
        path = self._inside(key)
        try:
            # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as e:
            self._check_root(key, e)
            raise
        except IsADirectoryError:
            raise FileNotFoundError(path) from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _symlink_loop(path) from None
            if _kind(path) not in ("regular file", "folder", None):
                raise _not_regular(path) from None  # a socket: ENXIO
            raise StoreUnavailableError(f"{path}: cannot read: {e}") from e
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise FileNotFoundError(path)
            if not stat.S_ISREG(mode):
                raise _not_regular(path)
            with os.fdopen(fd, "rb") as f:
                fd = -1
                return f.read()
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise StoreUnavailableError(f"{path}: cannot read: {e}") from e
        finally:
            if fd >= 0:
                os.close(fd)

    @staticmethod
    def _remove_stale_temps(folder: str) -> None:
        """Remove ``.tmp-*`` files a killed writer left, once they are older than STALE_TEMP_S."""
        try:
            names = [n for n in os.listdir(folder) if n.startswith(".tmp-")]
        except OSError:
            return
        cutoff = time.time() - STALE_TEMP_S
        for n in names:
            path = os.path.join(folder, n)
            try:
                if os.stat(path).st_mtime < cutoff:
                    os.unlink(path)
                    logger.info("%s: removed a temp file left by a killed writer", path)
            except OSError:
                pass  # another writer removed it first, or it is not ours to remove

    def _write_temp(self, path: str, data: bytes) -> str:
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        self._remove_stale_temps(folder)
        tmp = os.path.join(folder, f".tmp-{os.getpid()}-{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    @staticmethod
    def _sync_dir(folder: str) -> None:
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def create(self, key: str, data: bytes) -> None:
        path = self._inside(key)
        try:
            tmp = self._write_temp(path, data)
            try:
                os.link(tmp, path)  # atomic, and fails if the name exists
            finally:
                _unlink_quietly(tmp)
        except FileExistsError:
            raise
        except OSError as e:
            raise StoreUnavailableError(f"{path}: cannot create: {e}") from e
        self._sync_dir(os.path.dirname(path))

    def replace(self, key: str, data: bytes) -> None:
        path = self._inside(key)
        if _kind(path) not in ("regular file", None):
            raise _not_regular(path)
        try:
            tmp = self._write_temp(path, data)
            try:
                os.replace(tmp, path)
            except BaseException:
                _unlink_quietly(tmp)
                raise
        except OSError as e:
            raise StoreUnavailableError(f"{path}: cannot write: {e}") from e
        self._sync_dir(os.path.dirname(path))

    def list(self, prefix: str) -> list[str]:
        path = self._inside(prefix)
        try:
            return sorted(n for n in os.listdir(path) if not n.startswith("."))
        except (FileNotFoundError, NotADirectoryError) as e:
            self._check_root(prefix, e)
            return []
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _symlink_loop(path) from None
            raise StoreUnavailableError(f"{path}: cannot list: {e}") from e

    def move(self, key: str, new_key: str) -> None:
        # Only the folders are checked: the object itself may be the bad symlink or FIFO
        # being moved aside, and os.rename moves a link, never its target.
        path, new = self._path(key), self._inside(new_key)
        self._inside(key.rsplit("/", 1)[0] if "/" in key else "")
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        if os.path.lexists(new):
            raise FileExistsError(new)
        try:
            os.makedirs(os.path.dirname(new), exist_ok=True)
            os.rename(path, new)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise StoreUnavailableError(f"{path}: cannot move to {new}: {e}") from e
        self._sync_dir(os.path.dirname(path))
        self._sync_dir(os.path.dirname(new))


class FsspecBackend(Backend):
    """Any fsspec filesystem; create-only writes are atomic on S3 (conditional PUT)."""

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None, *,
                 must_exist: bool = False) -> None:
        import fsspec  # only for non-local roots

        self.root = root
        self.must_exist = must_exist
        protocol = root.split("://", 1)[0] if "://" in root else root.split(":", 1)[0]
        options = _with_defaults(protocol, storage_options)
        retries = options.pop("retries", None) if protocol in _ATOMIC_CREATE else None
        try:
            self.fs, self._base = fsspec.core.url_to_fs(root, **options)
        except ImportError as e:
            raise RegistryError(f"{root}: this URL needs an extra package: {e}") from e
        except ValueError as e:
            if "protocol" in str(e).lower():
                known = ", ".join(sorted(p for p in fsspec.available_protocols() if len(p) > 1)[:12])
                raise RegistryError(f"{root}: unknown storage protocol {protocol!r} (a folder, or a URL such as "
                                    f"s3://bucket/prefix; fsspec knows {known}, ...)") from None
            raise RegistryError(f"{root}: not a usable registry root: {e}") from None
        except Exception as e:  # noqa: BLE001 - a filesystem's constructor may raise anything on bad options
            raise RegistryError(f"{root}: cannot open the store: {type(e).__name__}: {e}") from None
        if retries is not None and hasattr(self.fs, "retries"):
            self.fs.retries = int(retries)
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self.atomic_create = any(p in _ATOMIC_CREATE for p in protocols)
        if not self.atomic_create and not any(p in _SINGLE_PROCESS for p in protocols):
            logger.warning(
                "%s: create-only writes on %s are check-then-write; concurrent publishers "
                "on different machines could collide. S3 and local folders are safe.",
                root,
                protocols[0],
            )

    def _path(self, key: str) -> str:
        return f"{self._base.rstrip('/')}/{key}" if key else self._base.rstrip("/")

    def _call(self, what: str, key: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (FileNotFoundError, FileExistsError, PromptDistillError):
            raise
        except Exception as e:  # noqa: BLE001 - connection errors come in many types (botocore, aiohttp, OSError)
            raise StoreUnavailableError(f"{self.url(key)}: cannot {what}: {type(e).__name__}: {e}") from e

    def read(self, key: str) -> bytes:
        return self._call("read", key, self.fs.cat_file, self._path(key))

    def create(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self.fs.invalidate_cache(path)
        self._call("create", key, self.fs.pipe_file, path, data, mode="create")

    def replace(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._call("write", key, self.fs.pipe_file, path, data)
        self.fs.invalidate_cache(path)

    def list(self, prefix: str) -> list[str]:
        path = self._path(prefix)
        self.fs.invalidate_cache(path)
        try:
            entries = self._call("list", prefix, self.fs.ls, path, detail=False)
        except FileNotFoundError:
            return []
        names = (e.rstrip("/").rsplit("/", 1)[-1] for e in entries)
        return sorted(n for n in names if n and not n.startswith("."))

    def move(self, key: str, new_key: str) -> None:
        src = self._path(key)
        self.create(new_key, self.read(key))  # create-only: never over an earlier copy
        self._call("remove", key, self.fs.rm_file, src)
        self.fs.invalidate_cache(src)


def _with_defaults(protocol: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The caller's fsspec options over the defaults for the protocol (nested config merged)."""
    given = dict(storage_options or {})
    if protocol not in _ATOMIC_CREATE:
        return given
    options = copy.deepcopy(DEFAULT_S3_OPTIONS)
    config = {**options.pop("config_kwargs"), **dict(given.pop("config_kwargs", None) or {})}
    return {**options, **given, "config_kwargs": config}


def _kind(path: str) -> str | None:
    """What is at ``path`` (following symlinks), for messages; None if nothing."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def _not_regular(path: str) -> IntegrityError:
    return IntegrityError(f"{path}: is a {_kind(path) or 'special file'}, not a regular file; the registry "
                          "stores only regular files (move it aside: `promptdistill templates repair NAME` for a "
                          "label event or labels.json)")


def _symlink_loop(path: str) -> IntegrityError:
    return IntegrityError(f"{path}: a symlink loop (too many levels of symbolic links); the registry stores only "
                          "regular files (move it aside: `promptdistill templates repair NAME` for a label event "
                          "or labels.json)")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # removed as stale by another writer


def open_backend(root: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None, *,
                 must_exist: bool = False) -> Backend:
    """A backend for a folder path, a ``file://`` URL or any fsspec URL.

    ``must_exist``: a root without a registry is unavailable, not empty (see the module doc).

    Raises:
        RegistryError: an empty root, or a URL whose protocol fsspec does not know.
    """
    if not isinstance(root, (str, os.PathLike)):
        raise RegistryError(f"a registry root must be a folder or a URL, got {type(root).__name__}")
    root = os.fspath(root)
    if not root.strip():
        raise RegistryError("the registry root is empty: give a folder or a URL such as s3://bucket/prefix")
    if root.startswith("file://"):
        root = root[len("file://") :]
    if "://" not in root and not root.startswith(("memory:", "s3:")):
        return LocalBackend(root, must_exist=must_exist)
    return FsspecBackend(root, storage_options, must_exist=must_exist)
