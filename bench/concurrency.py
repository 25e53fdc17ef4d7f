"""Concurrent simulated editors against a real `completer serve`: throughput and tail latency
with dynamic batching on and off.

Each editor has its own WebSocket connection and its own held-out file; it types a few
characters, requests a completion, waits for `done`, thinks briefly, and repeats (a closed
loop). The server runs as a subprocess (`python -m completer.cli serve`) in three setups:
`on` (`--max-batch 16`, the batched step's verify-token budget `--batch-step-tokens`),
`on-nocap` (`--max-batch 16 --batch-step-tokens 0`: every member drafts its adaptive length) and
`off` (`--max-batch 1`: one generation at a time). The three servers run side by side and the
loads take turns (`--repeats` rounds, each round every setup once), so a busy machine's drift
hits them alike; the table gives each setup's medians over the rounds. An `overloaded` error
with a retry hint is retried after it (counted); any other error is counted and reported.

    python bench/concurrency.py [--target DIR --draft DIR] [--editors 1 4 16 32] [--requests 6]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import msgpack

ROOT = Path(__file__).resolve().parents[1]
from keystrokes import OUT, pct, pick_sites

SETUPS = (("on", 16, None), ("on-nocap", 16, 0), ("off", 1, 0))  # (name, --max-batch, --batch-step-tokens)


def evicted(ws_url: str) -> int | None:
    """completer_engine_evictions from the server's /metrics."""
    url = ws_url.replace("ws://", "http://").removesuffix("/ws") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            m = re.search(r"^completer_engine_evictions (\S+)", r.read().decode(), re.MULTILINE)
    except OSError:
        return None
    return int(float(m.group(1))) if m else None


def start_server(a, max_batch: int, step_tokens: int | None) -> tuple[subprocess.Popen, str]:
    argv = [sys.executable, "-m", "completer.cli", "serve", "--port", "0", "--max-batch", str(max_batch),
            "--batch-wait-ms", str(a.batch_wait_ms), "--max-new-tokens", str(a.max_new), "--batch-step-tokens",
            str(a.step_tokens if step_tokens is None else step_tokens)]
    if a.target:
        argv += ["--target", a.target, "--draft", a.draft]
    if a.kv_budget_mb is not None:
        argv += ["--kv-budget-mb", str(a.kv_budget_mb)]
    return launch(argv, a.threads)


