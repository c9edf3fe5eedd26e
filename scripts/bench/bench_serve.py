"""Load test of `mt serve`: N concurrent clients on loopback send a fixed number of requests, one
sentence each, to the same model served with dynamic batching and without it (batches of one
request), in one run; prints requests/s, p50 and p99 latency, errors, wrong answers and lost
requests, the server's threads, and the ratio of the two throughputs.

    python scripts/bench/bench_serve.py --model runs/multi30k_de_en --sentences test.de
    python scripts/bench/bench_serve.py --clients 32 --requests 640 --beam 5 --json

Each mode gets a fresh server process with its default threads; the clients run in this process
(asyncio, httpx). Every answer is checked against `mt translate`'s output for the same sentence
and beam, computed first: requests/s counts the correct answers alone. "Wrong" counts 200
answers with another translation, "errors" answers other than 200, "lost" requests that got no
answer at all (a dropped connection or a client timeout). The server's output is read as it
comes (a full pipe would stop it).
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
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    model: str, batching: bool, extra: list[str]
) -> tuple[subprocess.Popen, str, deque]:
    """The server, its URL, and its last lines of output (drained by a thread)."""
    port = free_port()
    args = [sys.executable, "-m", "mt", "serve", model, "--port", str(port), *extra]
    args.append("--batching" if batching else "--no-batching")
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    said: deque = deque(maxlen=50)
    threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, said
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    proc.kill()
    time.sleep(0.5)
    raise SystemExit(f"mt serve did not start: {''.join(said)}")


def expected(model: str, sentences: list[str], beam: int) -> dict[str, str]:
    """`mt translate`'s output for each sentence, the answer the server must give."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(sentences) + "\n")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mt", "translate", model, "--beam", str(beam), "-i", f.name],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        raise SystemExit(f"mt translate failed: {proc.stderr.strip()}")
    return dict(zip(sentences, proc.stdout.splitlines(), strict=True))


def threads_of(pid: int) -> int | None:
    """The OS threads of a process (Linux), None elsewhere."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in status.splitlines()
                 if line.startswith("Threads:")), None)  # fmt: skip


async def load(url: str, sentences: list[str], clients: int, requests: int, beam: int,
               timeout: float, want: dict[str, str]) -> dict:  # fmt: skip
    latencies: list[float] = []
    errors = lost = wrong = 0
    next_index = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal next_index, errors, lost, wrong
        while next_index < requests:
            i = next_index
            next_index += 1
            sentence = sentences[i % len(sentences)]
            body = {"sentences": [sentence], "beam": beam}
            started = time.perf_counter()
            try:
                r = await http.post("/translate", json=body)
            except httpx.HTTPError:
                lost += 1
                continue
            if r.status_code != 200:
                errors += 1
            elif r.json()["translations"][0]["text"] != want[sentence]:
                wrong += 1
            else:
                latencies.append(time.perf_counter() - started)

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
        "wrong": wrong,
        "lost": lost,
    }


def measure(args: argparse.Namespace, sentences: list[str], batching: bool,
            want: dict[str, str]) -> dict:  # fmt: skip
    proc, url, said = start_server(args.model, batching, args.server_args)
    try:
        # warm-up: the first requests pay for lazy initialisation
        asyncio.run(load(url, sentences, min(4, args.clients), 8, args.beam, args.timeout, want))
        result = asyncio.run(
            load(url, sentences, args.clients, args.requests, args.beam, args.timeout, want)
        )
        result["health"] = httpx.get(url + "/health").json()
        result["torch_threads"] = httpx.get(url + "/info").json().get("threads")
        result["os_threads"] = threads_of(proc.pid)
        if result["errors"] or result["lost"]:
            result["server_said"] = list(said)[-5:]
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
    sentences = [s for s in lines if s.strip()][: args.requests]
    want = expected(args.model, sentences, args.beam)
    results = {
        "batching": measure(args, sentences, True, want),
        "no_batching": measure(args, sentences, False, want),
    }
    ratio = results["batching"]["requests_per_s"] / max(
        results["no_batching"]["requests_per_s"], 1e-9
    )
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
    print(f"{'mode':<12} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'wrong':>6} "
          f"{'lost':>5} {'batches':>8} threads (torch, OS)")  # fmt: skip
    for mode in ("batching", "no_batching"):
        r = results[mode]
        print(f"{mode:<12} {r['requests_per_s']:>8} {r['p50_ms']:>8} {r['p99_ms']:>8} "
              f"{r['errors']:>7} {r['wrong']:>6} {r['lost']:>5} {r['health']['batches']:>8} "
              f"{r['torch_threads']}, {r['os_threads']}")  # fmt: skip
    print(f"throughput with batching: {ratio:.2f}x without")


if __name__ == "__main__":
    main()
