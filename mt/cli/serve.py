"""`mt serve`: a translation server with a web page (mt/serve/). The flags are declared here,
one type each; what they do is mt/serve/run.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mt.cli.app import _check_device, _err, command
from mt.errors import MTError


def _flag(name: str, help: str = "", **bounds) -> typer.models.OptionInfo:
    return typer.Option(name, help=help, **bounds)


Models = Annotated[
    list[Path] | None,
    typer.Argument(
        help="run directory (best.pt, else last.pt) or checkpoint; several: an "
        "ensemble (named after the first one's folder)"
    ),
]
Named = Annotated[
    list[str],
    _flag(
        "--model",
        "NAME=PATH: a model requests choose by name "
        '("model": NAME); repeat for several models, or with the same NAME for an '
        "ensemble",
    ),
]
Host = Annotated[str, _flag("--host", "address to listen on (0.0.0.0: all)")]
Port = Annotated[int, _flag("--port", min=1, max=65535)]
Device = Annotated[str, _flag("--device", "auto, cpu or cuda")]
Precision = Annotated[str, _flag("--precision", "auto, fp32, bf16 or fp16")]
Threads = Annotated[int, _flag("--threads", "CPU threads (0: the free cores)", min=0, max=1 << 20)]
ApiKey = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="MT_API_KEY",
        show_envvar=True,
        help="require this token (Authorization: Bearer KEY or X-API-Key) for /translate and /info",
    ),
]
MaxSentences = Annotated[int, _flag("--max-sentences", "per request", min=1, max=1 << 20)]
MaxChars = Annotated[int, _flag("--max-chars", "per sentence", min=1, max=1 << 24)]
MaxBody = Annotated[int, _flag("--max-body", "bytes per request", min=64, max=1 << 31)]
Timeout = Annotated[
    float,
    _flag("--timeout", "seconds a request may wait for its translations", min=0.1, max=86400.0),
]
MaxQueue = Annotated[
    int, _flag("--max-queue", "requests waiting at most; beyond, 429 at once", min=1, max=1 << 20)
]
BatchTokens = Annotated[
    int,
    _flag("--batch-tokens", "source words that one batch of requests may hold", min=1, max=1 << 24),
]
MaxWait = Annotated[
    float, _flag("--max-wait-ms", "how long a batch waits for more requests", min=0.0, max=60000.0)
]
Batching = Annotated[
    bool, _flag("--batching/--no-batching", "decode requests together (off: one at a time)")
]
MaxCost = Annotated[
    int,
    _flag(
        "--max-cost",
        "per request: the beam x the work of the decoding steps its sentences may take (each "
        "one's length limit, or the prefix; a step with t outputs behind it counts 1 + t/32), "
        "at most",
        min=1,
        max=1 << 40,
    ),
]
MaxCells = Annotated[
    int,
    _flag(
        "--max-attention-cells",
        "per request: the attention weights it "
        "may ask for (layers x heads x target x source, summed)",
        min=1,
        max=1 << 31,
    ),
]
MaxConnections = Annotated[
    int,
    _flag(
        "--max-connections",
        "open at most; one more closes the one waiting longest for its request",
        min=1,
        max=1 << 20,
    ),
]
HeaderTimeout = Annotated[
    float,
    _flag(
        "--header-timeout",
        "seconds a connection may take to send its request headers",
        min=0.1,
        max=3600.0,
    ),
]
BodyTimeout = Annotated[
    float,
    _flag(
        "--body-timeout",
        "seconds a request may take to send its body, and an answer to be read",
        min=0.1,
        max=3600.0,
    ),
]
KeepAlive = Annotated[
    float,
    _flag(
        "--keep-alive",
        "seconds an idle connection is kept open between requests",
        min=0.0,
        max=3600.0,
    ),
]
AllowedHost = Annotated[
    list[str],
    _flag(
        "--allowed-host",
        "a name clients reach the server by "
        "(the Host header); repeat for several. Default: localhost names on a "
        "loopback --host, any name otherwise",
    ),
]
CorsOrigin = Annotated[
    list[str],
    _flag(
        "--cors-origin",
        "a site whose web pages may call the "
        "API (https://example.org); repeat for several. Default: none",
    ),
]
AccessLog = Annotated[bool, _flag("--access-log/--no-access-log", "a line on stderr per request")]
Forwarded = Annotated[
    str | None,
    _flag(
        "--forwarded-allow-ips",
        "the proxies (comma-separated "
        "addresses) whose X-Forwarded-For and X-Forwarded-Proto name the client; "
        "default: none, the connection's own address is the client (a client "
        "cannot name itself in the log)",
    ),
]


@command("serve")
def serve_cmd(
    models: Models = None,
    model: Named = [],  # noqa: B006  (typer's default: read, never changed)
    host: Host = "127.0.0.1",
    port: Port = 8000,
    device: Device = "auto",
    precision: Precision = "auto",
    threads: Threads = 0,
    api_key: ApiKey = None,
    max_sentences: MaxSentences = 64,
    max_chars: MaxChars = 1000,
    max_body: MaxBody = 1 << 20,
    timeout: Timeout = 30.0,
    max_queue: MaxQueue = 256,
    batch_tokens: BatchTokens = 4000,
    max_wait_ms: MaxWait = 5.0,
    batching: Batching = True,
    max_cost: MaxCost = 100_000,
    max_attention_cells: MaxCells = 500_000,
    max_connections: MaxConnections = 1000,
    header_timeout: HeaderTimeout = 10.0,
    body_timeout: BodyTimeout = 30.0,
    keep_alive: KeepAlive = 5.0,
    allowed_host: AllowedHost = [],  # noqa: B006
    cors_origin: CorsOrigin = [],  # noqa: B006
    access_log: AccessLog = True,
    forwarded_allow_ips: Forwarded = None,
):
    """Serve translations over HTTP, with a web page that shows the cross-attention.

    POST /translate {"sentences": [...], "beam": 5, ...}; GET /models, /info, /health,
    /metrics; the page at /; the API's schema at /openapi.json. Stop with Ctrl-C or SIGTERM:
    the requests in flight are answered first.

    Examples: mt serve runs/multi30k_de_en --port 8000
              mt serve --model de_en=runs/de_en --model en_de=runs/en_de
    """
    options = dict(locals())
    _check_serving_installed()
    from mt.serve.run import ServeOptions, serve

    _check_device(device)
    serve(ServeOptions(**options), _err)


def _check_serving_installed() -> None:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise MTError(
            f"mt serve needs FastAPI, uvicorn and prometheus_client ({e.name} is "
            "missing): pip install 'mt[serve]'"
        ) from None
