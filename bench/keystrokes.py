"""Replay typing held-out files character by character, requesting completions as an editor does.

A region of each held-out file (stdlib email/, json/, asyncio/: never trained on) is removed and
typed back one character at a time after ~2k tokens of the file, with person-like pauses
(log-normal keystroke gaps, longer after newlines and punctuation, occasional thinking pauses). A
completion is requested whenever a pause exceeds the editor's debounce; warmups are sent on
syntax-ish triggers (newline, `:`, `(`, `=`, `,`) and when the file is opened. Time between
keystrokes is simulated (not slept), so warmups run in the pause before the next request; their
cost is reported separately.

Modes, in the same run on the same model pair:
  cold          no cache: the document's slot is dropped before every request
  cache         per-document KV cache
  cache+warmup  cache plus warmup prefill
  full          cache + warmup + server-side type-through
  accept        full + the next completion before Tab (prefetch), and a user who accepts a shown
                completion when it is what they were about to type (after REACTION_S), then asks
                again: the share of shown completions that cost no model call at request time
`--lsp` drives the real language server (`python -m lsp.server`, LSP over stdio) instead and
reports end-to-end latency for warmup on/off. `--lsp --cases` measures three requests per
held-out block header instead (the issue-21 cases, through the real server): a cold new document
with the cursor on a new indented line under the header; the same document after one more
keystroke; and a new document where the user typed that newline + indent (a warmup trigger)
and paused `--pause-ms` before the request — which must be at least as fast as the keystroke. `--lsp --engine E [--engine E ...]` replays the same
keystrokes through the language server on each engine, side by side (warmup on): `local` (the
in-process engine), `serve` (a `completer serve` started here, over ws://), `llama-server` (a
llama-server started here on the same target converted to GGUF by .ci/llamacpp.sh, through its
/infill), `llama-server/openai` (the same server's /v1/completions with our FIM format), or any
engine URL. Per engine: p50/p90/p99 per keystroke request, and tokens generated (where the server
counts them) vs shown: what the in-loop stop saved against max_new_tokens per request.

    python bench/keystrokes.py [--target DIR --draft DIR] [--files 2] [--chars 240]
    python bench/keystrokes.py --lsp --engine local --engine serve --engine llama-server --files 1 --chars 80
    python bench/keystrokes.py --lsp --cases --files 8 --max-new 4
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
import zlib
from pathlib import Path

from record import write  # bench/, the script's directory

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
TRIGGERS = "\n:(=,"
MODES = ("cold", "cache", "cache+warmup", "full", "accept")
REACTION_S = 0.4  # reading a shown completion and pressing Tab (real time: the engine may use it)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def keystroke_gaps(text: str, rng: random.Random) -> list[float]:
    """Milliseconds after each character before the next one."""
    gaps = []
    for ch in text:
        g = rng.lognormvariate(math.log(110), 0.45)
        if ch == "\n":
            g += rng.uniform(250, 1200)
        elif ch in ":(=,":
            g += rng.uniform(0, 350)
        if rng.random() < 0.02:
            g += rng.uniform(1000, 3000)  # thinking
        gaps.append(g)
    return gaps


def pick_sites(tok_count, files: int, chars: int, head_tokens: int, rng: random.Random):
    """(path, head, region, tail): `region` (≈chars, to a line end) typed after a head of
    ≈head_tokens tokens."""
    from draft_models.data import corpus_files, read_source

    paths = corpus_files(split="heldout")
    rng.shuffle(paths)
    sites = []
    for p in paths:
        text = read_source(p)
        lines = text.splitlines(keepends=True)
        if len(text) < 4 * head_tokens:
            continue
        acc, n = "", 0
        for i, ln in enumerate(lines):  # the first line boundary past head_tokens
            acc += ln
            if len(acc) > 2 * head_tokens and tok_count(acc) >= head_tokens:
                n = len(acc)
                break
        if not n or len(text) - n < chars + 200:
            continue
        end = text.find("\n", n + chars)  # the region ends at a line end: nothing follows the cursor on its line
        sites.append((p, text[:n], text[n:end], text[end:]))
        if len(sites) == files:
            break
    return sites


# -- direct engine -------------------------------------------------------------------------------
def run_engine_mode(engine, mode: str, site, gaps, debounce_ms: float, max_new: int) -> tuple[list, list]:
    path, head, region, tail = site
    doc = f"{mode}:{path.name}"
    warm = mode in ("cache+warmup", "full", "accept")
    rows, warms = [], []

    def warmup(prefix):
        t0 = time.perf_counter()
        n = engine.warmup(prefix, tail, doc_key=doc)
        warms.append({"tokens": n, "ms": (time.perf_counter() - t0) * 1e3})

    def ask(i: int, accepted: bool):
        if mode == "cold":
            engine.forget(doc)
        c = engine.complete(head + region[: i + 1], tail, doc_key=doc, max_new=max_new)
        queue, prefill = c.extra.get("queue_ms", 0.0), c.extra.get("prefill_ms", 0.0)
        rows.append({"file": path.name, "mode": mode, "char": i, "prompt_tokens": c.prompt_tokens,
                     "prefill_tokens": c.prefill_tokens, "ttft_ms": c.ttft_ms, "total_ms": c.total_ms,
                     "queue_ms": queue, "prefill_ms": prefill,
                     "decode_ms": max(c.total_ms - prefill - queue, 0.0),
                     "new_tokens": c.new_tokens, "type_through": c.type_through or c.prefetched,
                     "prefetched": c.prefetched, "shown": bool(c.text.strip()), "after_accept": accepted,
                     "pause_ms": gaps[i] if i < len(gaps) else 0.0})
        return c

    if warm:
        warmup(head)  # didOpen
    i = 0
    while i < len(region):
        if warm and region[i] in TRIGGERS:
            warmup(head + region[: i + 1])
        if gaps[i] < debounce_ms:
            i += 1
            continue
        c = ask(i, False)
        # the user takes what is shown when it is what they were about to type, and asks again
        while mode == "accept" and c.text.strip() and region[i + 1:].startswith(c.text):
            time.sleep(REACTION_S)
            i += len(c.text)
            c = ask(i, True)
        i += 1
    return rows, warms


def one_char_probe(engines: dict, site, max_new: int) -> dict:
    """A one-character edit at the end of the ≈2k-token head: cold vs cached."""
    _, head, region, _ = site
    cold, warm = engines["cold"], engines["cache"]
    out = {"cold_prefill": [], "warm_prefill": [], "cold_ttft": [], "warm_ttft": []}
    for j in range(3):
        prefix = head + region[:j]
        cold.forget("probe")
        c = cold.complete(prefix + region[j], "", doc_key="probe", max_new=max_new)
        warm.complete(prefix, "", doc_key="probe", max_new=max_new)
        w = warm.complete(prefix + region[j], "", doc_key="probe", max_new=max_new)
        out["cold_prefill"].append(c.prefill_tokens)
        out["warm_prefill"].append(w.prefill_tokens)
        out["cold_ttft"].append(c.ttft_ms)
        out["warm_ttft"].append(w.ttft_ms)
    return out


def summarize(rows: list[dict]) -> dict:
    ttft = [r["ttft_ms"] for r in rows if not r["type_through"]]
    total = [r["total_ms"] for r in rows]
    pre = [r["prefill_tokens"] for r in rows if not r["type_through"]]
    n = len(rows)
    return {
        "requests": n,
        "ttft_ms": {q: round(pct(ttft, v), 2) for q, v in (("p50", .5), ("p90", .9), ("p99", .99))},
        "total_ms": {q: round(pct(total, v), 2) for q, v in (("p50", .5), ("p90", .9), ("p99", .99))},
        "prefill_tokens": {"mean": round(statistics.fmean(pre), 2) if pre else 0.0,
                           "p50": pct(pre, .5), "p90": pct(pre, .9), "p99": pct(pre, .99)},
        "stage_ms_p50": {k: round(pct([r[k] for r in rows if not r["type_through"]], .5), 2)
                         for k in ("queue_ms", "prefill_ms", "decode_ms")},
        # "already prefilled": at most the last keystroke's few tokens were computed
        "prefilled_rate": round(sum(r["prefill_tokens"] <= 4 or r["type_through"] for r in rows) / n, 3) if n else 0,
        "cache_hit_rate": round(sum(r["prefill_tokens"] < r["prompt_tokens"] or r["type_through"]
                                    for r in rows) / n, 3) if n else 0,
        "type_through_rate": round(sum(r["type_through"] for r in rows) / n, 3) if n else 0,
        # of the completions shown, those that cost no model call at request time (type-through or prefetch)
        "shown": sum(r["shown"] for r in rows),
        "accepted": sum(r["after_accept"] for r in rows),
        "no_call_share_of_shown": round(sum(r["shown"] and r["type_through"] for r in rows)
                                        / max(sum(r["shown"] for r in rows), 1), 3),
        "prefetched_after_accept": sum(r["prefetched"] for r in rows if r["after_accept"]),
    }


def bench_engine(a) -> dict:
    from dataclasses import replace

    import torch

    from completer.engine.engine import Engine, EngineConfig

    torch.set_num_threads(a.threads)
    base = EngineConfig(target=a.target, draft=a.draft, max_new_tokens=a.max_new)
    # a pair each: an engine quantizes its draft in place (draft_quant)
    engines = {m: Engine(replace(base, type_through=m in ("full", "accept"), prefetch=m == "accept"))
               for m in MODES}
    for e in engines.values():
        e.warm_start()
    rng = random.Random(a.seed)
    sites = pick_sites(engines["cold"].count_tokens, a.files, a.chars, a.head_tokens, rng)
    rows, warms, probes = [], {m: [] for m in MODES}, []
    for site in sites:
        gaps = keystroke_gaps(site[2], random.Random(zlib.crc32(site[0].name.encode())))
        probes.append(one_char_probe(engines, site, a.max_new))
        for m in MODES:
            r, w = run_engine_mode(engines[m], m, site, gaps, a.debounce_ms, a.max_new)
            rows += r
            warms[m] += w
    summary = {m: summarize([r for r in rows if r["mode"] == m]) for m in MODES}
    for m in MODES:
        summary[m]["warmups"] = len(warms[m])
        summary[m]["warmup_ms_p50"] = round(pct([w["ms"] for w in warms[m]], .5), 2) if warms[m] else 0
    flat = {k: [x for p in probes for x in p[k]] for k in probes[0]} if probes else {}
    probe = {}
    if flat:
        probe = {k: statistics.median(v) for k, v in flat.items()}
        probe["prefill_ratio"] = round(probe["cold_prefill"] / max(probe["warm_prefill"], 1), 1)
        probe["ttft_ratio"] = round(probe["cold_ttft"] / max(probe["warm_ttft"], 1e-6), 1)
    return {"sites": [(str(s[0].relative_to(s[0].parents[1])), len(s[2])) for s in sites],
            "head_tokens": a.head_tokens, "ctx": engines["cold"].ctx, "summary": summary,
            "one_char_edit": probe, "rows": rows}


def print_engine(res: dict) -> None:
    print(f"files: {res['sites']}  (model context {res['ctx']} tokens: the prompt is a window)")
    hdr = f"{'mode':13s} {'reqs':>4s} {'ttft p50/p90/p99 ms':>22s} {'total p50/p90/p99 ms':>23s} " \
          f"{'prefill mean/p50/p90':>21s} {'prefilled':>9s} {'hit':>5s} {'t-thru':>6s} {'q/prefill/decode p50':>21s}"
    print(hdr)
    for m, s in res["summary"].items():
        t, tt, p, st = s["ttft_ms"], s["total_ms"], s["prefill_tokens"], s["stage_ms_p50"]
        print(f"{m:13s} {s['requests']:4d} {t['p50']:7.1f}/{t['p90']:6.1f}/{t['p99']:6.1f} "
              f"{tt['p50']:8.1f}/{tt['p90']:6.1f}/{tt['p99']:6.1f} {p['mean']:9.1f}/{p['p50']:4.0f}/{p['p90']:5.0f} "
              f"{s['prefilled_rate']:9.0%} {s['cache_hit_rate']:5.0%} {s['type_through_rate']:6.0%} "
              f"{st['queue_ms']:6.1f}/{st['prefill_ms']:6.1f}/{st['decode_ms']:6.1f}")
    for m, s in res["summary"].items():
        if s["accepted"]:
            print(f"{m}: {s['shown']} completions shown, {s['accepted']} accepted and asked again "
                  f"({s['prefetched_after_accept']} answered by the prefetch); shown without a model call at "
                  f"request time: {s['no_call_share_of_shown']:.0%}")
    p = res["one_char_edit"]
    if p:
        print(f"one-character edit at the end of a ~{res['head_tokens']}-token file: prefill tokens "
              f"{p['cold_prefill']:.0f} cold vs {p['warm_prefill']:.0f} cached ({p['prefill_ratio']}x fewer); "
              f"TTFT {p['cold_ttft']:.1f} ms vs {p['warm_ttft']:.1f} ms ({p['ttft_ratio']}x lower)")


# -- through the language server -------------------------------------------------------------------
class LspClient:
    """Minimal JSON-RPC over stdio: requests with ids, notifications, server requests answered null."""

    def __init__(self, argv: list[str], env: dict):
        import subprocess
        import threading

        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=env)
        self.next_id, self.replies, self.cond = 1, {}, threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        f = self.p.stdout
        while True:
            n = None
            while True:
                line = f.readline()
                if not line:
                    return
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":")[1])
                if line in (b"\r\n", b"\n") and n is not None:
                    break
            msg = json.loads(f.read(n))
            if "method" in msg and "id" in msg:
                self._write({"jsonrpc": "2.0", "id": msg["id"], "result": None})
            elif "id" in msg:
                with self.cond:
                    self.replies[msg["id"]] = msg
                    self.cond.notify_all()

    def _write(self, msg: dict) -> None:
        body = json.dumps(msg).encode()
        self.p.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.p.stdin.flush()

    def notify(self, method: str, params: dict) -> None:
        self._write({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: dict, timeout: float = 600) -> dict:
        with self.cond:
            rid = self.next_id
            self.next_id += 1
        self._write({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        with self.cond:
            self.cond.wait_for(lambda: rid in self.replies, timeout)
            return self.replies.pop(rid)

    def close(self) -> None:
        try:
            self.request("shutdown", {}, timeout=30)
            self.notify("exit", {})
            self.p.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a server that will not stop is killed
            self.p.kill()


def replay_lsp(a, sites, mode: str, argv: list[str], opts: dict, tok_count) -> tuple[list[dict], dict]:
    """Type each site's region into a fresh language server; a request after each debounce-long
    pause. Rows per request, and the server's completer/stats at the end."""
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
    lsp = LspClient([sys.executable, "-m", "lsp.server", *argv], env)
    rows = []
    try:
        lsp.request("initialize", {"processId": os.getpid(), "rootUri": None, "capabilities": {},
                                   "initializationOptions": opts})
        lsp.notify("initialized", {})
        while not str(lsp.request("completer/stats", {}).get("result", {}).get("engine")).startswith(("ready", "failed")):
            time.sleep(0.2)
        for path, head, region, tail in sites:
            uri = f"file:///bench/{mode.replace('/', '_')}/{path.name}"
            lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python",
                                                                 "version": 1, "text": head + tail}})
            gaps = keystroke_gaps(region, random.Random(zlib.crc32(path.name.encode())))
            line, col = head.count("\n"), len(head) - (head.rfind("\n") + 1)
            for i, ch in enumerate(region):
                pos = {"line": line, "character": col}
                lsp.notify("textDocument/didChange", {
                    "textDocument": {"uri": uri, "version": i + 2},
                    "contentChanges": [{"range": {"start": pos, "end": pos}, "text": ch}]})
                line, col = (line + 1, 0) if ch == "\n" else (line, col + len(ch.encode("utf-16-le")) // 2)
                if gaps[i] < a.debounce_ms:
                    continue
                t0 = time.perf_counter()
                r = lsp.request("textDocument/inlineCompletion", {
                    "textDocument": {"uri": uri}, "position": {"line": line, "character": col},
                    "context": {"triggerKind": 2}})
                items = (r.get("result") or {}).get("items") or []
                text = items[0]["insertText"] if items else ""
                rows.append({"mode": mode, "file": path.name, "char": i, "e2e_ms": (time.perf_counter() - t0) * 1e3,
                             "shown": bool(items), "shown_tokens": tok_count(text) if text else 0})
        stats = lsp.request("completer/stats", {}).get("result")
    finally:
        lsp.close()
    return rows, stats


class Peer:
    """An engine server started for the run (completer serve or llama-server), on a free port."""

    def __init__(self, argv: list[str], port: int, ready: str | None):
        import subprocess

        self.port = port
        self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
        if ready is not None:  # completer serve says when its models are ready
            for line in self.p.stderr:
                if ready in line or "error" in line:
                    break
        else:  # llama-server: /health answers 200 once loaded
            import urllib.request

            for _ in range(600):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                        break
                except OSError:
                    time.sleep(0.1)
        if self.p.poll() is not None:
            raise SystemExit(f"{argv[0]} exited at start")
        import threading

        threading.Thread(target=self.p.stderr.read, daemon=True).start()

    def metric(self, name: str) -> float | None:
        import re
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
                m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)", r.read().decode(), re.MULTILINE)
        except OSError:
            return None
        return float(m.group(1)) if m else None

    def stop(self) -> None:
        self.p.terminate()
        self.p.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_peer(a, name: str, target: str) -> tuple[Peer, str, str]:
    """(server, engine URL, the metric that counts its generated tokens) for `serve` or
    `llama-server`."""
    import subprocess

    port = _free_port()
    if name == "serve":
        argv = [sys.executable, "-m", "completer.cli", "serve", "--port", str(port), "--max-new-tokens",
                str(a.max_new), "--target", target]
        if a.draft or not a.target:
            from draft_models import DEFAULT_DRAFT

            argv += ["--draft", a.draft or str(DEFAULT_DRAFT)]
        return Peer(argv, port, "models ready"), f"ws://127.0.0.1:{port}", "completer_engine_new_tokens"
    out = subprocess.run(["bash", str(ROOT / ".ci" / "llamacpp.sh"), "--gguf", target, "f32"], capture_output=True,
                         text=True, env={**os.environ, "PYTHON": sys.executable}, check=False)
    if out.returncode:
        raise SystemExit(f"llama-server: {out.stderr.strip()}")
    cache = subprocess.run(["bash", str(ROOT / ".ci" / "llamacpp.sh")], capture_output=True, text=True,
                           check=True).stdout.strip()
    argv = [f"{cache}/bin/llama-server", "-m", out.stdout.strip(), "--host", "127.0.0.1", "--port", str(port),
            "-c", "2048", "-np", "4", "-t", str(a.threads), "--metrics", "--spm-infill"]
    return Peer(argv, port, None), f"http://127.0.0.1:{port}", "llamacpp:tokens_predicted_total"


