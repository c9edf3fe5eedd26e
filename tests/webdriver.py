"""A few calls of the W3C WebDriver protocol, spoken to Debian's `chromedriver` over HTTP: enough
for a browser test to load a page, type, click, read the page and take a screenshot, with no
client library (selenium's pulls in an async stack the test suite does not need)."""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the protocol's key for an element reference
NEW_BROWSER = "/session"  # the protocol's endpoint that starts a browser (W3C "New Session")


def find_browser() -> tuple[str, str] | None:
    """(chromedriver, chromium) paths, or None where either is not installed."""
    driver = shutil.which("chromedriver")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    return (driver, browser) if driver and browser else None


class Browser:
    """One headless Chromium, driven over the W3C WebDriver protocol."""

    def __init__(self, driver: str, browser: str, port: int) -> None:
        self.proc = subprocess.Popen(
            [driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        for _ in range(100):
            try:
                self.http.get("/status")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        caps = {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": browser,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--window-size=1400,1000",
                ],
            },
        }
        answer = self._call("POST", NEW_BROWSER, {"capabilities": {"alwaysMatch": caps}})
        self.browser = f"{NEW_BROWSER}/{answer['sessionId']}"  # every later call's prefix

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        r = self.http.request(method, path, json=body if method == "POST" else None)
        value = r.json().get("value")
        if r.status_code >= 400:
            raise RuntimeError(f"webdriver {method} {path}: {value}")
        return value

    def go(self, url: str) -> None:
        self._call("POST", f"{self.browser}/url", {"url": url})

    def find(self, css: str) -> str:
        found = self._call(
            "POST", f"{self.browser}/element", {"using": "css selector", "value": css}
        )
        return str(found[ELEMENT])

    def type(self, css: str, text: str) -> None:
        self._call("POST", f"{self.browser}/element/{self.find(css)}/value", {"text": text})

    def click(self, css: str) -> None:
        self._call("POST", f"{self.browser}/element/{self.find(css)}/click", {})

    def script(self, code: str) -> Any:
        return self._call("POST", f"{self.browser}/execute/sync", {"script": code, "args": []})

    def wait_for(self, code: str, timeout: float = 60.0) -> Any:
        """Until the JavaScript expression `code` is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.script(f"return {code};")
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(code)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self._call("GET", f"{self.browser}/screenshot")))

    def close(self) -> None:
        try:
            self._call("DELETE", self.browser)
        finally:
            self.proc.terminate()
            self.proc.wait(10)
            self.http.close()
