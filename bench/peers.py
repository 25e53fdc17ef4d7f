"""Ours vs llama.cpp vs HF transformers, in one run, on the same machine and the same models.

    python bench/peers.py [--shapes embedded,0.5b,1.5b] [--layouts llama,qwen2] [--n 4]
                          [--quants none,auto,fast-int8,fast-int8@2] [--no-hf] [--no-server] [--threads 2]
                          [--device cuda --no-llamacpp --out DIR]   (bench/gpu_check.sh)

Models: the embedded pair (draft_models/default), and random-weight models at the
Qwen2.5-Coder-0.5B / 1.5B shapes (bf16 checkpoints, built once under bench/out/peers/), in the
Llama layout (no biases) and the Qwen2 layout (q/k/v biases). Every model is converted to GGUF
with llama.cpp's own converter (f32 for the embedded target, f16 and q8_0 for all), and to q4_0 and
Q4_K_M by llama-quantize when the cache has it.

Per model and method, medians over `--n` held-out FIM prompts (~445 tokens, greedy, 32 new
tokens, EOS ignored), methods interleaved prompt by prompt (the machine is shared and noisy:
compare only within one run):
- decode ms/token at the prompt's depth: ours and HF from (total - first token) / 31, ours over
  caches that hold the prompt (target and draft: what the engine's warmup leaves while the user
  types); llama.cpp from `llama-bench -p 0 -n 32 -d DEPTH`;
- prefill tokens/s over the prompt: ours from the target's prefill, HF from its first token,
  llama.cpp from `llama-bench -p DEPTH -n 0`;
- end to end ms for a 32-token completion from a cold cache: ours and HF in-process,
  llama.cpp through llama-server's /completion (`cache_prompt` off; one HTTP round trip).
Ours: plain (no drafter) in each `--quants` mode (`QUANT` or `DTYPE:QUANT`, e.g. `bf16:nf4` on
CUDA; `@N`: decode_threads=N, else 1), and the default (speculative: combined drafter, adaptive
k) where the model has a draft.
HF: float32 on the CPU, bfloat16 on CUDA. llama.cpp: `.ci/llamacpp.sh` builds it once.

Prints one table per model with ratios to llama.cpp (ours/llama.cpp: < 1 is faster), writes
peers.json and peers.png under --out (bench/out).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
MODELS = OUT / "peers"
NEW = 32
# Qwen2.5-Coder shapes (config.json of the published checkpoints); weights are random here
SHAPES = {"0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                   "num_attention_heads": 14, "num_key_value_heads": 2},
          "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                   "num_attention_heads": 12, "num_key_value_heads": 2}}


def llamacpp_dir() -> Path:
    r = subprocess.run(["bash", str(ROOT / ".ci" / "llamacpp.sh")], check=False,
                       capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp build failed: {r.stderr.strip()[-400:]}")
    return Path(r.stdout.strip().splitlines()[-1])


def random_model(shape: str, layout: str, device: str) -> Path:
    """A random-weight bf16 checkpoint at a Qwen2.5-Coder shape, with the embedded tokenizer
    (GGUF conversion needs one; token ids past its 8192 are never fed)."""
    d = MODELS / f"{shape}-{layout}"
    if (d / "config.json").is_file():
        return d
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    C, M = (Qwen2Config, Qwen2ForCausalLM) if layout == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    cfg = C(vocab_size=151936, max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=1e6,
            rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0, pad_token_id=0, **SHAPES[shape])
    torch.manual_seed(0)
    with torch.device("cuda" if device == "cuda" else "cpu"):  # initialising 1.5B on 2 cores takes minutes
        model = M(cfg).to(torch.bfloat16).eval()
    if layout == "qwen2":
        with torch.no_grad():  # HF initialises biases at zero: draw them, so they count
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.02)
    model.save_pretrained(d)
    from draft_models import DEFAULT_TARGET

    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).write_bytes((Path(DEFAULT_TARGET) / f).read_bytes())
    return d


QUANTIZED = ("q4_0", "q4_k_m")  # made from the f16 GGUF by llama-quantize (what most local users run)


def gguf(cache: Path, model: Path, outtype: str) -> Path:
    out = MODELS / "gguf" / f"{model.name}-{outtype}.gguf"
    if outtype in QUANTIZED and not out.is_file():  # the converter writes f32/f16/q8_0 only
        r = subprocess.run([str(cache / "bin" / "llama-quantize"), str(gguf(cache, model, "f16")), str(out),
                            outtype.upper()], check=False, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"llama-quantize {outtype} of {model} failed: {r.stderr.strip()[-600:]}")
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, str(cache / "src" / "convert_hf_to_gguf.py"), str(model),
                            "--outtype", outtype, "--outfile", str(out)], check=False, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"GGUF conversion of {model} failed: {r.stderr.strip()[-600:]}")
    return out


def llama_bench(cache: Path, m: Path, threads: int, *, decode_depth: int = 0, prefill: int = 0) -> float:
    """One llama-bench measurement: decode ms/token at a depth, or prefill tokens/s."""
    args = ["-p", "0", "-n", str(NEW), "-d", str(decode_depth)] if decode_depth else ["-p", str(prefill), "-n", "0"]
    r = subprocess.run([str(cache / "bin" / "llama-bench"), "-m", str(m), *args, "-t", str(threads), "-r", "1",
                        "-o", "json"], check=False, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llama-bench on {m} failed: {r.stderr.strip()[-400:]}")
    ts = json.loads(r.stdout)[0]["avg_ts"]
    return 1e3 / ts if decode_depth else ts


class Server:
    """llama-server on one GGUF, for end-to-end completions."""

    def __init__(self, cache: Path, m: Path, threads: int, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.p = subprocess.Popen([str(cache / "bin" / "llama-server"), "-m", str(m), "--port", str(port), "-c", "1024",
                                   "-t", str(threads), "-np", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise SystemExit(f"llama-server on {m} did not come up")

    def complete_ms(self, prompt: list[int]) -> float:
        body = json.dumps({"prompt": prompt, "n_predict": NEW, "cache_prompt": False, "ignore_eos": True,
                           "temperature": 0}).encode()
        req = urllib.request.Request(self.url + "/completion", body, {"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
        return (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        self.p.terminate()
        self.p.wait()


def ours(model_dir: Path | None, spec: str, speculative: bool, device: str):
    """A method: our engine through its public API, as the language server drives it, on one prompt
    → (decode ms/token, prefill tokens/s, end-to-end ms, τ). Each call is a new document: `prefill`
    (the warmup the server runs while the user types: the target's cache, and the draft's while
    the document's schedule drafts), then `complete_ids` (the scheduler, the step batcher, the
    document's drafters and adaptive k). `spec`: [DTYPE:]QUANT[@DECODE_THREADS]."""
    from completer.engine.engine import Engine, EngineConfig

    spec, _, threads = spec.partition("@")
    dtype, _, quant = spec.rpartition(":")
    eng = Engine(EngineConfig(target=None if model_dir is None else str(model_dir), quant=quant,
                              dtype=dtype or "auto", device=device, decode_threads=int(threads or 1),
                              drafter="combined" if speculative else "none", max_draft_len=8))
    eng.warm_start()  # what every server does before its first request (AMX rows, step costs)
    n = iter(range(1 << 30))

    def run(prompt: list[int]) -> tuple[float, float, float, float | None]:
        doc = f"peers-{next(n)}"  # a cold document
        t0 = time.perf_counter()
        eng.prefill(prompt[:-1], doc_key=doc)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        ids, st = eng.complete_ids(prompt, doc_key=doc, max_new=NEW)
        run.runner = type(eng.caches[doc].target).__name__ + run.costs  # the runner the engine chose
        eng.forget(doc)
        # decode: after the first token, over the warmed prompt; end to end: everything from cold
        return ((st.total_ms - st.ttft_ms) / max(len(ids) - 1, 1), len(prompt) / prefill_ms * 1e3,
                prefill_ms + st.total_ms, st.accepted_per_forward if speculative else None)
    run.runner, run.costs = "", ""
    if speculative and eng.step_costs[1]:  # what adaptive k plans with: c = draft step / target step, verify(8) / step
        run.costs = f" c={eng.step_costs[0]:.3f} v8={eng.step_costs[1][8]:.2f}"
    return run


def hf(model_dir: Path, device: str):
    from transformers import AutoModelForCausalLM

    dt = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dt).to(device).eval()

    def gen_ms(prompt: list[int], n: int) -> float:
        x = torch.tensor([prompt], device=device)
        t0 = time.perf_counter()
        with torch.inference_mode():  # generate() returns ids: its own host sync ends the timing
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, eos_token_id=None, pad_token_id=0)
        return (time.perf_counter() - t0) * 1e3

    def run(prompt: list[int]) -> tuple[float, float, float]:
        first, total = gen_ms(prompt, 1), gen_ms(prompt, NEW)
        return (total - first) / (NEW - 1), len(prompt) / first * 1e3, total
    return run