def bench_lsp_engines(a, sites, tok_count) -> dict:
    """The same replay through the language server on each engine of --engine, side by side."""
    from draft_models import DEFAULT_TARGET

    target = a.target or str(DEFAULT_TARGET)
    base = {"warmup": True, "debounce_ms": 0, "max_new_tokens": a.max_new}
    peers: dict[str, tuple] = {}
    rows, summary = [], {}
    try:
        for eng in a.engine:
            counter, peer = None, None
            opts = dict(base)
            if eng == "local":
                argv = []
                opts.update({"target": a.target, "draft": a.draft} if a.target else {})
            elif eng in ("serve", "llama-server", "llama-server/openai"):
                kind = "serve" if eng == "serve" else "llama-server"
                if kind not in peers:
                    peers[kind] = start_peer(a, kind, target)
                peer, url, counter = peers[kind]
                url = {"serve": url, "llama-server": f"llamacpp:{url}",
                       "llama-server/openai": f"openai:{url}/v1"}[eng]
                argv = ["--engine", url]
                if eng == "llama-server/openai":
                    opts["fim_format"] = "completer"
            else:
                argv = ["--engine", eng]
            before = peer.metric(counter) if peer is not None else None
            r, stats = replay_lsp(a, sites, eng, argv, opts, tok_count)
            after = peer.metric(counter) if peer is not None else None
            rows += r
            rows.append({"mode": "server_stats", "engine": eng, "stats": stats})
            e2e = [x["e2e_ms"] for x in r]
            summary[eng] = {"requests": len(r), **{q: round(pct(e2e, v), 2) for q, v in
                                                    (("p50", .5), ("p90", .9), ("p99", .99))},
                            "shown_rate": round(sum(x["shown"] for x in r) / len(r), 3) if r else 0.0,
                            "tokens_shown": sum(x["shown_tokens"] for x in r),
                            "tokens_generated": None if before is None or after is None else int(after - before),
                            "tokens_max": len(r) * a.max_new, "engine_error": (stats or {}).get("engine_error")}
    finally:
        for peer, _, _ in peers.values():
            peer.stop()
    return {"sites": [str(s[0].name) for s in sites], "summary": summary, "rows": rows}


