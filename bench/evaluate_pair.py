"""Measure a target/draft pair on held-out code for the model card.

`python bench/evaluate_pair.py [--target DIR --draft DIR] [--out FILE.json]` prints a table (and writes it,
bench/record.py's record, to --out, default bench/out/evaluate_pair_SOURCE.json):
- target: held-out loss / perplexity and next-token accuracy vs a token 4-gram model (stupid
  backoff, counted on the training split) on the same held-out tokens;
- single-line exact match on held-out holes (real lines cut at a random point; the model fills
  the rest of the line through the engine's FIM prompt);
- degeneration: share of 128-token (ctx/2 - 16) greedy continuations in which some token 6-gram occurs ≥ 3
  times, next to the same rate on the real held-out continuations;
- draft: greedy agreement with the target per token, τ (tokens per target forward) at k = 4, 8;
- cold start of `completer complete` (process start → printed completion) and its peak RSS.
Everything is seeded; held-out files are the stdlib packages listed in draft_models.data.HELD_OUT,
or with `--source pypi` real packages' modules (bench/heldout.py's PACKAGES, from `--sdists` or pip):
code of no training source. Loss and accuracy use windows of `--window` tokens whatever the model's
context, so that pairs of different windows compare.
"""
from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from draft_models import DEFAULT_DRAFT, DEFAULT_TARGET
from draft_models.data import corpus_files, read_source


def _tokens(tok, files) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch([read_source(f) for f in files], add_special_tokens=False)]


class NgramLM:
    """Token n-gram argmax predictor with stupid backoff (n-1 .. 1 tokens of context)."""

    def __init__(self, seqs: list[list[int]], V: int, n: int = 4):
        self.V, self.n, self.tables = V, n, []
        for c in range(n - 1, 0, -1):
            codes = []
            for ids in seqs:
                a = np.asarray(ids, dtype=np.int64)
                if len(a) > c:
                    code = np.zeros(len(a) - c, dtype=np.int64)
                    for j in range(c + 1):
                        code = code * V + a[j:len(a) - c + j]
                    codes.append(code)
            uniq, counts = np.unique(np.concatenate(codes), return_counts=True)
            ctx = uniq // V
            order = np.lexsort((-counts, ctx))  # per context, most frequent continuation first
            ctx_s, tok_s = ctx[order], uniq[order] % V
            first = np.r_[True, ctx_s[1:] != ctx_s[:-1]]
            self.tables.append((c, ctx_s[first], tok_s[first]))
        self.unigram = int(np.bincount(np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])).argmax())

    def predict(self, ids: np.ndarray) -> np.ndarray:
        """Argmax next token after each position of `ids` [N] → [N]."""
        pred = np.full(len(ids), self.unigram, dtype=np.int64)
        done = np.zeros(len(ids), dtype=bool)
        for c, keys, vals in self.tables:
            if len(ids) < c:
                continue
            code = np.zeros(len(ids) - c + 1, dtype=np.int64)
            for j in range(c):
                code = code * self.V + ids[j:len(ids) - c + 1 + j]
            pos = np.arange(c - 1, len(ids))
            i = np.clip(np.searchsorted(keys, code), 0, len(keys) - 1)
            hit = (keys[i] == code) & ~done[pos]
            pred[pos[hit]] = vals[i[hit]]
            done[pos[hit]] = True
        return pred


@torch.inference_mode()
def target_metrics(model, tok, held: list[list[int]], ngram: NgramLM, ctx: int, max_windows: int) -> dict:
    loss = ok = ok4 = n = 0.0
    windows = [s[i:i + ctx] for s in held for i in range(0, max(1, len(s) - 1), ctx) if len(s[i:i + ctx]) > 8]
    random.Random(0).shuffle(windows)
    for w in windows[:max_windows]:
        x = torch.tensor([w])
        logits = model(input_ids=x).logits[0, :-1].float()
        y = x[0, 1:]
        loss += torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
        ok += (logits.argmax(-1) == y).sum().item()
        ok4 += (ngram.predict(np.asarray(w))[:-1] == np.asarray(w[1:])).sum()
        n += len(y)
    return {"heldout_loss": loss / n, "heldout_ppl": float(np.exp(loss / n)), "next_token_acc": ok / n,
            "ngram4_next_token_acc": float(ok4 / n), "eval_tokens": int(n)}


def holes(files, n: int, seed: int) -> list[tuple[str, str, str]]:
    """(prefix, suffix, expected rest of line) at random mid-line points of held-out files."""
    rng = random.Random(seed)
    out = []
    texts = [read_source(f) for f in files]
    while len(out) < n:
        t = rng.choice(texts)
        lines = t.split("\n")
        i = rng.randrange(len(lines))
        ln = lines[i]
        body = ln.strip()
        if len(body) < 12 or body.startswith(("#", '"""', "'''")):
            continue
        indent = len(ln) - len(ln.lstrip())
        cut = rng.randint(indent + 1, len(ln) - 4)
        off = sum(len(x) + 1 for x in lines[:i]) + cut
        out.append((t[:off], t[off + len(ln) - cut:], ln[cut:]))
    return out


def degenerate(ids: list[int], n: int = 6, times: int = 3) -> bool:
    seen: dict[tuple, int] = {}
    for i in range(len(ids) - n + 1):
        g = tuple(ids[i:i + n])
        seen[g] = seen.get(g, 0) + 1
        if seen[g] >= times:
            return True
    return False


def _pypi_files(sdists: Path | None) -> list[Path]:
    """The modules (no tests, docs or examples) of bench/heldout.py's packages, unpacked in a
    temporary folder that lives as long as this process."""
    import tempfile

    from heldout import PACKAGES, SKIP_PARTS, fetch  # bench/, the script's directory

    into = Path(tempfile.mkdtemp(prefix="evaluate_pair_"))
    return [p for root in fetch(list(PACKAGES), sdists, into) for p in sorted(root.rglob("*.py"))
            if not SKIP_PARTS & set(p.relative_to(root).parts)]


