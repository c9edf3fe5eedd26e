"""`mt serve`: a translation server with a web page (mt/serve/)."""

from __future__ import annotations

import contextlib
import math
import re
import signal
from pathlib import Path

import typer

from mt.cli.app import _check_device, _err, command
from mt.errors import MTError


@command("serve")
def serve_cmd(
    models: list[Path] = typer.Argument(
        None,
        help="run directory (best.pt, else last.pt) or checkpoint; several: an ensemble "
        "(named after the first one's folder)",
    ),
    model: list[str] = typer.Option(
        [],
        "--model",
        help='NAME=PATH: a model requests choose by name ("model": NAME); repeat for '
        "several models, or with the same NAME for an ensemble",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: all)"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda"),
    precision: str = typer.Option("auto", "--precision", help="auto, fp32, bf16 or fp16"),
    threads: int = typer.Option(
        0, "--threads", min=0, max=1 << 20, help="CPU threads (0: the free cores)"
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="MT_API_KEY",
        help="require this token (Authorization: Bearer KEY or X-API-Key) for /translate and /info",
        show_envvar=True,
    ),
    max_sentences: int = typer.Option(
        64, "--max-sentences", min=1, max=1 << 20, help="per request"
    ),
    max_chars: int = typer.Option(1000, "--max-chars", min=1, max=1 << 24, help="per sentence"),
    max_body: int = typer.Option(
        1 << 20, "--max-body", min=64, max=1 << 31, help="bytes per request"
    ),
    timeout: float = typer.Option(
        30.0,
        "--timeout",
        min=0.1,
        max=86400.0,
        help="seconds a request may wait for its translations",
    ),
    max_queue: int = typer.Option(
        256, "--max-queue", min=1, max=1 << 20, help="requests waiting at most; beyond, 429 at once"
    ),
    batch_tokens: int = typer.Option(
        4000,
        "--batch-tokens",
        min=1,
        max=1 << 24,
        help="source words that one batch of requests may hold",
    ),
    max_wait_ms: float = typer.Option(
        5.0, "--max-wait-ms", min=0.0, max=60000.0, help="how long a batch waits for more requests"
    ),
    batching: bool = typer.Option(
        True, "--batching/--no-batching", help="decode requests together (off: one at a time)"
    ),
    max_cost: int = typer.Option(
        100_000,
        "--max-cost",
        min=1,
        max=1 << 40,
        help="per request: the beam x the decoding steps its sentences may take (each one's "
        "length limit, or the prefix), at most",
    ),
    max_attention_cells: int = typer.Option(
        500_000,
        "--max-attention-cells",
        min=1,
        max=1 << 31,
        help="per request: the attention weights it may ask for (layers x heads x target x "
        "source, summed)",
    ),
    max_connections: int = typer.Option(
        1000,
        "--max-connections",
        min=1,
        max=1 << 20,
        help="open at most; one more closes the one waiting longest for its request",
    ),
    header_timeout: float = typer.Option(
        10.0,
        "--header-timeout",
        min=0.1,
        max=3600.0,
        help="seconds a connection may take to send its request headers",
    ),
    body_timeout: float = typer.Option(
        30.0,
        "--body-timeout",
        min=0.1,
        max=3600.0,
        help="seconds a request may take to send its body, and an answer to be read",
    ),
    keep_alive: float = typer.Option(
        5.0,
        "--keep-alive",
        min=0.0,
        max=3600.0,
        help="seconds an idle connection is kept open between requests",
    ),
    allowed_host: list[str] = typer.Option(
        [],
        "--allowed-host",
        help="a name clients reach the server by (the Host header); repeat for several. "
        "Default: localhost names on a loopback --host, any name otherwise",
    ),
    cors_origin: list[str] = typer.Option(
        [],
        "--cors-origin",
        help="a site whose web pages may call the API (https://example.org); repeat for "
        "several. Default: none",
    ),
    access_log: bool = typer.Option(
        True, "--access-log/--no-access-log", help="a line on stderr per request"
    ),
    forwarded_allow_ips: str | None = typer.Option(
        None,
        "--forwarded-allow-ips",
        help="the proxies (comma-separated addresses) whose X-Forwarded-For and "
        "X-Forwarded-Proto name the client; default: none, the connection's own address is "
        "the client (a client cannot name itself in the log)",
    ),
):
    """Serve translations over HTTP, with a web page that shows the cross-attention.

    POST /translate {"sentences": [...], "beam": 5, ...}; GET /models, /info, /health,
    /metrics; the page at /; the API's schema at /openapi.json. Stop with Ctrl-C or SIGTERM:
    the requests in flight are answered first.

    Examples: mt serve runs/multi30k_de_en --port 8000
              mt serve --model de_en=runs/de_en --model en_de=runs/en_de
    """
    try:
        import prometheus_client  # noqa: F401
        import uvicorn

        from mt.serve.app import Limits, create_app
    except ImportError as e:
        raise MTError(f"mt serve needs FastAPI, uvicorn and prometheus_client ({e.name} is "
                      "missing): pip install 'mt[serve]'") from None  # fmt: skip
    from mt.runtime.threads import choose_threads
    from mt.serve.connections import guarded

    _check_device(device)
    _check_api_key(api_key)
    specs = _model_specs(models or [], model)
    choose_threads(threads, _err)
    _check_address(host, port)
    for origin in cors_origin:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise MTError(f"--cors-origin {origin!r}: give a site as browsers name it, "
                          "scheme and host without a path (https://app.example.org)")  # fmt: skip
    batching_flags = {"max_tokens": batch_tokens, "max_wait": max_wait_ms / 1000,
                      "max_queue": max_queue, "batching": batching}  # fmt: skip
    served = [_load(name, paths, device, precision, batching_flags) for name, paths in specs]
    limits = Limits(max_sentences, max_chars, max_body, timeout, max_cost, max_attention_cells)
    hosts = _allowed_hosts(host, allowed_host)
    log = _access_log() if access_log else (lambda line: None)
    app = create_app(served, limits, api_key, hosts, tuple(cors_origin), log)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=int(timeout) + 1,
        timeout_keep_alive=int(keep_alive),
        http=guarded(header_timeout, body_timeout, _within_open_files(max_connections)),
        # uvicorn trusts X-Forwarded-For from loopback by default: off, unless proxies are named
        proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips or "",
    )
    server = uvicorn.Server(config)
    names = ", ".join(f"{m.name} ({m.info['source_language']}->{m.info['target_language']})"
                      for m in served)  # fmt: skip
    _err(
        f"serving {names} on http://{host}:{port}/ (batching {'on' if batching else 'off'}"
        f"{', API key required' if api_key else ''}"
        f"{'; any Host name accepted (--allowed-host limits them)' if hosts is None else ''}"
        f"); Ctrl-C or SIGTERM stops it"
    )
    # uvicorn handles SIGINT and SIGTERM itself (it stops taking connections and answers the
    # requests in flight), then raises the signal again to the handler found before it: ignored
    # here, so a server that stopped as asked exits 0.
    before = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    except SystemExit:  # uvicorn could not start (it has logged why)
        raise MTError(
            f"could not serve on {host}:{port}; choose another --port or --host"
        ) from None
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        for m in served:
            m.batcher.close(timeout)
    decoded = sum(m.batcher.decoded for m in served)
    _err(f"stopped: {decoded} requests answered in {sum(m.batcher.batches for m in served)} "
         f"batches")  # fmt: skip