def print_engines(res: dict) -> None:
    print(f"files: {res['sites']}  (end-to-end per keystroke request through the language server, warmup on)")
    print(f"{'engine':20s} {'reqs':>4s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} {'shown':>6s} "
          f"{'tok shown':>9s} {'tok generated':>13s} {'no-stop max':>11s} {'saved':>6s}")
    for eng, s in res["summary"].items():
        gen = s["tokens_generated"]
        saved = f"{1 - gen / s['tokens_max']:.0%}" if gen is not None and s["tokens_max"] else "n/a"
        print(f"{eng:20s} {s['requests']:4d} {s['p50']:8.1f} {s['p90']:8.1f} {s['p99']:8.1f} {s['shown_rate']:6.0%} "
              f"{s['tokens_shown']:9d} {gen if gen is not None else 'n/a':>13} {s['tokens_max']:11d} {saved:>6s}"
              + (f"  error: {s['engine_error']}" if s["engine_error"] else ""))


def header_sites(files: int, rng: random.Random) -> list[tuple[Path, str, str, str, str]]:
    """(path, before, indent, typed, after) per held-out file: a block header line (`def`, `if`,
    ... ending in `:`) from the middle third of the file, with its body's indent; `before` ends
    at the header's end of line, `after` is everything from there (the old body), `typed` the
    first character of the body's first line (the one keystroke)."""
    import re

    from draft_models.data import corpus_files, read_source

    paths = corpus_files(split="heldout")
    rng.shuffle(paths)
    out = []
    for p in paths:
        text = read_source(p)
        found = [m for m in re.finditer(r"^([ \t]*)(?:def|if|for|while|with|class|try|else|elif)\b[^\n]*:[ \t]*\n"
                                        r"(?:[ \t]*\n)*([ \t]+)(\S)", text, re.MULTILINE)
                 if len(text) / 3 < m.start() < 2 * len(text) / 3 and len(m.group(2)) > len(m.group(1))]
        if not found:
            continue
        m = rng.choice(found)
        end = text.index("\n", m.start())
        out.append((p, text[:end], m.group(2), m.group(3), text[end:]))
        if len(out) == files:
            break
    return out


