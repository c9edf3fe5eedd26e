"""What every request of `mt serve` meets before its route: one framing of its body (no
request smuggling), HEAD as GET, the Host allow-list (DNS rebinding) and CORS, answered in
the API's JSON error shape; and the page's Content Security Policy, so that it runs nothing
but its own code."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

from starlette.middleware.cors import CORSMiddleware

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
            name = host_name(host)
            if name not in self.names:  # (no name, or an empty one, is no name of this server)
                fix = (
                    f"start mt serve with --allowed-host {name[:60]!r} to allow it"
                    if name
                    else "send the name the server is reached by (Host: 127.0.0.1, say)"
                )
                response = error(421, f"Host {host[:60]!r} is not a name of this server; {fix}")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def host_name(host: str) -> str:
    """The name a Host header gives, without its port: example.org:80 -> example.org,
    [::1]:8080 -> ::1, and a bare IPv6 address (::1) whole."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else ""
    if host.count(":") > 1:
        return host
    return host.partition(":")[0]


class HeadAsGet:
    """HEAD on a GET route answers as GET would, without the body (load balancers probe so)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def head_only(message: dict) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, head_only)


class Framing:
    """On every path and before any other check: refuses (400, and closes the connection) a
    request that frames its body twice, with Content-Length and Transfer-Encoding both (a
    proxy that reads the other header would take the rest of the bytes for a request of its
    own, hidden from it: request smuggling; RFC 9112 section 6.1: close after answering), and
    (417) an expectation other than 100-continue, which no route can meet."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            expect = dict(scope["headers"]).get(b"expect", b"100-continue").lower().strip()
            if b"content-length" in names and b"transfer-encoding" in names:
                said = "Content-Length and Transfer-Encoding given together: send one"
                response = error(400, said, "Content-Length", Connection="close")
            elif expect != b"100-continue":  # (RFC 9110 section 10.1.1: 417)
                said = f"Expect {expect.decode('latin-1')[:60]!r}: only 100-continue is met"
                response = error(417, said, "Expect")
            else:
                await self.app(scope, receive, send)
                return
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


class JsonCORS(CORSMiddleware):
    """Starlette's CORS, a refused preflight answered in the API's JSON error shape."""

    def preflight_response(self, request_headers: Any) -> Any:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        kept = {
            k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")
        }
        said = f"{bytes(response.body).decode()} (--cors-origin names the sites it serves)"
        return error(response.status_code, said, "Origin", **kept)