def _model_specs(paths: list[Path], given: list[str]) -> list[tuple[str, list[Path]]]:
    """(name, checkpoints) of each model to serve: the positional paths are one (an ensemble
    when several), named after the first one's folder; --model NAME=PATH adds PATH to NAME."""
    from mt.artifacts import checkpoint

    specs: dict[str, list[Path]] = {}
    for spec in given:
        name, sep, path = spec.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name) or not path.strip():
            raise MTError(f"--model {spec!r}: give NAME=PATH, a name of letters, digits, '.', "
                          "'_' or '-' (--model de_en=runs/de_en)")  # fmt: skip
        specs.setdefault(name, []).append(checkpoint.resolve(path))
    if paths:
        resolved = [checkpoint.resolve(p) for p in paths]
        name = resolved[0].parent.name or "model"
        if name in specs:
            raise MTError(f"the model {paths[0]} would be named {name!r}, which a --model names "
                          f"too: serve it as --model OTHER={paths[0]}")  # fmt: skip
        specs = {name: resolved, **specs}
    if not specs:
        raise MTError("give a model: mt serve RUN_DIR, or --model NAME=RUN_DIR")
    return list(specs.items())


def _load(name: str, paths: list[Path], device: str, precision: str, batching: dict):
    """A model to serve: its translator, what /info says of it and its decoding worker."""
    from mt.artifacts import checkpoint
    from mt.decode.translator import Translator
    from mt.serve.app import Served
    from mt.serve.batcher import Batcher
    from mt.serve.decoding import decode_batch, model_info

    translator = Translator.load(paths, device, precision)
    translator.repeats = math.inf  # a server's job has no end: a compile always pays
    info = model_info(translator, [checkpoint.load(p) for p in paths], paths)
    _err(f"{name}: {translator.describe(paths, translator.options())}")

    def decode(sentences, settings, stopped):
        return decode_batch(translator, sentences, settings, stopped)

    return Served(name, translator, info, Batcher(decode, **batching))


