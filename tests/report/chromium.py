"""A small headless-Chromium driver for page tests: the DevTools protocol over ``--remote-debugging-pipe``.

No websocket library and no browser download: Debian's ``chromium`` is started with the DevTools pipe on file
descriptors 3 (commands in) and 4 (events out), NUL-separated JSON. :meth:`Browser.open` loads a page and
returns what it saw: console messages, uncaught exceptions, failed or blocked requests, every URL requested,
and lets the test evaluate JavaScript and take screenshots.

``offline=True`` starts Chromium without network: inside a fresh network namespace (``unshare -n``) where
that is allowed, and in any case behind an unreachable proxy with the DevTools network emulation offline.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--disable-default-apps", "--mute-audio", "--hide-scrollbars", "--allow-file-access-from-files"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def can_unshare_network() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@dataclass
class PageLog:
    """What one page load produced."""

    url: str
    console: list[dict[str, Any]] = field(default_factory=list)  # {"type", "text"}
    exceptions: list[str] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)  # {"url", "error"}
    requests: list[str] = field(default_factory=list)
    log_entries: list[dict[str, Any]] = field(default_factory=list)  # Log domain: {"level", "text", "url"}

    def errors(self) -> list[str]:
        """Everything that should fail a page test: console errors, exceptions, failed loads, error logs."""
        out = [f"console.{c['type']}: {c['text']}" for c in self.console if c["type"] in ("error", "assert")]
        out += [f"exception: {e}" for e in self.exceptions]
        out += [f"failed request {f['url']}: {f['error']}" for f in self.failed]
        out += [f"log {e['level']}: {e['text']} ({e.get('url', '')})" for e in self.log_entries
                if e["level"] == "error"]
        return out

    def external_requests(self) -> list[str]:
        return [u for u in self.requests if not u.startswith(("file:", "data:", "about:", "blob:"))]


class Browser:
    """One headless Chromium process with a fresh profile; use as a context manager."""

    def __init__(self, *, offline: bool = False, width: int = 1280, height: int = 900, timeout: float = 60.0) -> None:
        exe = chromium_path()
        if exe is None:
            raise RuntimeError("chromium is not installed (make chromium)")
        self.offline = offline
        self.timeout = timeout
        self.width, self.height = width, height
        self.profile = tempfile.mkdtemp(prefix="attune-chromium-")
        self.netns = offline and can_unshare_network()
        cmd = [exe, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
               f"--window-size={width},{height}"]
        if offline:
            cmd += ["--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]
        if self.netns:
            cmd = ["unshare", "-n", *cmd]
        cmd.append("about:blank")
        to_r, self._to_w = os.pipe()  # we write commands → chromium reads fd 3
        self._from_r, from_w = os.pipe()  # chromium writes fd 4 → we read
        env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": "disabled:", "HOME": self.profile}

        def fds() -> None:  # runs in the child before exec: the pipe ends become fds 3 and 4
            a = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.stderr = open(Path(self.profile) / "stderr.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
                                     preexec_fn=fds, pass_fds=(3, 4), env=env, start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self._events: list[dict[str, Any]] = []
        self.session: str | None = None
        self.target: str | None = None

    # -- protocol --------------------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from chromium over the DevTools pipe")
            r, _, _ = select.select([self._from_r], [], [], min(left, 1.0))
            if not r:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"chromium exited ({self.proc.returncode}): {self.stderr_text()[-2000:]}")
                continue
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the DevTools pipe: {self.stderr_text()[-2000:]}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg: dict[str, Any] = json.loads(raw)
        return msg

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: bool = True,
             timeout: float | None = None) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                result: dict[str, Any] = m.get("result", {})
                return result
            self._events.append(m)

    def wait_event(self, method: str, timeout: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for i, e in enumerate(self._events):
                if e.get("method") == method:
                    return self._events.pop(i)
            self._events.append(self._read_message(deadline))

    def drain(self, seconds: float) -> None:
        """Collect events for ``seconds`` (late console messages, failed loads)."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                self._events.append(self._read_message(deadline))
            except TimeoutError:
                return

    # -- pages -----------------------------------------------------------------------------------------
    def open(self, url: str, *, settle: float = 0.5) -> PageLog:
        """Load ``url`` in a new tab and wait for its load event; the tab stays current for evaluate/screenshot."""
        if self.target is not None:  # one tab at a time
            self.send("Target.closeTarget", {"targetId": self.target}, session=False)
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.target = target
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        if self.offline:
            self.send("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1,
                                                           "uploadThroughput": -1})
        self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False})
        self._events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")
        self.drain(settle)
        return self._collect(url)

    def _collect(self, url: str) -> PageLog:
        page = PageLog(url=url)
        urls: dict[str, str] = {}
        for e in self._events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                page.console.append({"type": p.get("type"), "text": text})
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                page.exceptions.append(str(d.get("exception", {}).get("description") or d.get("text")))
            elif m == "Network.requestWillBeSent":
                urls[p.get("requestId", "")] = p.get("request", {}).get("url", "")
                page.requests.append(urls[p.get("requestId", "")])
            elif m == "Network.loadingFailed":
                page.failed.append({"url": urls.get(p.get("requestId", ""), p.get("requestId")),
                                    "error": p.get("errorText") or p.get("blockedReason")})
            elif m == "Log.entryAdded":
                entry = p.get("entry", {})
                page.log_entries.append({"level": entry.get("level"), "text": entry.get("text"),
                                         "url": entry.get("url", "")})
        self._events.clear()
        return page

    def evaluate(self, expression: str) -> Any:
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"evaluate failed: {res['exceptionDetails']}")
        return res.get("result", {}).get("value")

    def screenshot(self, path: str | Path, *, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": self.width, "height": min(size["height"], 12000), "scale": 1}
        data = self.send("Page.captureScreenshot", params)["data"]
        out = Path(path)
        out.write_bytes(base64.b64decode(data))
        return out

    def stderr_text(self) -> str:
        try:
            return (Path(self.profile) / "stderr.log").read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.send("Browser.close", session=False, timeout=5)
                except (RuntimeError, TimeoutError, OSError):
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, 9)
                    self.proc.wait(timeout=10)
        finally:
            for fd in (self._to_w, self._from_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.stderr.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
