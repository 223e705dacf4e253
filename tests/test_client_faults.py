"""Fault injection with a real object store: moto's S3 server behind a proxy that hangs,
refuses, resets and answers garbage on command.

The client reads through the proxy with the default timeouts (no storage options but
the endpoint and keys), so these tests also check that the defaults are bounded. Writes
go straight to moto. Every wait is measured and printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import http.client
import logging
import socket
import struct
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import pytest
from processes import free_port

pytest.importorskip("s3fs", reason="install the dev extra: pip install -e '.[dev]'")
from moto.server import ThreadedMotoServer  # noqa: E402
from test_registry import make_content  # noqa: E402

from promptdistill.client import Templates  # noqa: E402
from promptdistill.core.errors import PromptDistillError  # noqa: E402
from promptdistill.registry import Registry, StoreUnavailableError  # noqa: E402

MEASURED: dict[str, float] = {}
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}



class FaultProxy:
    """An HTTP/1.1 proxy to ``upstream``; ``rule(method, path)`` picks what each request gets:

    * ``pass``: forwarded;
    * ``hang``: read, then never answered (until ``release`` is set);
    * ``garbage``: bytes that are not HTTP, then the connection is closed;
    * ``garbage200``: ``200 OK`` with random bytes as the body;
    * ``reset``: the connection is reset (RST) without an answer.
    """

    def __init__(self, upstream_port: int) -> None:
        self.rule: Callable[[str, str], str] = lambda method, path: "pass"
        self.release = threading.Event()
        self.seen: list[tuple[str, str, str]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _handle(self) -> None:
                body = self._body()
                action = proxy.rule(self.command, self.path)
                proxy.seen.append((self.command, self.path, action))
                if action == "hang":
                    proxy.release.wait(120)
                    self.close_connection = True
                    return
                if action == "garbage":
                    self.wfile.write(b"\x00\xffTHIS IS NOT HTTP\r\n\r\n\x13\x37")
                    self.close_connection = True
                    return
                if action == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                if action == "garbage200":
                    junk = b"\x89garbage{not json or xml<" * 8
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(junk)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(junk)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length or "0")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _options(endpoint: str) -> dict:
    # Only what any deployment gives: the timeouts and retries are the library's defaults.
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}


@pytest.fixture(scope="module")
def moto_port():
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield port
    server.stop()
    if MEASURED:
        print("\nclient fault-injection waits (s):", {k: round(v, 3) for k, v in MEASURED.items()})


@pytest.fixture
def store(moto_port):
    """(root, proxy): a fresh bucket with 'slow' and 'fast' published, and a proxy in front."""
    import s3fs

    direct = _options(f"http://127.0.0.1:{moto_port}")
    bucket = f"faults-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(skip_instance_cache=True, **direct).mkdir(bucket)
    root = f"s3://{bucket}/registry"
    reg = Registry(root, storage_options=direct)
    for name in ("slow", "fast"):
        reg.publish(name, make_content(f"{name} v1", name=name), labels=["production"])
        reg.publish(name, make_content(f"{name} v2", name=name))
    proxy = FaultProxy(moto_port)
    yield root, proxy, reg
    proxy.close()


def _timed(fn):
    t0 = time.monotonic()
    try:
        return fn(), time.monotonic() - t0
    except BaseException as e:  # noqa: BLE001 - returned for the test to check
        return e, time.monotonic() - t0


def test_a_hanging_store_costs_a_warm_get_timeout_s_and_never_delays_another_template(store, caplog):
    root, proxy, reg = store
    templates = Templates(root, ttl_s=0, timeout_s=0.5, cold_timeout_s=3, storage_options=_options(proxy.url))
    slow, fast = templates.get("slow@production"), templates.get("fast@production")
    proxy.rule = lambda method, path: "hang" if "/templates/slow/" in path else "pass"

    with caplog.at_level(logging.WARNING, logger="promptdistill.client"):
        got, first = _timed(lambda: templates.get("slow@production"))
    assert got is slow and first < 1.5, first
    MEASURED["warm get, hanging store (timeout_s=0.5)"] = first
    assert "did not answer within 0.5 s; serving last good copy slow:1" in caplog.text

    waits = []
    for _ in range(10):  # "slow" hangs; every get of "fast" is a full refresh through the proxy (ttl_s=0)
        got, took = _timed(lambda: templates.get("fast@production"))
        assert got.ref == "fast:1", got
        waits.append(took)
        got, took = _timed(lambda: templates.get("slow@production"))
        assert got is slow and took < 0.1, took  # the hanging read is not waited for again
    MEASURED["other template's refresh while one hangs, max"] = max(waits)
    assert max(waits) < 1.0, waits
    assert templates.get("fast:2").version == 2

    cold = Templates(root, cold_timeout_s=2, storage_options=_options(proxy.url))
    err, took = _timed(lambda: cold.get("slow@production"))
    assert isinstance(err, StoreUnavailableError) and "no answer within 2 s" in str(err), err
    assert took < 3.0, took
    MEASURED["cold get, hanging store (cold_timeout_s=2)"] = took
    assert cold.get("fast@production") is not fast and cold.get("fast@production").ref == "fast:1"

    reg.set_label("slow", "production", 2)
    proxy.rule = lambda method, path: "pass"
    proxy.release.set()  # the store answers again: the label move is seen
    deadline = time.monotonic() + 30
    while templates.get("slow@production").version != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert templates.get("slow@production").version == 2


def test_the_default_s3_timeouts_bound_a_registry_read(store):
    """Without the client's own wait: s3fs's defaults blocked one read for minutes."""
    root, proxy, _ = store
    proxy.rule = lambda method, path: "hang"
    reg = Registry(root, storage_options=_options(proxy.url))
    err, took = _timed(lambda: reg.resolve("slow", "production"))
    assert isinstance(err, StoreUnavailableError), err
    MEASURED["Registry.resolve, hanging store, default s3 options"] = took
    assert took < 30, took


@pytest.mark.parametrize("fault", ["refused", "reset", "garbage", "garbage200"])
def test_refusing_or_garbage_stores_serve_the_last_good_copy(store, fault, caplog):
    root, proxy, _ = store
    templates = Templates(root, ttl_s=0, timeout_s=0.5, cold_timeout_s=10, storage_options=_options(proxy.url))
    good = templates.get("slow@production")
    if fault == "refused":
        proxy.rule = lambda method, path: "reset"  # kept-alive connections are cut...
        proxy.close()  # ...and nothing listens on the port any more
    else:
        proxy.rule = lambda method, path: fault
    with caplog.at_level(logging.WARNING, logger="promptdistill.client"):
        got, took = _timed(lambda: templates.get("slow@production"))
    assert got is good and took < 1.5, (got, took)
    assert "serving last good copy slow:1" in caplog.text
    MEASURED[f"warm get, {fault}"] = took

    cold = Templates(root, cold_timeout_s=10, storage_options=_options(proxy.url))
    err, took = _timed(lambda: cold.get("slow@production"))
    assert isinstance(err, PromptDistillError), err  # StoreUnavailableError, or IntegrityError for garbage bodies
    if fault != "garbage200":
        assert isinstance(err, StoreUnavailableError), err
    assert took < 11, took
    MEASURED[f"cold get, {fault}"] = took