def _access_log():
    """The access log: a line per request on stderr, after the time."""
    import logging
    import sys

    from mt.serve.observe import ACCESS_LOG

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    ACCESS_LOG.addHandler(handler)
    ACCESS_LOG.setLevel(logging.INFO)
    ACCESS_LOG.propagate = False
    return ACCESS_LOG.info


def _check_api_key(key: str | None) -> None:
    """A key no client could send is refused before the server starts: an empty one (an unset
    "$KEY", MT_API_KEY="") would serve without a key in silence, and one that is not
    printable ASCII cannot travel in an HTTP header."""
    if key is None:
        return
    if not key.strip():
        raise MTError(
            "the API key (--api-key or MT_API_KEY) is empty: give a key, or leave both unset "
            "to serve without one"
        )
    if not (key.isascii() and key.isprintable()) or key != key.strip():
        raise MTError(
            "the API key (--api-key or MT_API_KEY) must be printable ASCII without spaces at "
            "its ends: an HTTP header carries it, and no client could send this one"
        )


def _allowed_hosts(host: str, given: list[str]) -> tuple[str, ...] | None:
    """The Host names the server answers to: localhost's on a loopback address, with those
    given; on another address those given, else any (None)."""
    import ipaddress

    from mt.serve.app import LOOPBACK_NAMES

    names = tuple(name.strip().lower().strip("[]") for name in given if name.strip())
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return LOOPBACK_NAMES + names
    return names or None


def _within_open_files(max_connections: int) -> int:
    """--max-connections, within the open files the process may have (raised to the hard
    limit): past that limit, accepting fails in a loop and every client is refused."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    room = max_connections if soft == resource.RLIM_INFINITY else max(int(soft) - 64, 1)
    if max_connections > room:
        _err(f"--max-connections {max_connections}: {room} (this process may open {soft} files)")
        return room
    return max_connections


def _check_address(host: str, port: int) -> None:
    """Refuse, in one line, an address the server could not listen on, before loading a model."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise MTError(f"--host {host}: not an address of this machine ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            raise MTError(f"--host {host} --port {port}: cannot listen there ({e.strerror}); "
                          "choose another --port") from None  # fmt: skip
