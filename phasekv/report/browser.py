"""Drive a headless Chromium over the Chrome DevTools protocol with the Python standard library only:
load a report, collect console errors, click elements, take screenshots (used by the browser test and
`phasekv report --screenshot`).

The DevTools websocket is spoken directly (RFC 6455 client frames are masked; messages are JSON).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from phasekv.errors import ConfigError
from phasekv.io import write_bytes

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                "--mute-audio", "--disable-dev-shm-usage"]
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    env = os.environ.get("PHASEKV_CHROMIUM")
    if env:
        return env
    return next((p for c in CANDIDATES if (p := shutil.which(c))), None)


class WebSocket:
    """Minimal blocking websocket client (text frames, client masking, fragmented messages)."""

    def __init__(self, url: str, timeout: float = 30.0):
        m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
        if not m:
            raise ConfigError(f"bad DevTools websocket URL {url!r}")
        host, port, path = m.group(1), int(m.group(2)), m.group(3)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the connection during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {head[:80]!r}")
        self.buf = head.split(b"\r\n\r\n", 1)[1]

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("DevTools connection closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, text: str) -> None:
        payload = text.encode()
        n = len(payload)
        head = bytes([0x81])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self) -> str:
        parts = []
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            data = self._read(n)  # server frames are not masked
            op = b0 & 0x0F
            if op == 0x8:
                raise ConnectionError("DevTools closed the websocket")
            if op in (0x9, 0xA):  # ping/pong: ignore
                continue
            parts.append(data)
            if b0 & 0x80:
                return b"".join(parts).decode()

    def close(self) -> None:
        self.sock.close()


class Browser:
    """A headless Chromium with one page, driven over DevTools. Use as a context manager."""

    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 30.0):
        exe = find_chromium()
        if exe is None:
            raise ConfigError("no Chromium found (install Debian's `chromium`, or set PHASEKV_CHROMIUM)")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="phasekv-chromium-")
        self.proc = subprocess.Popen(
            [exe, *CHROME_FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.ws = None
        self.next_id = 0
        self.events: list[dict] = []
        try:
            port = self._devtools_port()
            # keep draining stderr so a chatty browser never blocks on a full pipe
            threading.Thread(target=self.proc.stderr.read, daemon=True).start()
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout).read())
            page = next(t for t in targets if t.get("type") == "page")
            self.ws = WebSocket(page["webSocketDebuggerUrl"], timeout=timeout)
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable")
            self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                      mobile=False)
        except BaseException:
            self.close()
            raise

    def _devtools_port(self) -> int:
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise ConnectionError(f"chromium exited with code {self.proc.returncode} before DevTools started")
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line or "")
            if m:
                return int(m.group(1))
        raise TimeoutError("chromium's DevTools did not start in time")

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str, timeout: float | None = None) -> dict:
        deadline = time.time() + (timeout or self.timeout)
        seen = len(self.events)
        for ev in self.events:
            if ev["method"] == method:
                return ev
        while time.time() < deadline:
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return msg
        raise TimeoutError(f"no {method} within the timeout ({len(self.events) - seen} other events)")

    def open(self, path: str | os.PathLike) -> None:
        self.events.clear()
        self.call("Page.navigate", url=Path(path).resolve().as_uri())
        self.wait_event("Page.loadEventFired")

    def eval(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed + released) at the centre of the first element matching `selector`."""
        rect = self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                         " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                         " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        if rect is None:
            raise LookupError(f"no element matches {selector!r}")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=rect[0], y=rect[1], button="left", clickCount=1)

    def screenshot(self, path: str | os.PathLike, full_page: bool = False) -> Path:
        params = {"format": "png"}
        if full_page:
            h = self.eval("document.documentElement.scrollHeight")
            params |= {"captureBeyondViewport": True,
                       "clip": {"x": 0, "y": 0, "width": self.eval("document.documentElement.clientWidth"),
                                "height": h, "scale": 1}}
        data = self.call("Page.captureScreenshot", **params)["data"]
        return write_bytes(path, base64.b64decode(data))

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads seen since the last `open`."""
        out = []
        for ev in self.events:
            p = ev.get("params", {})
            if ev["method"] == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
            elif ev["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif ev["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", "log error"))
        return out

    def close(self) -> None:
        try:
            if self.ws is not None:
                self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def screenshot_report(index: str | os.PathLike, out: str | os.PathLike, select: str | None = None,
                      anchor: str = "lookup", width: int = 1280, height: int = 900) -> Path:
    """Open a rendered report, optionally click a model in the selector, scroll to a section, save a PNG."""
    with Browser(width=width, height=height) as b:
        b.open(index)
        deadline = time.time() + 30
        while time.time() < deadline and not b.eval(
                "[...document.querySelectorAll('.pkv-plot')].every(d => d.querySelector('.main-svg'))"):
            time.sleep(0.1)
        if select:
            b.click(f'#model-selector button[data-model="{select}"]')
            time.sleep(0.5)
        b.eval(f"document.getElementById({json.dumps(anchor)}).scrollIntoView()")
        time.sleep(0.3)
        errors = b.console_errors()
        if errors:
            raise RuntimeError(f"the report logged errors in the browser: {errors[:3]}")
        return b.screenshot(out)
