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
on S3 (an unfinished PUT is never visible).

Keys are ``/``-joined relative paths built only from validated names. Any failure other
than "missing" or "exists" becomes ``StoreUnavailableError`` (the store could not be
reached or refused access), which the client treats as "serve the last good copy".
"""

from __future__ import annotations

import logging
import os
import uuid
from abc import ABC, abstractmethod
from typing import Any, Mapping

from promptdistill.core.errors import PromptDistillError, RegistryError

__all__ = ["Backend", "LocalBackend", "FsspecBackend", "StoreUnavailableError", "open_backend"]

logger = logging.getLogger("promptdistill.registry")

# Protocols whose create-only write is atomic across processes and machines.
_ATOMIC_CREATE = ("s3", "s3a")
# Protocols where fsspec's check-then-write is enough (one process only).
_SINGLE_PROCESS = ("memory",)


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

    def url(self, key: str) -> str:
        """Where a key lives, for messages."""
        return f"{self.root.rstrip('/')}/{key}"

    def ensure_root(self) -> None:  # noqa: B027 - most stores need nothing
        """Create the root if the store needs that before a first write."""


class LocalBackend(Backend):
    """A folder on a local (or mounted) filesystem."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _check_root(self, key: str, err: OSError) -> None:
        if not os.path.isdir(self.root):
            raise StoreUnavailableError(
                f"{self.root}: the registry root does not exist or is not mounted (reading {key})"
            ) from err

    def url(self, key: str) -> str:
        return self._path(key)

    def ensure_root(self) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise StoreUnavailableError(f"{self.root}: cannot create the registry root: {e}") from e

    def read(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError as e:
            self._check_root(key, e)
            raise
        except IsADirectoryError:
            raise FileNotFoundError(self._path(key)) from None
        except OSError as e:
            raise StoreUnavailableError(f"{self._path(key)}: cannot read: {e}") from e

    def _write_temp(self, path: str, data: bytes) -> str:
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
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
        path = self._path(key)
        try:
            tmp = self._write_temp(path, data)
            try:
                os.link(tmp, path)  # atomic, and fails if the name exists
            finally:
                os.unlink(tmp)
        except FileExistsError:
            raise
        except OSError as e:
            raise StoreUnavailableError(f"{path}: cannot create: {e}") from e
        self._sync_dir(os.path.dirname(path))

    def replace(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, data)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:
            raise StoreUnavailableError(f"{path}: cannot write: {e}") from e
        self._sync_dir(os.path.dirname(path))

    def list(self, prefix: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self._path(prefix)) if not n.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise StoreUnavailableError(f"{self._path(prefix)}: cannot list: {e}") from e


class FsspecBackend(Backend):
    """Any fsspec filesystem; create-only writes are atomic on S3 (conditional PUT)."""

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None) -> None:
        import fsspec  # only for non-local roots

        self.root = root
        try:
            self.fs, self._base = fsspec.core.url_to_fs(root, **dict(storage_options or {}))
        except ImportError as e:
            raise RegistryError(f"{root}: this URL needs an extra package: {e}") from e
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
        return f"{self._base.rstrip('/')}/{key}"

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


def open_backend(root: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> Backend:
    """A backend for a folder path, a ``file://`` URL or any fsspec URL."""
    root = os.fspath(root)
    if root.startswith("file://"):
        root = root[len("file://") :]
    if "://" not in root and not root.startswith(("memory:", "s3:")):
        return LocalBackend(root)
    return FsspecBackend(root, storage_options)
