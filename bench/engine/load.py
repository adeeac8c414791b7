"""Bounded load client for the real-engine harness (runs under the engine venv: httpx).

POST /v1/completions on 127.0.0.1 only. Prompts are lists of token ids, so no
prompt text exists anywhere (and vLLM logs none by default). `ignore_eos` makes
every request generate exactly `max_tokens`, so the KV demand per request is
known arithmetic.

Two shapes:
  open   arrivals at --rate per second (Poisson when --poisson, else evenly
         spaced), at most --max-in-flight at once; an arrival that finds the cap
         full is counted as `dropped_at_cap`, not queued (queueing here would
         silently turn the open loop into a closed one).
  closed --concurrency workers, each sending its next request when the last ends.

Every run is bounded twice: by --count requests sent and by --duration seconds of
sending. At the end, in-flight requests get --drain seconds to finish, then are
cancelled (the server sees the disconnects and aborts them), so the client never
outlives its budget. Writes --out (client.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx


@dataclass
class Stats:
    sent: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    dropped_at_cap: int = 0
    completion_tokens: int = 0
    max_in_flight_seen: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)

    def error(self, kind: str) -> None:
        self.failed += 1
        self.errors[kind] = self.errors.get(kind, 0) + 1


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no data (not 0, which would read as fast)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return round(ordered[rank - 1], 3)


class Client:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stats = Stats()
        self.rng = random.Random(args.seed)
        self.in_flight: set[asyncio.Task[None]] = set()
        limits = httpx.Limits(max_connections=args.max_in_flight + 8, max_keepalive_connections=64)
        # No read timeout beyond the run itself: under thrash a request may sit in
        # Waiting for minutes, and the drain deadline bounds it anyway. trust_env
        # off so a proxy variable can never route 127.0.0.1 traffic elsewhere.
        self.http = httpx.AsyncClient(
            base_url=args.url,
            limits=limits,
            timeout=httpx.Timeout(args.request_timeout, connect=10.0),
            trust_env=False,
        )

    def prompt(self) -> list[int]:
        # Ids 3.. skip the special tokens <s>, </s>, <unk> of make_model.py.
        return [self.rng.randrange(3, self.args.vocab) for _ in range(self.args.prompt_len)]

    async def one(self) -> None:
        body: dict[str, Any] = {
            "model": self.args.model,
            "prompt": self.prompt(),
            "max_tokens": self.args.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        self.stats.sent += 1
        start = time.monotonic()
        try:
            resp = await self.http.post("/v1/completions", json=body)
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            raise
        except httpx.HTTPError as exc:
            self.stats.error(type(exc).__name__)
            return
        if resp.status_code != 200:
            self.stats.error(f"http_{resp.status_code}")
            return
        self.stats.completed += 1
        self.stats.latencies.append(time.monotonic() - start)
        try:
            usage = resp.json().get("usage") or {}
            self.stats.completion_tokens += int(usage.get("completion_tokens") or 0)
        except (ValueError, TypeError):
            pass

    def spawn(self) -> None:
        task = asyncio.create_task(self.one())
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)
        self.stats.max_in_flight_seen = max(self.stats.max_in_flight_seen, len(self.in_flight))

    async def open_loop(self, deadline: float) -> None:
        interval = 1.0 / self.args.rate
        next_at = time.monotonic()
        arrivals = 0
        while arrivals < self.args.count:
            now = time.monotonic()
            if next_at >= deadline:
                break
            if next_at > now:
                await asyncio.sleep(next_at - now)
            arrivals += 1
            if len(self.in_flight) >= self.args.max_in_flight:
                self.stats.dropped_at_cap += 1
            else:
                self.spawn()
            gap = self.rng.expovariate(self.args.rate) if self.args.poisson else interval
            next_at += gap

    async def closed_loop(self, deadline: float) -> None:
        budget = {"left": self.args.count}

        async def worker() -> None:
            while budget["left"] > 0 and time.monotonic() < deadline:
                budget["left"] -= 1
                task = asyncio.create_task(self.one())
                self.in_flight.add(task)
                task.add_done_callback(self.in_flight.discard)
                self.stats.max_in_flight_seen = max(
                    self.stats.max_in_flight_seen, len(self.in_flight)
                )
                try:
                    await asyncio.wait_for(
                        asyncio.shield(task), timeout=max(0.0, deadline - time.monotonic())
                    )
                except TimeoutError:
                    return  # the request stays in flight; drain decides its fate

        await asyncio.gather(*(worker() for _ in range(self.args.concurrency)))

    async def drain(self) -> None:
        if self.in_flight and self.args.drain > 0:
            await asyncio.wait(set(self.in_flight), timeout=self.args.drain)
        pending = set(self.in_flight)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def run(self) -> dict[str, Any]:
        started_at = utc_now()
        t0 = time.monotonic()
        deadline = t0 + self.args.duration
        try:
            if self.args.mode == "open":
                await self.open_loop(deadline)
            else:
                await self.closed_loop(deadline)
            send_end = time.monotonic()
            await self.drain()
        finally:
            await self.http.aclose()
        s = self.stats
        result = asdict(s)
        lat = result.pop("latencies")
        result.update(
            {
                "started_at": started_at,
                "ended_at": utc_now(),
                "send_seconds": round(send_end - t0, 3),
                "wall_seconds": round(time.monotonic() - t0, 3),
                "latency_p50_s": percentile(lat, 0.50),
                "latency_p95_s": percentile(lat, 0.95),
                "latency_max_s": round(max(lat), 3) if lat else None,
                "params": {k: v for k, v in vars(self.args).items() if k not in {"out"}},
            }
        )
        return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", required=True, help="http://127.0.0.1:PORT")
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--mode", choices=("open", "closed"), default="open")
    p.add_argument("--rate", type=float, default=1.0, help="open loop: arrivals per second")
    p.add_argument("--poisson", action="store_true", help="open loop: exponential gaps")
    p.add_argument("--max-in-flight", type=int, default=256, help="open loop cap")
    p.add_argument("--concurrency", type=int, default=1, help="closed loop workers")
    p.add_argument("--count", type=int, required=True, help="at most this many requests")
    p.add_argument("--duration", type=float, required=True, help="seconds of sending, at most")
    p.add_argument("--drain", type=float, default=0.0, help="seconds to let in-flight finish")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt length in token ids")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--request-timeout", type=float, default=900.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="client.json")
    args = p.parse_args(argv)
    host = urlsplit(args.url).hostname
    if host != "127.0.0.1":
        p.error(f"--url must point at 127.0.0.1, not {host!r}")
    if args.rate <= 0 or args.count < 0 or args.duration <= 0:
        p.error("--rate and --duration must be > 0, --count >= 0")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    result = asyncio.run(Client(args).run())
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
        fh.write("\n")
    print(
        f"sent {result['sent']} completed {result['completed']} failed {result['failed']} "
        f"cancelled {result['cancelled']} dropped {result['dropped_at_cap']} "
        f"p50 {result['latency_p50_s']} p95 {result['latency_p95_s']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
