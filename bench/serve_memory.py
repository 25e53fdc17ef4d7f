"""Memory and threads of a real `completer serve` under many WebSocket editors.

One server (a subprocess, the embedded pair unless --target/--draft); its VmRSS and thread count
are sampled from /proc/PID/status every 50 ms: when the models are ready, the peak during the load,
and two seconds after the last editor finished (memory a server keeps is memory it grew to). The
editors are bench/concurrency.py's closed-loop typists (one connection and one held-out file each).

    python bench/serve_memory.py [--editors 32] [--requests 4] [-- SERVE ARGS...]
"""
from __future__ import annotations

import argparse
import asyncio
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from concurrency import launch, load
from keystrokes import pick_sites


def status(pid: int) -> tuple[int, int]:
    """(VmRSS in KiB, threads) of a live process."""
    text = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"^VmRSS:\s+(\d+)", text, re.MULTILINE).group(1))
    return rss, int(re.search(r"^Threads:\s+(\d+)", text, re.MULTILINE).group(1))


class Sampler:
    """The process's peak RSS and thread count since the last `reset`."""

    def __init__(self, pid: int):
        self.pid, self.peak_rss, self.peak_threads, self.stop = pid, 0, 0, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def reset(self) -> None:
        self.peak_rss, self.peak_threads = status(self.pid)

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                rss, threads = status(self.pid)
            except (OSError, AttributeError):
                return
            self.peak_rss, self.peak_threads = max(self.peak_rss, rss), max(self.peak_threads, threads)


def start(serve_args: list[str], threads: int) -> tuple[subprocess.Popen, str]:
    return launch([sys.executable, "-m", "completer.cli", "serve", "--port", "0", *serve_args], threads, ROOT)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--editors", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4, help="completions per editor")
    ap.add_argument("--head-tokens", type=int, default=600)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the server")
    ap.add_argument("serve_args", nargs="*", help="after --: arguments of `completer serve`")
    a = ap.parse_args(argv)
    from completer.engine.models import load_tokenizer
    from draft_models import DEFAULT_TARGET

    target = next((a.serve_args[i + 1] for i, x in enumerate(a.serve_args[:-1]) if x == "--target"), None)
    tok = load_tokenizer(target or str(DEFAULT_TARGET))
    sites = pick_sites(lambda s: len(tok.encode(s, add_special_tokens=False).ids), a.editors, 200, a.head_tokens,
                       random.Random(0))
    p, url = start(a.serve_args, a.threads)
    try:
        sampler = Sampler(p.pid)
        time.sleep(1.0)
        ready_rss, ready_threads = status(p.pid)
        sampler.reset()
        r = asyncio.run(load(url, sites, a.editors, a.requests, 0))
        peak_rss, peak_threads = sampler.peak_rss, sampler.peak_threads
        time.sleep(2.0)
        after_rss, after_threads = status(p.pid)
        sampler.stop.set()
    finally:
        p.terminate()
        p.wait(timeout=30)
    print(f"{a.editors} editors x {a.requests} completions: {r['requests']} done in {r['wall_s']} s, "
          f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, errors {r['errors'] or '-'}")
    print(f"{'':12s} {'RSS MiB':>8s} {'threads':>8s}")
    for name, rss, th in (("ready", ready_rss, ready_threads), ("peak", peak_rss, peak_threads),
                          ("after +2 s", after_rss, after_threads)):
        print(f"{name:12s} {rss / 1024:8.0f} {th:8d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
