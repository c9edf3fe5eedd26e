"""`mt serve`: a translation server with a web page (mt/serve/)."""

from __future__ import annotations

import signal
from pathlib import Path

import typer

from mt.cli.app import _check_device, _err, command
from mt.errors import MTError


@command("serve")
def serve_cmd(
    models: list[Path] = typer.Argument(
        ..., help="run directory (best.pt, else last.pt) or checkpoint; several: an ensemble"
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: all)"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda"),
    precision: str = typer.Option("auto", "--precision", help="auto, fp32, bf16 or fp16"),
    threads: int = typer.Option(0, "--threads", min=0, help="CPU threads (0: the free cores)"),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="MT_API_KEY",
        help="require this token (Authorization: Bearer KEY or X-API-Key) for /translate and /info",
        show_envvar=True,
    ),
    max_sentences: int = typer.Option(64, "--max-sentences", min=1, help="per request"),
    max_chars: int = typer.Option(1000, "--max-chars", min=1, help="per sentence"),
    max_body: int = typer.Option(1 << 20, "--max-body", min=64, help="bytes per request"),
    timeout: float = typer.Option(
        30.0, "--timeout", min=0.1, help="seconds a request may wait for its translations"
    ),
    max_queue: int = typer.Option(
        256, "--max-queue", min=1, help="requests waiting at most; beyond, 429 at once"
    ),
    batch_tokens: int = typer.Option(
        4000, "--batch-tokens", min=1, help="source words that one batch of requests may hold"
    ),
    max_wait_ms: float = typer.Option(
        5.0, "--max-wait-ms", min=0.0, help="how long a batch waits for more requests"
    ),
    batching: bool = typer.Option(
        True, "--batching/--no-batching", help="decode requests together (off: one at a time)"
    ),
):
    """Serve translations over HTTP, with a web page that shows the cross-attention.

    POST /translate {"sentences": [...], "beam": 5, ...}; GET /info, GET /health; the page at /;
    the API's schema at /openapi.json. Stop with Ctrl-C or SIGTERM: the requests in flight are
    answered first.

    Example: mt serve runs/multi30k_de_en --port 8000
    """
    try:
        import uvicorn

        from mt.serve.app import Limits, create_app
    except ImportError as e:
        raise MTError(f"mt serve needs FastAPI and uvicorn ({e.name} is missing): "
                      "pip install 'mt[serve]'") from None  # fmt: skip
    from mt.artifacts import checkpoint
    from mt.decode.translator import Translator
    from mt.runtime.threads import choose_threads
    from mt.serve.batcher import Batcher
    from mt.serve.decoding import decode_batch, model_info

    _check_device(device)
    paths = [checkpoint.resolve(m) for m in models]
    choose_threads(threads, _err)
    _check_address(host, port)
    translator = Translator.load(paths, device, precision)
    info = model_info(translator, [checkpoint.load(p) for p in paths], paths)
    batcher = Batcher(
        lambda sentences, settings: decode_batch(translator, sentences, settings),
        max_tokens=batch_tokens,
        max_wait=max_wait_ms / 1000,
        max_queue=max_queue,
        batching=batching,
    )
    app = create_app(
        translator, info, batcher, Limits(max_sentences, max_chars, max_body, timeout), api_key
    )
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=int(timeout) + 1
    )
    server = uvicorn.Server(config)
    _err(translator.describe(paths, translator.options()))
    _err(
        f"serving {info['source_language']}->{info['target_language']} on "
        f"http://{host}:{port}/ (batching {'on' if batching else 'off'}"
        f"{', API key required' if api_key else ''}); Ctrl-C or SIGTERM stops it"
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
        batcher.close(timeout)
    _err(f"stopped: {batcher.decoded} requests answered in {batcher.batches} batches")


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