def measure(name: str, model_dir: Path | None, a, cache: Path | None, prompts: list[list[int]]) -> dict:
    """All methods on one model, interleaved prompt by prompt → {method: medians}."""
    hf_dir = model_dir or Path(__import__("draft_models").DEFAULT_TARGET)
    methods = {}
    for q in a.quants.split(","):
        methods[f"ours {q} plain"] = ours(model_dir, q, False, a.device)
    if model_dir is None:  # the embedded pair has a draft: the default is speculative
        for q in a.spec_quants.split(","):
            methods[f"ours {q} default (speculative)"] = ours(model_dir, q, True, a.device)
    if not a.no_hf:
        methods[f"HF generate() {'bf16' if a.device == 'cuda' else 'fp32'}"] = hf(hf_dir, a.device)
    ggufs = {}
    if cache is not None:
        quantize = (cache / "bin" / "llama-quantize").is_file()  # built by .ci/llamacpp.sh since issue 23
        for t in (["f32"] if model_dir is None else []) + ["f16", "q8_0"] + (list(QUANTIZED) if quantize else []):
            ggufs[t] = gguf(cache, hf_dir, t)
    depth = int(statistics.median(len(p) for p in prompts))
    keys = ("decode", "prefill", "e2e", "tau")
    rows: dict[str, dict[str, list[float]]] = {m: {k: [] for k in keys} for m in methods}
    rows.update({f"llama.cpp {t}": {k: [] for k in keys} for t in ggufs})
    for m in methods.values():  # warm up every path once (allocator, kernels)
        m(prompts[0])
    for p in prompts:
        for mname, m in methods.items():
            for key, v in zip(keys, m(p)):
                if v is not None:
                    rows[mname][key].append(v)
        for t, g in ggufs.items():
            rows[f"llama.cpp {t}"]["decode"].append(llama_bench(cache, g, a.threads, decode_depth=depth))
            rows[f"llama.cpp {t}"]["prefill"].append(llama_bench(cache, g, a.threads, prefill=depth))
    if not a.no_server:  # one server at a time (each holds its model); after the interleaved part
        for t, g in ggufs.items():
            s = Server(cache, g, a.threads, 18190)
            try:
                s.complete_ms(prompts[0])
                rows[f"llama.cpp {t}"]["e2e"] = [s.complete_ms(p) for p in prompts]
            finally:
                s.close()
    res = {m: {k: statistics.median(v) if v else None for k, v in r.items()} for m, r in rows.items()}
    for m, fn in methods.items():
        res[m]["runner"] = getattr(fn, "runner", "")
    _print(name, depth, len(prompts), res)
    return {"depth": depth, "prompts": len(prompts), "methods": res}