def launch(argv: list[str], threads: int, cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """`completer serve` started by `argv` (with --port 0) → (process, its ws:// URL) once its models are ready."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    port = None
    for line in p.stderr:
        m = re.search(r"listening on ws://[^:]+:(\d+)/ws", line)
        port = int(m.group(1)) if m else port
        if "models ready" in line or "error" in line:
            break
    if port is None or p.poll() is not None:
        raise SystemExit("the server did not start")
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()  # keep the pipe drained
    return p, f"ws://127.0.0.1:{port}/ws"


async def editor(url: str, site, n: int, seed: int, rows: list, errors: dict) -> None:
    from websockets.asyncio.client import connect

    path, head, region, tail = site
    rng = random.Random(seed)
    typed = 0
    async with connect(url, max_size=None) as ws:
        for i in range(n):
            typed += rng.randint(1, 6)
            frame = {"type": "complete", "id": i, "doc": path.name, "prefix": head + region[:typed],
                     "suffix": tail, "stream": False}
            t0 = time.perf_counter()
            await ws.send(msgpack.packb(frame))
            while (r := msgpack.unpackb(await ws.recv()))["type"] != "done":
                if r["type"] != "error":
                    continue
                errors[r.get("code")] = errors.get(r.get("code"), 0) + 1
                if r.get("code") != "overloaded" or r.get("retry_after_ms") is None:
                    break  # counted; the editor goes on typing
                await asyncio.sleep(r["retry_after_ms"] / 1e3)  # as a client should: the hint, then again
                await ws.send(msgpack.packb(frame))
            if r["type"] != "done":
                continue
            st = r["stats"]
            rows.append({"latency_ms": (time.perf_counter() - t0) * 1e3, "new_tokens": st.get("new_tokens", 0),
                         "ttft_ms": st.get("ttft_ms", 0.0), "queue_ms": st.get("queue_ms", 0.0),
                         "prefill_tokens": st.get("prefill_tokens", 0)})
            await asyncio.sleep(rng.uniform(0.02, 0.08))  # the user reads the ghost text


async def load(url: str, sites, editors: int, n: int, seed: int) -> dict:
    rows: list = []
    errors: dict = {}
    t0 = time.perf_counter()
    await asyncio.gather(*(editor(url, sites[i % len(sites)], n, seed + i, rows, errors) for i in range(editors)))
    wall = time.perf_counter() - t0
    lat = [r["latency_ms"] for r in rows]
    return {"editors": editors, "requests": len(rows), "wall_s": round(wall, 2),
            "req_per_s": round(len(rows) / wall, 2),
            "tokens_per_s": round(sum(r["new_tokens"] for r in rows) / wall, 1),
            "p50_ms": round(pct(lat, .5), 1), "p90_ms": round(pct(lat, .9), 1), "p99_ms": round(pct(lat, .99), 1),
            "queue_p50_ms": round(pct([r["queue_ms"] for r in rows], .5), 1), "errors": errors}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--editors", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--requests", type=int, default=6, help="completions per editor")
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--batch-wait-ms", type=float, default=2.0)
    ap.add_argument("--step-tokens", type=int, default=32, help="--batch-step-tokens of the `on` setup")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each round runs every setup once")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--head-tokens", type=int, default=600)
    ap.add_argument("--kv-budget-mb", type=float, help="the servers' KV budget (default: theirs)")
    ap.add_argument("--out", type=Path, default=OUT / "concurrency.json")
    a = ap.parse_args(argv)
    from completer.engine.models import load_tokenizer
    from draft_models import DEFAULT_TARGET

    tok = load_tokenizer(a.target or str(DEFAULT_TARGET))
    sites = pick_sites(lambda s: len(tok.encode(s, add_special_tokens=False).ids), max(a.editors), 200,
                       a.head_tokens, random.Random(0))
    servers = {}
    try:
        for name, max_batch, step_tokens in SETUPS:
            servers[name] = start_server(a, max_batch, step_tokens)
        results = []
        for e in a.editors:
            for rnd in range(a.repeats):
                for name, (_, url) in servers.items():
                    r = asyncio.run(load(url, sites, e, a.requests, 1000 * rnd))
                    results.append({**r, "batching": name, "round": rnd})
        evictions = {name: evicted(url) for name, (_, url) in servers.items()}
    finally:
        for p, _ in servers.values():
            p.terminate()
            p.wait(timeout=30)
    cols = ("req_per_s", "tokens_per_s", "p50_ms", "p90_ms", "p99_ms", "queue_p50_ms")
    print(f"medians over {a.repeats} round(s); p99 per round in brackets")
    print(f"{'batching':8s} {'editors':>7s} {'reqs':>5s} {'req/s':>6s} {'tok/s':>7s} "
          f"{'p50 ms':>7s} {'p90 ms':>7s} {'p99 ms':>7s} {'queue p50':>9s}  errors  [p99 by round]")
    for e in a.editors:
        for name in servers:
            rs = [r for r in results if r["editors"] == e and r["batching"] == name]
            m = {c: statistics.median(r[c] for r in rs) for c in cols}
            errs: dict = {}
            for r in rs:
                for k, v in r["errors"].items():
                    errs[k] = errs.get(k, 0) + v
            print(f"{name:8s} {e:7d} {rs[0]['requests']:5d} {m['req_per_s']:6.2f} {m['tokens_per_s']:7.1f} "
                  f"{m['p50_ms']:7.1f} {m['p90_ms']:7.1f} {m['p99_ms']:7.1f} {m['queue_p50_ms']:9.1f}  "
                  f"{errs or '-'}  {[round(r['p99_ms']) for r in rs]}")
    print("KV evictions (documents whose cache was dropped for the budget):", evictions)
    OUT.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": results,
                                 "evictions": evictions}, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
