"""Headless Chromium driven over its DevTools pipe (``--remote-debugging-pipe``: JSON
messages ended by NUL on fds 3 and 4, no websocket library): open a page, wait until an
expression over its whole DOM (shadow roots included) holds, take a screenshot."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe", "--window-size=1400,900")  # fmt: skip
# Every text of the page, shadow roots included (TensorBoard's dashboards live in them).
PAGE_TEXT = """(() => {
  const parts = [];
  const walk = (root) => {
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) { walk(el.shadowRoot); }
      const shown = !['STYLE', 'SCRIPT', 'TEMPLATE'].includes(el.tagName);
      if (shown && !el.children.length && el.textContent) { parts.push(el.textContent.trim()); }
    }
  };
  walk(document);
  return parts.join('\\n');
})()"""


def binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class DevToolsError(RuntimeError):
    """Chromium's error answer to a command."""


class Browser:
    """One headless Chromium with a fresh profile in ``profile``; a context manager."""

    def __init__(self, profile: Path) -> None:
        exe = binary()
        if exe is None:
            raise FileNotFoundError("chromium (Debian's package: apt-get install chromium)")
        profile.mkdir(parents=True, exist_ok=True)
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        self.process = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=lambda: _fds(to_browser, from_browser),  # noqa: PLW1509
        )  # fmt: skip
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next = 0

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError, TimeoutError):
            self.send("Browser.close")
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._write)
        os.close(self._read)

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events on the way are dropped)."""
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            while b"\0" not in self._buffer:
                if not select.select([self._read], [], [], max(deadline - time.monotonic(), 0))[0]:
                    raise TimeoutError(method)
                chunk = os.read(self._read, 1 << 16)
                if not chunk:
                    raise OSError("chromium closed its DevTools pipe")
                self._buffer += chunk
            raw, _, self._buffer = self._buffer.partition(b"\0")
            answer = json.loads(raw)
            if answer.get("id") == self._next:
                if "error" in answer:
                    raise DevToolsError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer.get("result", {})
                return result
        raise TimeoutError(method)

    def open(self, url: str) -> str:
        """A new tab at ``url``; its session id."""
        target = self.send("Target.createTarget", url=url)["targetId"]
        session: str = self.send("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        return session

    def text(self, session: str) -> str:
        """The page's text so far ("" while it has no document to evaluate in yet)."""
        try:
            found = self.send("Runtime.evaluate", session, expression=PAGE_TEXT, returnByValue=True)
        except DevToolsError:
            return ""
        return str(found.get("result", {}).get("value", ""))

    def wait_for(self, session: str, words: list[str], within_s: float = 60.0) -> str:
        """The page's text once it holds every one of ``words``."""
        deadline = time.monotonic() + within_s
        text = ""
        while time.monotonic() < deadline:
            text = self.text(session)
            if all(word in text for word in words):
                return text
            time.sleep(0.5)
        missing = [w for w in words if w not in text]
        raise AssertionError(f"not on the page after {within_s} s: {missing}\n{text[:2000]}")

    def screenshot(self, session: str, out: Path) -> Path:
        data = self.send("Page.captureScreenshot", session, format="png")["data"]
        out.write_bytes(base64.b64decode(data))
        return out


def _fds(to_browser: int, from_browser: int) -> None:
    """In the child: Chromium reads commands on fd 3 and writes answers on fd 4 (both
    first moved above 10, lest one of them be 3 or 4 already)."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]
    os.dup2(high[0], 3)
    os.dup2(high[1], 4)
