"""What keeps other web pages from driving `mt serve` and its page from running anything but
its own code: the Host allow-list (DNS rebinding) and the page's Content Security Policy."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

from mt.serve.requests import error

# the Host names a server bound to a loopback address answers to
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class HostCheck:
    """Refuses (421) a request whose Host header is not one of `names` (any port): a page of
    another site that a DNS name was pointed at this server (DNS rebinding) cannot read it."""

    def __init__(self, app: Any, names: tuple[str, ...]) -> None:
        self.app, self.names = app, {n.lower() for n in names}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
            name = re.sub(r":\d*$", "", host).strip("[]") if host else ""
            if name not in self.names:  # (no name, or an empty one, is no name of this server)
                shown = host[:60]
                response = error(
                    421,
                    f"Host {shown!r} is not a name of this server; start mt "
                    f"serve with --allowed-host {shown.split(':')[0]!r} to allow it",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class OneFraming:
    """Refuses (400, and closes the connection) a request that frames its body twice, with
    Content-Length and Transfer-Encoding both, on every path and before any other check: a
    proxy that reads the other header would take the rest of the bytes for a request of its
    own, hidden from it (request smuggling; RFC 9112 section 6.1: close after answering)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            if b"content-length" in names and b"transfer-encoding" in names:
                said = "Content-Length and Transfer-Encoding given together: send one"
                response = error(400, said, "Content-Length", Connection="close")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def page_policy(html: str) -> str:
    """The page's Content Security Policy: its own inline script and style (by their hashes),
    requests to this server, nothing from elsewhere, no framing."""

    def hashes(tag: str) -> str:
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
        digests = [hashlib.sha256(body.encode()).digest() for body in found]
        return " ".join(f"'sha256-{base64.b64encode(d).decode()}'" for d in digests)

    return (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
