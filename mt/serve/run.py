"""`mt serve` below its command line: the flags checked before any model loads (the API key,
the CORS origins, the address), the models loaded with their decoding workers, and uvicorn run
until a signal, the requests in flight answered and the workers closed."""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mt.errors import MTError


@dataclass(frozen=True)
class ServeOptions:
    """`mt serve`'s flags (mt/cli/serve.py declares and explains them)."""

    models: list[Path] | None
    model: list[str]
    host: str
    port: int
    device: str
    precision: str
    threads: int
    api_key: str | None
    max_sentences: int
    max_chars: int
    max_body: int
    timeout: float
    max_queue: int
    batch_tokens: int
    max_wait_ms: float
    batching: bool
    max_cost: int
    max_attention_cells: int
    max_connections: int
    header_timeout: float
    body_timeout: float
    keep_alive: float
    allowed_host: list[str]
    cors_origin: list[str]
    access_log: bool
    forwarded_allow_ips: str | None


def serve(o: ServeOptions, say: Callable[[str], None]) -> None:
    """Check the flags, load the models, serve until Ctrl-C or SIGTERM; say: the one-line
    notes on stderr."""
    from mt.runtime.threads import choose_threads
    from mt.serve.app import Limits, create_app

    check_api_key(o.api_key if o.api_key is not None else os.environ.get("MT_API_KEY"))
    check_origins(o.cors_origin)
    specs = model_specs(o.models or [], o.model)
    choose_threads(o.threads, say)
    check_address(o.host, o.port)
    batching = {
        "max_tokens": o.batch_tokens,
        "max_wait": o.max_wait_ms / 1000,
        "max_queue": o.max_queue,
        "batching": o.batching,
    }
    served = [load(name, paths, o.device, o.precision, batching, say) for name, paths in specs]
    limits = Limits(
        o.max_sentences, o.max_chars, o.max_body, o.timeout, o.max_cost, o.max_attention_cells
    )
    hosts = allowed_hosts(o.host, o.allowed_host)
    log = access_log() if o.access_log else (lambda line: None)
    app = create_app(served, limits, o.api_key, hosts, tuple(o.cors_origin), log)
    names = ", ".join(
        f"{m.name} ({m.info['source_language']}->{m.info['target_language']})" for m in served
    )
    say(
        f"serving {names} on http://{o.host}:{o.port}/ (batching {'on' if o.batching else 'off'}"
        f"{', API key required' if o.api_key else ', no API key: open to any client'}"
        f"{'; any Host name accepted (--allowed-host limits them)' if hosts is None else ''}"
        f"); Ctrl-C or SIGTERM stops it"
    )
    run(app, served, o, say)
    say(
        f"stopped: {sum(m.batcher.decoded for m in served)} requests answered in "
        f"{sum(m.batcher.batches for m in served)} batches"
    )


def run(app, served: list, o: ServeOptions, say: Callable[[str], None]) -> None:
    """uvicorn serving `app` until a signal; then the models' workers closed."""
    import uvicorn

    from mt.serve.connections import guarded

    config = uvicorn.Config(
        app,
        host=o.host,
        port=o.port,
        log_level="warning",
        timeout_graceful_shutdown=int(o.timeout) + 1,
        timeout_keep_alive=int(o.keep_alive),
        http=guarded(
            o.header_timeout,
            o.body_timeout,
            within_open_files(o.max_connections, say),
            app.state.door,
        ),
        # uvicorn trusts X-Forwarded-For from loopback by default: off, unless proxies are named
        proxy_headers=o.forwarded_allow_ips is not None,
        forwarded_allow_ips=o.forwarded_allow_ips or "",
    )
    server = uvicorn.Server(config)
    # uvicorn handles SIGINT and SIGTERM itself (it stops taking connections and answers the
    # requests in flight), then raises the signal again to the handler found before it: ignored
    # here, so a server that stopped as asked exits 0.
    before = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    except SystemExit:  # uvicorn could not start (it has logged why)
        raise MTError(
            f"could not serve on {o.host}:{o.port}; choose another --port or --host"
        ) from None
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        for m in served:
            m.batcher.close(o.timeout)


def check_origins(origins: list[str]) -> None:
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise MTError(
                f"--cors-origin {origin!r}: give a site as browsers name it, "
                "scheme and host without a path (https://app.example.org)"
            )


def model_specs(paths: list[Path], given: list[str]) -> list[tuple[str, list[Path]]]:
    """(name, checkpoints) of each model to serve: the positional paths are one (an ensemble
    when several), named after the first one's folder; --model NAME=PATH adds PATH to NAME."""
    from mt.artifacts import checkpoint

    specs: dict[str, list[Path]] = {}
    for spec in given:
        name, sep, path = spec.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name) or not path.strip():
            raise MTError(
                f"--model {spec!r}: give NAME=PATH, a name of letters, digits, '.', "
                "'_' or '-' (--model de_en=runs/de_en)"
            )
        specs.setdefault(name, []).extend(checkpoint.resolve_all([path]))
    if paths:
        resolved = checkpoint.resolve_all(paths)
        first = Path(paths[0])  # (a run of several members: named after its own folder)
        name = (first if first.is_dir() else resolved[0].parent).name or "model"
        if name in specs:
            raise MTError(
                f"the model {paths[0]} would be named {name!r}, which a --model names "
                f"too: serve it as --model OTHER={paths[0]}"
            )
        specs = {name: resolved, **specs}
    if not specs:
        raise MTError("give a model: mt serve RUN_DIR, or --model NAME=RUN_DIR")
    return list(specs.items())


def load(name: str, paths: list[Path], device: str, precision: str, batching: dict, say):
    """A model to serve: its translator, what /info says of it and its decoding worker."""
    from mt.artifacts import checkpoint
    from mt.decode.translator import Translator
    from mt.serve.app import Served
    from mt.serve.batcher import Batcher
    from mt.serve.decoding import decode_batch, model_info

    translator = Translator.load(paths, device, precision)
    translator.repeats = math.inf  # a server's job has no end: a compile always pays
    info = model_info(translator, [checkpoint.load(p) for p in paths], paths)
    say(f"{name}: {translator.describe(paths, translator.options())}")

    def decode(sentences, settings, stopped):
        return decode_batch(translator, sentences, settings, stopped)

    return Served(name, translator, info, Batcher(decode, **batching))


def access_log():
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


def check_api_key(key: str | None) -> None:
    """A key no client could send is refused before the server starts: an empty one (an unset
    "$KEY", MT_API_KEY="", which the flag's parser reads as no variable at all, so the caller
    passes the variable itself) would serve without a key in silence, and one that is not
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


def allowed_hosts(host: str, given: list[str]) -> tuple[str, ...] | None:
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


def within_open_files(max_connections: int, say: Callable[[str], None]) -> int:
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
        say(f"--max-connections {max_connections}: {room} (this process may open {soft} files)")
        return room
    return max_connections


def check_address(host: str, port: int) -> None:
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
            raise MTError(
                f"--host {host} --port {port}: cannot listen there ({e.strerror}); "
                "choose another --port"
            ) from None