def _print(name: str, depth: int, n: int, res: dict) -> None:
    from steps import cpu_name

    refs = [m for m in res if m.startswith("llama.cpp")]
    print(f"\n== {name}: {n} prompts at depth ~{depth}, {NEW} new tokens, greedy (medians); {cpu_name()} ==")
    hdr = f"{'method':34s} {'decode ms/tok':>13s} " + " ".join(f"{'vs ' + r[10:]:>8s}" for r in refs) + \
        f" {'prefill tok/s':>13s} {'e2e 32 ms':>10s} {'tau':>5s}  runner"
    print(hdr)
    print("-" * len(hdr))

    def f(x, w, p=2):
        return f"{x:{w}.{p}f}" if x is not None else f"{'-':>{w}s}"
    for m, r in res.items():
        ratios = " ".join(f(r["decode"] / res[ref]["decode"], 7) + "x" if r["decode"] and res[ref]["decode"]
                          else f"{'-':>8s}" for ref in refs)
        print(f"{m:34s} {f(r['decode'], 13)} {ratios} {f(r['prefill'], 13, 0)} {f(r['e2e'], 10, 1)} "
              f"{f(r.get('tau'), 5)}  {r.get('runner', '')}")


def _plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.2 + 0.4 * max(len(r["methods"]) for r in results.values())
                                                      * len(results)), squeeze=False)
    for ax, (name, r) in zip(axes[:, 0], results.items()):
        names = list(r["methods"])
        vals = [r["methods"][n]["decode"] or 0 for n in names]
        ax.barh(names, vals, color=["#c63" if n.startswith("llama.cpp") else "#888" if n.startswith("HF")
                                    else "#4a7" for n in names])
        ax.set_title(f"{name}: decode ms/token at depth ~{r['depth']} (lower is faster)", fontsize=9)
        ax.invert_yaxis()
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="embedded", help="embedded,0.5b,1.5b")
    ap.add_argument("--layouts", default="llama,qwen2", help="layouts of the random-weight shapes")
    ap.add_argument("--n", type=int, default=4, help="prompts per model")
    ap.add_argument("--quants", default="none,auto,fast-int8,auto@2,fast-int8@2",
                    help="our plain decode: [DTYPE:]QUANT[@DECODE_THREADS] each")
    ap.add_argument("--spec-quants", default="auto,fast-int8,auto@2,fast-int8@2",
                    help="our speculative default (embedded pair), same form")
    ap.add_argument("--threads", type=int, default=2, help="torch and llama.cpp threads")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--no-server", action="store_true", help="skip llama-server's end-to-end column")
    ap.add_argument("--device", default="cpu", help="cpu | cuda (ours and HF; llama.cpp is the CPU build)")
    ap.add_argument("--out", default=str(OUT), help="where peers.json and peers.png go")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    a.no_server = a.no_server or a.no_llamacpp
    cache = None if a.no_llamacpp else llamacpp_dir()
    from heldout import fim_holes

    from completer.engine.engine import Engine, EngineConfig

    emb = Engine(EngineConfig(drafter="none", device="cpu"))  # its tokenizer makes the prompts
    holes = fim_holes(a.n, a.seed, ("more-itertools",), kind="start")
    prompts = [emb.fim_prompt(h.prefix, h.suffix, NEW) for h in holes]  # the prompt builder's budget
    del emb
    results = {}
    for shape in a.shapes.split(","):
        if shape == "embedded":
            results["embedded 10.3M pair"] = measure("embedded 10.3M pair", None, a, cache, prompts)
            continue
        for layout in a.layouts.split(","):
            name = f"Qwen2.5-Coder-{shape.upper()} shape, {layout} layout (random weights)"
            results[name] = measure(name, random_model(shape, layout, a.device), a, cache, prompts)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from record import write

    path = write("peers", {"threads": a.threads, "device": a.device, "new": NEW, "models": results},
                 threads=a.threads, path=out / "peers.json")
    _plot(results, out / "peers.png")
    print(f"\nwrote {path} and peers.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
