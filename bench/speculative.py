"""Speculative decoding, side by side on held-out code: our loop with each drafter vs plain
greedy and the Hugging Face peers a Python user could pick instead, same target and prompts.
An ablation below the product (each drafter and fixed k over bare runners): what users get is
measured through the engine's public API by bench/peers.py and bench/decode.py.

    python bench/speculative.py [--n 16] [--new 48] [--target DIR --draft DIR]
                                [--quant none|fp16|...] [--draft-vocab N]

Prints a table (median ms/token, tokens/s, ratio to our plain loop and to HF assisted
generation, τ = tokens per target forward), acceptance by draft position, fast-path share, the
measured step-time ratio c = draft/target, and checks that every greedy method produced the same
ids. Writes bench/out/speculative.json and .png.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from heldout import fim_holes
from record import write

OUT = Path(__file__).resolve().parent / "out"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--n", type=int, default=16, help="prompts")
    ap.add_argument("--new", type=int, default=48, help="new tokens per prompt (EOS ignored)")
    ap.add_argument("--k", type=int, default=6, help="fixed draft length for the τ rows")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--quant", default="auto", help="our target's weights, for plain and speculative "
                    "alike (the HF peers run the float32 model)")
    ap.add_argument("--draft-vocab", type=int, default=2048, help="draft LM head rows (0 = all)")
    ap.add_argument("--no-hf", action="store_true", help="skip the HF generate() peers")
    ap.add_argument("--third-party", default="more-itertools")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM

    from completer.engine.calibrate import choose_amx_rows, measure_step_costs
    from completer.engine.drafters import (
        AdaptiveK,
        CombinedDrafter,
        ModelDrafter,
        NgramDrafter,
    )
    from completer.engine.engine import Engine, EngineConfig
    from completer.engine.native_lib import library
    from completer.engine.runner_factory import make_runner
    from completer.engine.sampling import Sampling
    from completer.engine.speculative import generate
    from draft_models import DEFAULT_DRAFT, DEFAULT_TARGET

    tdir, ddir = a.target or str(DEFAULT_TARGET), a.draft or str(DEFAULT_DRAFT)
    eng = Engine(EngineConfig(target=None if a.target is None else tdir, draft=None if a.target is None else ddir,
                              quant=a.quant, draft_vocab=a.draft_vocab))
    hf_t = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    hf_d = AutoModelForCausalLM.from_pretrained(ddir, dtype=torch.float32).eval()
    fast = eng.fastpath  # the embedded pair's fast-path table (None for other models)
    holes = fim_holes(a.n, a.seed, tuple(x for x in a.third_party.split(",") if x), kind="start")
    prompts = [eng.fim_prompt(h.prefix, h.suffix, a.new) for h in holes]  # the prompt builder's budget
    greedy = Sampling()
    V = eng.pair.target.embed.shape[0] if hasattr(eng.pair.target, "embed") else hf_t.config.vocab_size

    amx_rows = choose_amx_rows(eng.pair, eng.ctx, eng.cfg)  # as warm_start chooses it
    c = _step_ratio(eng, make_runner, prompts[0])
    eng.step_costs = costs = measure_step_costs(eng.pair, eng.ctx, eng.cfg, reps=5)  # what the adaptive k plans with
    # where fp16 products run on AMX-BF16 tiles, the same methods with them in registers too (the
    # native library's switch, per run: interleaved with the rest), each with its own measured costs
    lib = library()[0]
    amxh = lib.nstep_amxh_rows(-1) if lib is not None else 0
    registers_costs = None
    if amxh > 0:
        lib.nstep_amxh_rows(0)
        registers_costs = measure_step_costs(eng.pair, eng.ctx, eng.cfg, reps=5)
        lib.nstep_amxh_rows(amxh)

    # the draft as the engine stores it (draft_quant auto: int8 where the native step runs) and,
    # for the embedded pair, the same draft in fp16 (the default before), with its own costs
    fp16_draft = fp16_costs = None
    if a.target is None and eng.draft_quant != "fp16":
        import dataclasses

        from completer.engine.models import load_model, quantize_draft

        fp16_draft = load_model(ddir, torch.device("cpu"), torch.float32, "none")
        if eng.pair.draft.head_rows:
            fp16_draft.restrict_head(eng.pair.draft.head_rows)
        quantize_draft(fp16_draft, "fp16")
        fp16_costs = measure_step_costs(dataclasses.replace(eng.pair, draft=fp16_draft), eng.ctx, eng.cfg, reps=5)

    def ours(drafter_kind: str, fixed_k: int | None = None, registers: bool = False, fp16: bool = False):
        # adaptive: one schedule for the whole run, as the engine keeps one per document
        cs = registers_costs if registers else fp16_costs if fp16 else costs
        draft = fp16_draft if fp16 else eng.pair.draft
        adaptive = AdaptiveK(eng.cfg.draft_len, 1, eng.cfg.max_draft_len, cs[0], verify=cs[1])

        def run(prompt):
            if registers:
                lib.nstep_amxh_rows(0)
                try:
                    return go(prompt)
                finally:
                    lib.nstep_amxh_rows(amxh)
            return go(prompt)

        def go(prompt):
            tr = make_runner(eng.pair.target, eng.ctx)
            dr = make_runner(draft, eng.ctx)
            t0 = time.perf_counter()
            if drafter_kind in ("model", "combined"):  # the draft's prefill: in an editor the warmup's
                dr.forward(prompt[:-1])                # (off the decode path), counted end to end here
            pre_ms = (time.perf_counter() - t0) * 1e3
            model = ModelDrafter(dr, greedy)
            d = {"none": None, "model": model, "ngram": NgramDrafter(), "fastpath": fast,
                 "combined": CombinedDrafter(model, NgramDrafter(), fast, V)}[drafter_kind]
            k = AdaptiveK(fixed_k, fixed_k, fixed_k) if fixed_k else adaptive
            ids, st = generate(tr, prompt, a.new, greedy, d, k if d is not None else None)
            st.ttft_ms += pre_ms  # "decode" below starts after both prefills
            return ids, st
        return run

    def hf(**kw):
        def run(prompt, n=a.new):
            x = torch.tensor([prompt])
            with torch.inference_mode():
                out = hf_t.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                                    min_new_tokens=n, do_sample=False, eos_token_id=None,
                                    pad_token_id=0, **kw)
            return out[0, len(prompt):].tolist(), None
        return run

    def hf_first_token_ms(prompt) -> float:  # HF's prefill + first token, to split off its decode
        t0 = time.perf_counter()
        hf()(prompt, 1)
        return (time.perf_counter() - t0) * 1e3

    methods = {"plain (ours)": ours("none")}
    if not a.no_hf:
        methods.update({"HF generate()": hf(), "HF assisted (draft)": hf(assistant_model=hf_d),
                        "HF prompt lookup": hf(prompt_lookup_num_tokens=10)})
    methods.update({"ours: model": ours("model"), "ours: ngram": ours("ngram"),
                    "ours: fastpath": ours("fastpath"), "ours: combined": ours("combined"),
                    f"ours: model k={a.k}": ours("model", a.k),
                    f"ours: combined k={a.k}": ours("combined", a.k),
                    "ours: combined k=8": ours("combined", 8)})
    if fast is None:
        methods.pop("ours: fastpath")
    if fp16_draft is not None:
        methods["combined, fp16 draft"] = ours("combined", fp16=True)
    if registers_costs is not None:
        methods.update({"plain, fp16 in registers": ours("none", registers=True),
                        "combined, fp16 in regs": ours("combined", registers=True)})

    for run in methods.values():  # warm up every path once (allocator, oneDNN kernels)
        run(prompts[0])
    res = {name: {"ms_per_token": [], "decode_ms_per_token": [], "tau": [], "ids": [], "acc_pos": [0] * 16,
                  "prop_pos": [0] * 16, "by_source": {}} for name in methods}
    for p in prompts:
        first_ms = None if a.no_hf else hf_first_token_ms(p)
        for name, run in methods.items():  # interleaved: machine noise hits every method alike
            t0 = time.perf_counter()
            ids, st = run(p)
            dt = time.perf_counter() - t0
            r = res[name]
            r["ms_per_token"].append(dt * 1e3 / len(ids))
            # decode only: after the prompt's prefill and first token (the steady state of an
            # editor session, where the per-document cache already holds the prompt)
            ttft = st.ttft_ms if st is not None else first_ms
            if ttft is not None:
                r["decode_ms_per_token"].append((dt * 1e3 - ttft) / (len(ids) - 1))
            r["ids"].append(ids)
            if st is not None and st.target_forwards:
                r["tau"].append(st.accepted_per_forward)
                for i in range(16):
                    r["acc_pos"][i] += st.accept_by_pos[i]
                    r["prop_pos"][i] += st.proposed_by_pos[i]
                for src, (pr, ac) in st.by_source.items():
                    s = r["by_source"].setdefault(src, [0, 0])
                    s[0] += pr
                    s[1] += ac

    ref_ids = res["plain (ours)"]["ids"]
    base = statistics.median(res["plain (ours)"]["ms_per_token"])
    assisted = statistics.median(res["HF assisted (draft)"]["ms_per_token"]) if not a.no_hf else None
    print(f"\n{len(prompts)} held-out FIM prompts, {a.new} new tokens each, greedy; target {tdir} "
          f"(--quant {a.quant}), draft {ddir} (stored {eng.draft_quant}, {type(make_runner(eng.pair.draft, eng.ctx)).__name__}, "
          f"head over {len(eng.pair.draft.head_rows or []) or 'all'} tokens); {torch.get_num_threads()} threads")
    print(f"step-time ratio c = draft/target (1-token cached forward): {c['c']:.3f} "
          f"(target {c['target_ms']:.2f} ms, draft {c['draft_ms']:.2f} ms; "
          f"verify of 7 tokens = {c['verify7_ratio']:.2f}x a 1-token forward)")
    print("verify cost of k drafted tokens (target steps), as the adaptive k sees it: "
          + " ".join(f"{k}:{v:.2f}" for k, v in enumerate(costs[1])))
    if fp16_costs is not None:
        print(f"  the draft in fp16 (the 'fp16 draft' row): c {fp16_costs[0]:.3f} (stored {eng.draft_quant}: "
              f"{costs[0]:.3f})")
    if amx_rows is not None:
        print(f"  warm start's calibration: fp16 products of {amx_rows}+ rows on AMX-BF16 tiles")
    if registers_costs is not None:
        print(f"  fp16 products of {amxh}+ rows on AMX-BF16; with them in registers instead (the 'regs' rows): "
              + " ".join(f"{k}:{v:.2f}" for k, v in enumerate(registers_costs[1])))
    print()
    dbase = statistics.median(res["plain (ours)"]["decode_ms_per_token"])
    dassisted = statistics.median(res["HF assisted (draft)"]["decode_ms_per_token"]) if not a.no_hf else None
    print("end to end = (prefill + all tokens) / tokens; decode = after the first token, the prompt in the "
          "target's and the draft's caches (what an editor's warmup leaves)")
    hdr = (f"{'method':26s} {'ms/tok p50':>10s} {'vs plain':>9s} {'vs HF asst':>10s} {'decode ms/tok':>13s} "
           f"{'vs plain':>9s} {'vs HF asst':>10s} {'τ':>5s} {'same ids':>8s}")
    print(hdr)
    print("-" * len(hdr))
    table = {}
    for name, r in res.items():
        med = statistics.median(r["ms_per_token"])
        dmed = statistics.median(r["decode_ms_per_token"]) if r["decode_ms_per_token"] else float("nan")
        same = sum(x == y for x, y in zip(r["ids"], ref_ids))
        tau = statistics.mean(r["tau"]) if r["tau"] else float("nan")
        row = {"ms_per_token_p50": med, "tokens_per_s": 1e3 / med, "vs_plain": base / med,
               "vs_hf_assisted": (assisted / med) if assisted else None, "tau": tau,
               "decode_ms_per_token_p50": dmed, "decode_vs_plain": dbase / dmed,
               "decode_vs_hf_assisted": (dassisted / dmed) if dassisted else None,
               "same_ids": f"{same}/{len(ref_ids)}",
               "accept_by_pos": [ac / pr if pr else None for ac, pr in zip(r["acc_pos"], r["prop_pos"])][:8],
               "by_source": r["by_source"], "decode_ms_per_token_by_prompt": r["decode_ms_per_token"]}
        table[name] = row
        vs_a = f"{row['vs_hf_assisted']:.2f}x" if assisted else "-"
        dvs_a = f"{row['decode_vs_hf_assisted']:.2f}x" if dassisted else "-"
        print(f"{name:26s} {med:10.2f} {base / med:8.2f}x {vs_a:>10s} {dmed:13.2f} {dbase / dmed:8.2f}x "
              f"{dvs_a:>10s} {tau:5.2f} {row['same_ids']:>8s}")
    print("\nacceptance by draft position (share of proposals at position i that were accepted):")
    for name, row in table.items():
        if any(x is not None for x in row["accept_by_pos"]):
            print(f"  {name:26s} " + " ".join("  -  " if x is None else f"{x:.2f}" for x in row["accept_by_pos"]))
    print("\nproposals by source [proposed, accepted]:")
    for name, row in table.items():
        if row["by_source"]:
            print(f"  {name:26s} {row['by_source']}")
    path = write("speculative", {"step_ratio": c, "verify_costs": costs[1], "n": len(prompts), "new": a.new,
                                 "quant": a.quant, "draft_vocab": a.draft_vocab, "threads": torch.get_num_threads(),
                                 "prompts": [h.file for h in holes], "methods": table},
                 threads=torch.get_num_threads())
    _plot(table, OUT / "speculative.png")
    print(f"\nwrote {path} and speculative.png")
    return 0


def _step_ratio(eng, make_runner, prompt) -> dict:
    def timed(runner, ids, reps=30):
        runner.forward(prompt)
        n0 = len(runner.ids)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            runner.forward(ids)
            ts.append(time.perf_counter() - t0)
            runner.truncate(n0)
        return statistics.median(ts) * 1e3
    t1 = timed(make_runner(eng.pair.target, eng.ctx), [5])
    t7 = timed(make_runner(eng.pair.target, eng.ctx), [5] * 7)
    d1 = timed(make_runner(eng.pair.draft, eng.ctx), [5])
    return {"target_ms": t1, "draft_ms": d1, "c": d1 / t1, "verify7_ratio": t7 / t1}


def _plot(table: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(table)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh(names, [table[n]["tokens_per_s"] for n in names], color="#4a7")
    ax.set_xlabel("tokens/s (median over prompts)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