def cold_start(target: str, draft: str) -> dict:
    example = Path(__file__).resolve().parent.parent / "examples" / "stack.py"
    cmd = [sys.executable, "-m", "completer.cli", "complete", str(example), "--line", "7", "--col", "19",
           "--target", target, "--draft", draft, "--json"]
    # GNU time forks the command from a small process: a child forked from this one would carry
    # this process's RSS (the n-gram tables) into its ru_maxrss across exec.
    times, rss_kb = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], check=True, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        rss_kb.append(int(r.stderr.strip().splitlines()[-1]))
    return {"cold_start_s_median": sorted(times)[1], "cold_start_s_all": [round(t, 2) for t in times],
            "peak_rss_mb": max(rss_kb) / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m draft_models.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(DEFAULT_TARGET))
    ap.add_argument("--draft", default=str(DEFAULT_DRAFT))
    ap.add_argument("--holes", type=int, default=200)
    ap.add_argument("--continuations", type=int, default=40)
    ap.add_argument("--windows", type=int, default=120, help="held-out windows for loss/acc")
    ap.add_argument("--window", type=int, default=512, help="tokens a loss/acc window holds")
    ap.add_argument("--source", choices=("stdlib", "pypi"), default="stdlib",
                    help="held-out code: the stdlib's held-out split, or real packages' sources (PyPI sdists)")
    ap.add_argument("--sdists", type=Path, help="with --source pypi: a folder holding the sdists")
    ap.add_argument("--max-train-files", type=int, help="n-gram baseline on fewer files (smoke runs)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from completer.engine.adaptive import AdaptiveK
    from completer.engine.drafters import ModelDrafter
    from completer.engine.engine import Engine, EngineConfig
    from completer.engine.runner_factory import make_runner
    from completer.engine.sampling import Sampling
    from completer.engine.speculative import generate

    res: dict = {"target": a.target, "draft": a.draft}
    eng = Engine(EngineConfig(target=a.target, draft=a.draft, drafter="model", max_new_tokens=48))
    hf_t = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).eval()
    hf_d = AutoModelForCausalLM.from_pretrained(a.draft, dtype=torch.float32).eval()
    tok, ctx = eng.tok, eng.ctx
    V = tok.get_vocab_size()
    t0 = time.time()
    held_files = corpus_files(split="heldout") if a.source == "stdlib" else _pypi_files(a.sdists)
    held = _tokens(tok, held_files)
    ngram = NgramLM(_tokens(tok, corpus_files(split="train")[: a.max_train_files]), V)
    res.update(target_metrics(hf_t, tok, held, ngram, min(ctx, a.window), a.windows), source=a.source)
    print(f"target metrics done ({time.time() - t0:.0f}s)", file=sys.stderr)

    em = 0
    hs = holes(held_files, a.holes, a.seed)
    for prefix, suffix, want in hs:
        got = eng.complete(prefix, suffix, doc_key="holes", max_new=48,
                           stop_text=lambda s: s.find("\n") if "\n" in s else None).text
        em += got.rstrip() == want.rstrip()
    if hs:  # --holes 0: not measured (a size study's quick pass), not 0 %
        res["single_line_exact_match"] = em / len(hs)
    res["holes"] = len(hs)

    rng = random.Random(a.seed)
    deg_model = deg_real = 0
    agree = total = 0
    taus = {4: [], 8: []}
    draft_runner = make_runner(eng.pair.draft, ctx)
    P, G = min(256, ctx // 2), min(128, ctx // 2 - 16)  # prompt and continuation lengths
    for _ in range(a.continuations):
        s = rng.choice([s for s in held if len(s) > P + G + 16])
        i = rng.randrange(0, len(s) - P - G)
        prompt, real = s[i:i + P], s[i + P:i + P + G]
        ids, _ = eng.complete_ids(prompt, doc_key="cont", max_new=G, drafter="none")
        deg_model += degenerate(ids)
        deg_real += degenerate(real)
        with torch.inference_mode():
            seq = torch.tensor([s[i:i + P + G]])
            tp = hf_t(input_ids=seq).logits[0].argmax(-1)
            dp = hf_d(input_ids=seq).logits[0].argmax(-1)
        agree += (tp[P - 1:] == dp[P - 1:]).sum().item()  # host sync: eval only
        total += len(tp[P - 1:])
        for k in (4, 8):
            tr = make_runner(eng.pair.target, ctx)
            _, st = generate(tr, prompt, G // 2, Sampling(), ModelDrafter(draft_runner, Sampling()),
                             AdaptiveK(k, k, k))
            taus[k].append(st.accepted_per_forward)
    if a.continuations:  # --continuations 0: not measured
        res["degenerate_rate_model"] = deg_model / a.continuations
        res["degenerate_rate_real_code"] = deg_real / a.continuations
        res["draft_greedy_agreement"] = agree / total
        for k in (4, 8):
            res[f"tau_k{k}"] = float(np.mean(taus[k]))
    res.update(cold_start(a.target, a.draft))
    res["params_target_M"] = sum(p.numel() for p in hf_t.parameters()) / 1e6
    res["params_draft_M"] = sum(p.numel() for p in hf_d.parameters()) / 1e6
    for k, v in res.items():
        print(f"{k:28s} {v:.4f}" if isinstance(v, float) else f"{k:28s} {v}")
    from record import write  # bench/, the script's directory

    print(f"wrote {write(f'evaluate_pair_{a.source}', res, threads=torch.get_num_threads(), path=a.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