def bench_cases(a) -> dict:
    """The three cases of issue 21, item 6, per header site, in one language server: rows of
    end-to-end milliseconds per case and the server's stats."""
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
    # type_through off: a keystroke that matches the last completion is otherwise served without
    # the model, which compares a cache hit with a model run
    opts = {"warmup": True, "debounce_ms": 0, "max_new_tokens": a.max_new, "type_through": a.type_through}
    if a.target:
        opts.update(target=a.target, draft=a.draft)
    lsp = LspClient([sys.executable, "-m", "lsp.server"], env)
    rows: list[dict] = []

    def complete(uri: str, line: int, col: int) -> float:
        t0 = time.perf_counter()
        lsp.request("textDocument/inlineCompletion", {"textDocument": {"uri": uri},
                                                      "position": {"line": line, "character": col},
                                                      "context": {"triggerKind": 2}})
        return (time.perf_counter() - t0) * 1e3

    def open_doc(uri: str, text: str) -> None:
        lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                             "text": text}})

    try:
        lsp.request("initialize", {"processId": os.getpid(), "rootUri": None, "capabilities": {},
                                   "initializationOptions": opts})
        lsp.notify("initialized", {})
        while not str(lsp.request("completer/stats", {}).get("result", {}).get("engine")).startswith(("ready", "failed")):
            time.sleep(0.2)
        for n, (path, before, indent, typed, after) in enumerate(header_sites(a.files, random.Random(a.seed))):
            line, hcol = before.count("\n"), len(before) - (before.rfind("\n") + 1)
            cold = f"file:///bench/cases/{n}/cold_{path.name}"
            open_doc(cold, before + "\n" + indent + after)
            row = {"file": path.name, "line": line, "cold_new_document": complete(cold, line + 1, len(indent))}
            lsp.notify("textDocument/didChange", {"textDocument": {"uri": cold, "version": 2}, "contentChanges": [
                {"range": {"start": {"line": line + 1, "character": len(indent)},
                           "end": {"line": line + 1, "character": len(indent)}}, "text": typed}]})
            row["after_keystroke"] = complete(cold, line + 1, len(indent) + 1)
            trig = f"file:///bench/cases/{n}/trigger_{path.name}"
            open_doc(trig, before + after)
            pos = {"line": line, "character": hcol}
            lsp.notify("textDocument/didChange", {"textDocument": {"uri": trig, "version": 2},
                                                  "contentChanges": [{"range": {"start": pos, "end": pos},
                                                                      "text": "\n" + indent}]})
            time.sleep(a.pause_ms / 1e3)
            row["after_trigger_pause"] = complete(trig, line + 1, len(indent))
            rows.append(row)
            for uri in (cold, trig):
                lsp.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        stats = lsp.request("completer/stats", {}).get("result")
    finally:
        lsp.close()
    summary = {case: {"p50": round(statistics.median(r[case] for r in rows), 1),
                      "p90": round(pct([r[case] for r in rows], 0.9), 1)} for case in CASES}
    return {"summary": summary, "rows": rows, "stats": stats}


