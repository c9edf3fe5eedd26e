"""Load test of `mt serve`: N concurrent clients on loopback send a fixed number of requests, one
sentence each, to the same model served with dynamic batching and without it (batches of one
request), in one run; prints requests/s, p50 and p99 latency, errors and lost requests, and
the ratio of the two throughputs.

    python scripts/bench/bench_serve.py --model runs/multi30k_de_en --sentences test.de
    python scripts/bench/bench_serve.py --clients 32 --requests 640 --beam 5 --json

Each mode gets a fresh server process with its default threads; the clients run in this process
(asyncio, httpx). "Lost" counts requests that got no answer at all (a dropped connection or a
client timeout); "errors" counts answers other than 200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: str, batching: bool, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [sys.executable, "-m", "mt", "serve", model, "--port", str(port), *extra]
    args.append("--batching" if batching else "--no-batching")
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"mt serve did not start: {proc.communicate()[1]}")


async def load(url: str, sentences: list[str], clients: int, requests: int, beam: int,
               timeout: float) -> dict:  # fmt: skip
    latencies: list[float] = []
    errors = lost = 0
    next_index = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal next_index, errors, lost
        while next_index < requests:
            i = next_index
            next_index += 1
            body = {"sentences": [sentences[i % len(sentences)]], "beam": beam}
            started = time.perf_counter()
            try:
                r = await http.post("/translate", json=body)
            except httpx.HTTPError:
                lost += 1
                continue
            latencies.append(time.perf_counter() - started)
            if r.status_code != 200:
                errors += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": requests,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(len(latencies) / elapsed, 2),
        "p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None,
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1)
        if latencies
        else None,
        "errors": errors,
        "lost": lost,
    }


def measure(args: argparse.Namespace, sentences: list[str], batching: bool) -> dict:
    proc, url = start_server(args.model, batching, args.server_args)
    try:
        # warm-up: the first requests pay for lazy initialisation
        asyncio.run(load(url, sentences, min(4, args.clients), 8, args.beam, args.timeout))
        result = asyncio.run(
            load(url, sentences, args.clients, args.requests, args.beam, args.timeout)
        )
        result["health"] = httpx.get(url + "/health").json()
        return result
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="runs/multi30k_de_en", help="run directory or checkpoint")
    p.add_argument("--sentences", default="data/multi30k/test.de", help="one sentence per line")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=640, help="per mode")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--timeout", type=float, default=120.0, help="client timeout, seconds")
    p.add_argument("--server-args", nargs="*", default=[], help="more flags for mt serve")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    lines = Path(args.sentences).read_text(encoding="utf-8").splitlines()
    sentences = [s for s in lines if s.strip()]
    results = {
        "batching": measure(args, sentences, True),
        "no_batching": measure(args, sentences, False),
    }
    ratio = results["batching"]["requests_per_s"] / results["no_batching"]["requests_per_s"]
    results["throughput_ratio"] = round(ratio, 2)
    results["setup"] = {
        "model": args.model,
        "clients": args.clients,
        "requests": args.requests,
        "beam": args.beam,
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{args.clients} clients, {args.requests} requests of one sentence each, beam {args.beam}"
    )
    print(
        f"{'mode':<12} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'lost':>5} batches"
    )
    for mode in ("batching", "no_batching"):
        r = results[mode]
        print(f"{mode:<12} {r['requests_per_s']:>8} {r['p50_ms']:>8} {r['p99_ms']:>8} "
              f"{r['errors']:>7} {r['lost']:>5} {r['health']['batches']}")  # fmt: skip
    print(f"throughput with batching: {ratio:.2f}x without")


if __name__ == "__main__":
    main()
