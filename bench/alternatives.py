"""The cost of alternatives to cycle (completer/engine/alternatives.py): ms per request with n = 3
against n = 1, through the product's path (pipeline.complete_at: the syntax layer, the engine with
its defaults, post-processing and deduplication), on held-out line holes (bench/heldout.py: the
stdlib's held-out split). Per hole and n, a document of its own is warmed first (warmup_at, as the
language server's syntax triggers do; not timed), then one request is timed; n = 1 and n = 3
alternate hole by hole so that a phase of the machine hits both alike. Also: the items a request
shows (after deduplication), the tokens the branches decode, their prefill (one token each when the
prompt's KV is shared), and whether the main completion stayed the same. Prefetch is off (a
continuation computed between requests would load the machine the next one is timed on). Nothing
else should run meanwhile (no training).

    python bench/alternatives.py [--n 40] [--threads 1] [--min-confidence X]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from heldout import fim_holes
from record import write

from completer.config import EngineConfig
from completer.engine.engine import Engine
from completer.pipeline import complete_at, warmup_at

NS = (1, 3)


def pct(xs: list[float], q: float) -> float:
    return round(statistics.quantiles(xs, n=100, method="inclusive")[q - 1], 2) if len(xs) > 1 else round(xs[0], 2)


def summary(rows: list[dict], n: int) -> dict:
    ms = [r[f"ms_{n}"] for r in rows]
    return {"requests": len(rows), "ms_p50": pct(ms, 50), "ms_p90": pct(ms, 90), "ms_mean": round(statistics.fmean(ms), 2),
            "items_mean": round(statistics.fmean(r[f"items_{n}"] for r in rows), 2),
            "branch_tokens_mean": round(statistics.fmean(r[f"branch_tokens_{n}"] for r in rows), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40, help="held-out line holes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the engine's decode_threads too)")
    ap.add_argument("--min-confidence", type=float, default=None,
                    help="the confidence gate (default: the model's calibrated value)")
    ap.add_argument("--out", type=Path, default=None, help="the record (default bench/out/alternatives.json)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    engine = Engine(EngineConfig(prefetch=False, decode_threads=a.threads, min_confidence=a.min_confidence))
    engine.warm_start()
    holes = fim_holes(a.n, a.seed, third_party=())
    rows = []
    for i, h in enumerate(holes):
        text, at = h.prefix + h.suffix, len(h.prefix)
        row = {"file": h.file, "offset": at}
        for n in (NS if i % 2 == 0 else NS[::-1]):
            doc = f"hole{i}:n{n}"
            warmup_at(engine, text, at, doc_key=doc, language="python")
            t0 = time.perf_counter()
            c = complete_at(engine, text, at, doc_key=doc, language="python", n=n)
            row[f"ms_{n}"] = (time.perf_counter() - t0) * 1e3
            row[f"text_{n}"] = c.text
            row[f"items_{n}"] = (1 if c.text else 0) + len(c.alternatives)
            row[f"branch_tokens_{n}"] = sum(x.new_tokens for x in c.alternatives)
            row[f"branch_prefill_{n}"] = [x.prefill_tokens for x in c.alternatives]
            engine.forget(doc)
        rows.append(row)
        print(f"{i:3d} {row['ms_1']:8.1f} ms  {row['ms_3']:8.1f} ms  items {row['items_3']}  {h.file}", flush=True)
    shown = [r for r in rows if r["text_1"]]
    results = {"holes": len(rows), "seed": a.seed, "threads": a.threads, "min_confidence": a.min_confidence,
               "same_main": sum(r["text_1"] == r["text_3"] for r in rows),
               "branch_prefill_tokens": sorted({p for r in rows for p in r["branch_prefill_3"]}),
               "all": {f"n={n}": summary(rows, n) for n in NS},
               "shown": {f"n={n}": summary(shown, n) for n in NS} if shown else {}, "rows": rows}
    for scope in ("all", "shown"):
        if not results[scope]:
            continue
        one, three = results[scope]["n=1"], results[scope]["n=3"]
        print(f"{scope:5s} ({one['requests']} requests): n=1 p50 {one['ms_p50']} p90 {one['ms_p90']} mean {one['ms_mean']} ms;"
              f" n=3 p50 {three['ms_p50']} p90 {three['ms_p90']} mean {three['ms_mean']} ms"
              f" (+{three['ms_mean'] - one['ms_mean']:.1f} ms mean); items shown {three['items_mean']},"
              f" branch tokens {three['branch_tokens_mean']}")
    print(f"main completion unchanged by n=3: {results['same_main']}/{len(rows)}; branch prefill tokens seen:"
          f" {results['branch_prefill_tokens']}")
    print(write("alternatives", results, threads=a.threads, path=a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