CASES = ("cold_new_document", "after_keystroke", "after_trigger_pause")


def bench_lsp(a) -> dict:
    rng = random.Random(a.seed)
    from completer.engine.models import load_tokenizer
    from draft_models import DEFAULT_TARGET

    tok = load_tokenizer(a.target or str(DEFAULT_TARGET))
    tok_count = lambda s: len(tok.encode(s, add_special_tokens=False).ids)
    sites = pick_sites(tok_count, a.files, a.chars, a.head_tokens, rng)
    if a.engine:
        return bench_lsp_engines(a, sites, tok_count)
    rows = []
    for warm in (True, False):
        opts = {"warmup": warm, "debounce_ms": 0, "max_new_tokens": a.max_new}
        if a.target:
            opts.update(target=a.target, draft=a.draft)
        mode = "lsp cache+warmup" if warm else "lsp cache"
        r, stats = replay_lsp(a, sites, mode, [], opts, tok_count)
        rows += r
        rows.append({"mode": "server_stats", "warmup": warm, "stats": stats})
    summary = {}
    for m in ("lsp cache+warmup", "lsp cache"):
        mine = [r for r in rows if r.get("mode") == m]
        e2e = [r["e2e_ms"] for r in mine]
        summary[m] = {"requests": len(e2e), **{q: round(pct(e2e, v), 2) for q, v in
                                               (("p50", .5), ("p90", .9), ("p99", .99))},
                      "shown_rate": round(sum(r["shown"] for r in mine) / len(mine), 3) if mine else 0.0}
    return {"sites": [str(s[0].name) for s in sites], "summary": summary, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--chars", type=int, default=240, help="characters typed per file")
    ap.add_argument("--head-tokens", type=int, default=2000, help="file tokens before the typing point")
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--debounce-ms", type=float, default=150.0, help="a pause this long sends a request")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lsp", action="store_true", help="drive `python -m lsp.server` over stdio")
    ap.add_argument("--engine", action="append", default=[],
                    help="with --lsp, repeatable: local | serve | llama-server | llama-server/openai | an engine URL")
    ap.add_argument("--cases", action="store_true",
                    help="with --lsp: cold new document / after a keystroke / after a trigger + pause")
    ap.add_argument("--pause-ms", type=float, default=1500.0, help="--cases: the pause after the trigger")
    ap.add_argument("--type-through", action=argparse.BooleanOptionalAction, default=True,
                    help="--cases: serve a keystroke that matches the last completion without the model")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    OUT.mkdir(parents=True, exist_ok=True)
    if a.lsp:
        if not (ROOT / "lsp" / "server.py").is_file():
            print("lsp/server.py is not there yet: run without --lsp", file=sys.stderr)
            return 2
        res = bench_cases(a) if a.cases else bench_lsp(a)
        if a.cases:
            print(f"{len(res['rows'])} block headers, max_new_tokens {a.max_new}, pause {a.pause_ms:g} ms")
            for case, s in res["summary"].items():
                print(f"{case:22s} end-to-end p50 {s['p50']:7.1f} ms  p90 {s['p90']:7.1f} ms")
        elif a.engine:
            print_engines(res)
        else:
            print(f"files: {res['sites']}")
            for m, s in res["summary"].items():
                print(f"{m:18s} {s['requests']:4d} requests  end-to-end p50 {s['p50']:.1f}  p90 {s['p90']:.1f}  "
                      f"p99 {s['p99']:.1f} ms  (a completion shown for {s['shown_rate']:.0%}; the rest gated)")
    elif a.engine:
        ap.error("--engine needs --lsp")
    else:
        res = bench_engine(a)
        print_engine(res)
    out = a.out or OUT / ("keystrokes_cases.json" if a.cases else "keystrokes_lsp.json" if a.lsp else "keystrokes.json")
    args = {k: str(v) for k, v in vars(a).items()}
    print(f"wrote {write(out.stem, {'args': args, **res}, threads=a.threads, path=out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
