"""The night report of a real nightly run, opened in headless Chromium.

``promptdistill nightly --budget smoke`` runs once on the real engine (shared with
tests/test_console.py); its report is loaded in Chromium over the DevTools protocol (a
small client on ``websockets``): no console error, no exception, no request but the file
itself and its data URIs, every spec's section with its diff and both plots decoded.
``promptdistill report`` must rebuild the page from the stored files (a figure changed
since the night shows in the rebuilt page).

Chromium is Debian's ``chromium`` package (``make browser``, part of ``make test``). A
missing browser fails this test: it never skips. Set ``NIGHT_REPORT_SCREENSHOT=PATH`` to
save the page's screenshot there (docs/night-report.png comes from this).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_console import real_nightly

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PAGE_FACTS = """(() => ({
  title: document.title,
  summaryRows: document.querySelectorAll('table.summary tr').length - 1,
  sections: [...document.querySelectorAll('section.spec')].map(s => ({
    spec: s.dataset.spec,
    status: s.querySelector('.badge') ? s.querySelector('.badge').textContent : '',
    prompts: s.querySelectorAll('.diff pre, .same pre').length,
    plots: [...s.querySelectorAll('figure.plot')].map(f => {
      const img = f.querySelector('img');
      return {kind: f.dataset.plot, loaded: !!img && img.complete && img.naturalWidth > 0, width: img ? img.naturalWidth : 0};
    }),
  })),
  height: document.documentElement.scrollHeight,
}))()"""


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is not installed: `make browser` installs it (apt-get install -y chromium)")
    return path


class DevTools:
    """Chromium headless and one page, driven over the DevTools protocol."""

    def __init__(self, user_data_dir: Path) -> None:
        from websockets.sync.client import connect

        self.proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={user_data_dir}", "--remote-debugging-port=0", "--window-size=1280,1800", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = user_data_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                pytest.fail("chromium did not start (no DevToolsActivePort)")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self.events: list[dict[str, Any]] = []
        self._id = 0

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, event: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == event for e in self.events):
            self.events.append(json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic()))))

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def nightly_run(tmp_path_factory):
    return real_nightly(tmp_path_factory.mktemp("nightly-cli"))


@pytest.fixture(scope="module")
def report(nightly_run) -> Path:
    run = nightly_run
    assert run["returncode"] == 0, f"{run['stdout']}\n{run['stderr']}"
    found = re.search(r"^night report: (\S+)$", run["stdout"], re.MULTILINE)
    assert found, run["stdout"]
    return Path(found.group(1))


def test_the_report_opens_in_chromium_without_errors(report, tmp_path):
    browser = DevTools(tmp_path / "chromium-profile")
    try:
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable")
        browser.send("Emulation.setDeviceMetricsOverride", width=1280, height=1800, deviceScaleFactor=1, mobile=False)
        browser.send("Page.navigate", url=report.as_uri())
        browser.wait_for("Page.loadEventFired")
        facts = browser.send("Runtime.evaluate", expression=PAGE_FACTS, returnByValue=True)["result"]["value"]
        shot = browser.send("Page.captureScreenshot", format="png")["data"]
    finally:
        browser.close()

    errors = [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    assert not errors, errors
    # Offline: the page loads nothing but itself (images are data URIs).
    requests = [e["params"]["request"]["url"] for e in browser.events if e.get("method") == "Network.requestWillBeSent"]
    assert requests and all(u == report.as_uri() or u.startswith("data:") for u in requests), requests

    assert facts["title"].startswith("Night report ")
    assert [s["spec"] for s in facts["sections"]] == ["ticket_triage"] and facts["summaryRows"] == 1
    (section,) = facts["sections"]
    # System and user text: side by side (baseline, published) or once when the baseline was kept.
    assert section["prompts"] in (2, 4), section
    assert [p["kind"] for p in section["plots"]] == ["pareto", "ttft"], section
    assert all(p["loaded"] and p["width"] > 100 for p in section["plots"]), section

    png = base64.b64decode(shot)
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    target = os.environ.get("NIGHT_REPORT_SCREENSHOT")
    if target:
        Path(target).write_bytes(png)


def _png(rgb: tuple[int, int, int]) -> bytes:
    """A valid 1x1 PNG of one colour (no imaging library needed)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" + bytes(rgb))) + chunk(b"IEND", b""))


def test_promptdistill_report_rebuilds_the_page_from_stored_files(report, nightly_run):
    """The rebuild reads the stored files again: a figure changed in the stage folder after
    the night shows in the rebuilt page, in place of the old one, and nothing else changes."""
    root = Path(nightly_run["root"])
    before = report.read_bytes()
    # The spec's Pareto figure as the page embeds it, and the stage-folder file(s) it came from.
    figures = {p: p.read_bytes() for p in (root / "state").rglob("pareto.png")}
    figures = {p: data for p, data in figures.items() if base64.b64encode(data) in before}
    assert figures, "the page embeds none of the state folder's pareto.png files"
    (old_png,) = set(figures.values())
    new_png = _png((200, 30, 60))
    assert new_png != old_png and base64.b64encode(new_png) not in before
    try:
        for path in figures:
            path.write_bytes(new_png)
        report.unlink()  # a rebuild that writes nothing must not pass on the nightly's own copy
        env = {**os.environ, "PROMPTDISTILL_STATE_DIR": str(root / "state"),
               "PROMPTDISTILL_REGISTRY": str(root / "registry")}
        out = subprocess.run([sys.executable, "-m", "promptdistill", "report"], cwd=root, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert Path(out.stdout.strip()) == report
        assert report.is_file(), "promptdistill report did not write the page"
        rebuilt = report.read_bytes()
    finally:  # the session's nightly stays as it ran, for any test after this one
        for path, data in figures.items():
            path.write_bytes(data)
        report.write_bytes(before)
    assert base64.b64encode(old_png) not in rebuilt, "the rebuilt page still shows the old figure"
    assert rebuilt == before.replace(base64.b64encode(old_png), base64.b64encode(new_png))
    print(f"night report: {len(before) / 1024:.0f} KiB")
