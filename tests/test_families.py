"""The model families of the lean runner (families.py) match HF's forward, generate exactly, and
load in every quant mode, where every CPU runner follows HF's own forward over the same quantized
products past the window; the FIM format table detects each family's spellings."""
from __future__ import annotations

import random

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    GemmaConfig,
    GemmaForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Starcoder2Config,
    Starcoder2ForCausalLM,
)

from completer.client import Chunk
from completer.engine.adaptive import AdaptiveK
from completer.engine.drafters import CombinedDrafter, FastPathDrafter, ModelDrafter, NgramDrafter
from completer.engine.families import Unsupported, layout_of
from completer.engine.models import load_model
from completer.engine.native_lib import native_or_none
from completer.engine.np_runner import eligible
from completer.engine.quant import Fp16Weight, Int4Weight, Int8Weight
from completer.engine.quant import _q as quant_matrix
from completer.engine.runner import HFRunner, LlamaRunner, LlamaWeights, lean_config_ok
from completer.engine.runner_factory import make_runner
from completer.engine.sampling import Sampling, warp
from completer.engine.speculative import generate
from completer.fim import FIM_FORMATS, FimFormat
from completer.prompt import fim_ids, render

torch.set_num_threads(1)
V = 256
CPU = torch.device("cpu")


def _rope(kind: str, **kw) -> dict:
    return {"rope_parameters": {"rope_type": kind, **kw}}


# family case → (config class, model class, that family's features switched on)
CASES = {
    "llama-linear": (LlamaConfig, LlamaForCausalLM,
                     dict(attention_bias=True, mlp_bias=True, **_rope("linear", factor=2.0, rope_theta=10000.0))),
    "llama-dynamic": (LlamaConfig, LlamaForCausalLM, _rope("dynamic", factor=2.0, rope_theta=10000.0)),
    "llama-llama3": (LlamaConfig, LlamaForCausalLM,
                     _rope("llama3", factor=8.0, rope_theta=500000.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=32)),
    "llama-yarn": (LlamaConfig, LlamaForCausalLM,
                   _rope("yarn", factor=4.0, rope_theta=10000.0, original_max_position_embeddings=32)),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": 16}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=True, **_rope("default", rope_theta=1e6))),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 32, "attention_bias": True}),
    "starcoder2": (Starcoder2Config, Starcoder2ForCausalLM, {"sliding_window": 16}),
    "gemma": (GemmaConfig, GemmaForCausalLM, {"head_dim": 16}),
}
EMBED_STD = {False: 0.1, True: 0.4}  # tied: the embedding is the LM head, whose scale spreads the logits
FAMILY_CASES = ["llama-linear", "mistral", "qwen2", "qwen3", "starcoder2", "gemma"]  # one per family


def family_model(case: str, hidden: int = 64, layers: int = 2, vocab: int = V, seed: int = 0, head: float = 8.0,
                 std: float = 0.1, **over):
    """A random-weight float32 model of `case` (GQA: 4 query heads over 2 KV heads). Every
    weight is drawn, biases and norms included, so each feature moves the logits; the LM head
    (or the tied embedding) is scaled by `head` (up: greedy decoding is not decided by
    near-ties); layer matrices are N(0, std)."""
    C, M, kw = CASES[case]
    cfg = C(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            bos_token_id=0, eos_token_id=0, pad_token_id=0, **{**kw, **over})
    torch.manual_seed(seed)
    m = M(cfg).eval()
    tied = m.get_output_embeddings().weight is m.get_input_embeddings().weight
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "embed" in name:  # small beside the layers' output, or decoding is a bigram walk
                p.normal_(0, EMBED_STD[tied] / (hidden ** 0.5 if cfg.model_type == "gemma" else 1))  # Gemma: ×√d
            elif p.dim() > 1:
                p.normal_(0, std if "lm_head" not in name else 1.0)
            elif name == "model.norm.weight":  # random signs: a tied head does not echo the input
                p.normal_(-1.0 if cfg.model_type == "gemma" else 0.0, 1.0)  # Gemma scales by 1 + w
            else:
                p.add_(torch.randn_like(p) * 0.2)
        if not tied:
            m.get_output_embeddings().weight.mul_(head / hidden ** 0.5)
    return m


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def torch_lean(model) -> LlamaRunner:
    """The torch forward (forward_many) for every feed, whatever make_runner would pick."""
    return LlamaRunner(LlamaWeights.from_hf(model))


def feed_with_rollback(runner, ids: list[int]) -> torch.Tensor:
    """Prefill, one decode step, a 9-token verify, a rollback of 5 and a re-feed: the logits
    of ids[:60] in order."""
    got = [runner.forward(ids[:20]), runner.forward(ids[20:21]), runner.forward(ids[21:30])[:4]]
    runner.truncate(25)
    got.append(runner.forward(ids[25:60]))
    return torch.cat(got)


@pytest.mark.parametrize("case", list(CASES))
def test_lean_and_hf_runners_match_hf_forward(case):
    m = family_model(case)
    ids = torch.randint(0, V, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = m(input_ids=torch.tensor([ids])).logits[0]
    lean = make_runner(m, kv_cache="f32")  # the engine's pick (native / NumPy step), the cache's arithmetic HF's
    assert isinstance(lean, LlamaRunner) and lean.layout.family == m.config.model_type
    for r in (torch_lean(m), lean, HFRunner(m)):  # HFRunner: crop works on sliding-window models too
        got = feed_with_rollback(r, ids)
        assert torch.allclose(got, ref, atol=2e-4 * float(ref.abs().max())), (case, type(r).__name__)


@pytest.mark.parametrize("case", ["mistral", "qwen3", "starcoder2", "gemma", "llama-yarn"])
def test_batched_step_matches_single_steps(case):
    """forward_many over several sequences at different depths (the batcher's step) gives each
    the logits of its own forward: per-sequence windows, RoPE positions and q/k norms."""
    from completer.engine.runner import forward_many

    w = LlamaWeights.from_hf(family_model(case))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (30, 7, 19)]
    feeds = [[5], [6, 7, 8], [9, 10]]
    alone, batched = [LlamaRunner(w) for _ in prompts], [LlamaRunner(w) for _ in prompts]
    for a, b, p in zip(alone, batched, prompts):
        a.forward(p)
        b.forward(p)
    want = [a.forward(f) for a, f in zip(alone, feeds)]
    for x, y in zip(want, forward_many(batched, feeds)):
        assert torch.allclose(x, y, atol=1e-4 * float(x.abs().max()))


def test_the_sliding_window_is_applied():
    """60 tokens over a window of 16: the same weights with full attention give other logits,
    and both runners follow the window (not only HF's own forward)."""
    ids = torch.randint(0, V, (60,), generator=torch.Generator().manual_seed(2)).tolist()
    for case in ("mistral", "starcoder2"):
        win, full = family_model(case), family_model(case, sliding_window=None)
        with torch.no_grad():
            a, b = win(input_ids=torch.tensor([ids])).logits[0], full(input_ids=torch.tensor([ids])).logits[0]
        assert torch.allclose(a[:16], b[:16], atol=1e-4) and not torch.allclose(a[16:], b[16:], atol=1e-2)
        assert make_runner(win).layout.sliding_window == 16 and make_runner(full).layout.sliding_window is None


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_hf_generate_plain_and_speculative(case):
    target = family_model(case, seed=1)
    draft = family_model(case, hidden=32, layers=1, seed=2)
    rng = random.Random(case)
    base = [rng.randrange(1, V) for _ in range(10)]
    prompt = base * 4  # repeats: the n-gram drafter finds matches; the window (16) is exceeded
    ref = hf_greedy(target, prompt, 14)
    table = {(a, b): (a * 7 + b) % (V - 1) + 1 for a in range(V) for b in range(0, V, 5)}
    for runner in (torch_lean, make_runner, HFRunner):
        drafters = {
            "none": None,
            "model": ModelDrafter(make_runner(draft), Sampling()),
            "ngram": NgramDrafter(),
            "fastpath": FastPathDrafter(table),
            "combined": CombinedDrafter(ModelDrafter(make_runner(draft), Sampling()), NgramDrafter(),
                                        FastPathDrafter(table), V),
        }
        for name, d in drafters.items():
            out, _ = generate(runner(target), prompt, 14, Sampling(), d, AdaptiveK(4, 1, 4) if d else None)
            assert out == ref, (case, runner.__name__, name)


def test_sampling_stays_distribution_exact_on_a_new_layout():
    """Chi-square on the first two sampled tokens of a StarCoder2-layout target (LayerNorm,
    biases, GELU MLP, a window of 2 over a 4-token context) with a disagreeing draft of another
    layout (Qwen3: q/k norm): the joint law must match the target's (exact enumeration)."""
    V6 = 6
    target = family_model("starcoder2", hidden=32, layers=1, vocab=V6, seed=7, head=1.0, sliding_window=2)
    draft = family_model("qwen3", hidden=32, layers=1, vocab=V6, seed=8, head=1.0, head_dim=8)
    s = Sampling(temperature=1.0, top_p=1.0)
    prompt = [1, 2, 3]
    with torch.no_grad():
        p1 = warp(target(torch.tensor([prompt])).logits[0, -1].float(), s)
        exp = torch.stack([p1[a] * warp(target(torch.tensor([prompt + [a]])).logits[0, -1].float(), s)
                           for a in range(V6)])
    tw, dw = LlamaWeights.from_hf(target), LlamaWeights.from_hf(draft)
    gen = torch.Generator().manual_seed(1234)
    counts = torch.zeros(V6, V6)
    n = 4000
    for _ in range(n):
        out, _ = generate(LlamaRunner(tw, 8), prompt, 2, s, ModelDrafter(LlamaRunner(dw, 8), s, gen),
                          AdaptiveK(3, 3, 3), gen=gen)
        counts[out[0], out[1]] += 1
    e = exp.flatten() * n
    keep = e >= 5  # chi-square validity: expected counts ≥ 5
    chi2 = float((((counts.flatten() - e) ** 2) / e)[keep].sum())
    dof = int(keep.sum()) - 1
    z = 3.09  # 99.9th percentile (Wilson–Hilferty); fixed seed, so deterministic
    crit = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    assert chi2 < crit, (chi2, crit, dof)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, str]:
    """One bf16 checkpoint directory per family (a 16-bit checkpoint, as published models are)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for case in FAMILY_CASES:
        family_model(case, seed=3, std=0.05).to(torch.bfloat16).save_pretrained(root / case)  # int4: small errors
        out[case] = str(root / case)
    return out


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_every_quant_mode_loads_and_generates(family_dirs, case):
    d = family_dirs[case]
    ids = torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    ref_w = load_model(d, CPU, torch.float32, "none")
    assert isinstance(ref_w, LlamaWeights)  # straight from config.json + safetensors
    ref = LlamaRunner(ref_w).forward(ids)
    kinds = {"auto": Fp16Weight, "fp16": Fp16Weight, "fast-int8": Int8Weight, "int4": Int4Weight, "mixed": Int4Weight}
    for quant, kind in kinds.items():
        w = load_model(d, CPU, torch.float32, quant)
        assert isinstance(w.layers[0][4], kind), quant  # the MLP's storage
        out = make_runner(w, kv_cache="f32").forward(ids)  # f16 (the default) rounds K/V: test_native_step
        exact = kind is Fp16Weight  # fp16 storage of a bf16 checkpoint: fp32 rounding only
        all4 = quant == "int4"  # 4-bit attention too: random weights' near-ties flip more often
        assert (out - ref).abs().max() < (1e-4 if exact else 0.25 if all4 else 0.15) * ref.abs().max(), quant
        agree = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
        assert agree == 1.0 if exact else agree > (0.6 if all4 else 0.8), (quant, agree)
        gen, _ = generate(make_runner(w), ids[:10], 6, Sampling())
        assert len(gen) == 6
    for quant in ("int8", "nf4"):  # bitsandbytes, through the HF path
        m = load_model(d, CPU, torch.float32, quant)
        r = make_runner(m)
        assert isinstance(r, HFRunner)
        gen, _ = generate(r, ids[:10], 6, Sampling(), NgramDrafter(), AdaptiveK(3))
        assert len(gen) == 6 and all(0 <= t < V for t in gen)


# ---- every runner honours every family feature, in every quant mode (issue 37) ----------------

class _F16Cache(DynamicCache):
    """HF's cache with K/V stored in fp16, as the native step's default cache keeps them."""

    def update(self, k, v, layer_idx, *args, **kwargs):
        return super().update(k.half().float(), v.half().float(), layer_idx, *args, **kwargs)


class _QLinear(torch.nn.Module):
    """An HF linear whose matrix is stored as quant.py stores it at precision `prec`."""

    def __init__(self, lin: torch.nn.Linear, prec: str):
        super().__init__()
        self.w, self.bias = quant_matrix(lin.weight.detach().clone(), prec), lin.bias
        self.weight = lin.weight  # unused: HFRunner reads the vocabulary's size from the head's

    def forward(self, x):
        y = x @ self.w.T
        return y if self.bias is None else y + self.bias


def hf_quantized(model, w: LlamaWeights):
    """`model` (HF, in place) with the storage `w` was given (`w.quant_groups`, see quant.py):
    each linear's matrix quantized per its group, the embedding rounded to `w.embed`'s width.
    Its products are the lean runners' (per output row; activations scaled per call over the
    same input), everything around them HF's own: masks, windows, norms, RoPE."""
    g = getattr(w, "quant_groups", {"attn": "none", "mlp": "none", "head": "none"})
    model.lm_head = _QLinear(model.lm_head, g["head"])  # before the embedding is rounded (a tied head is not)
    for name, mod in list(model.named_modules()):
        for child, lin in list(mod.named_children()):
            if isinstance(lin, torch.nn.Linear):
                setattr(mod, child, _QLinear(lin, g["attn" if "self_attn" in name else "mlp"]))
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        emb.copy_(emb.to(w.embed.dtype))
    return model


class Twin:
    """A runner under test whose every call is repeated on a reference runner (the same rows per
    call: int8 activations are scaled per call), each forward's logits checked against it."""
    greedy = None
    max_draft = None

    def __init__(self, runner, ref, check: LogitsCheck):
        self.runner, self.ref, self.check = runner, ref, check
        self.max_len, self.vocab_size, self.head_rows = runner.max_len, runner.vocab_size, None

    @property
    def ids(self) -> list[int]:
        return self.runner.ids

    def sync(self, seq: list[int]) -> list[int]:
        feed = self.runner.sync(seq)
        self.ref.truncate(len(self.runner.ids))
        return feed

    def truncate(self, n: int) -> None:
        self.runner.truncate(n)
        self.ref.truncate(n)

    def forward(self, new_ids: list[int]) -> torch.Tensor:
        out = self.runner.forward(new_ids)
        self.check(out, self.ref.forward(new_ids))
        return out


class LogitsCheck:
    """Equal up to float32 summation order (atol 2e-4 of the logits' range; 2e-3 with an fp16
    cache, where a key an ulp apart can round to the next fp16 value). Products with activations
    quantized per call (`noisy`: int8, int4) can flip an activation by one step when the glue
    before them rounds differently (test_native_step.close_int8): there each forward stays within
    5 % of the range, the greedy pick equal wherever the top two are further apart, and `tight`
    says whether most forwards were equal to float32 rounding. A window off by one key moves every
    forward past it by more than rounding (on fast-int8 StarCoder2: 2 % of the range, so only
    `tight` sees it); one ignored moves Mistral's logits by ~20 % of their range."""

    def __init__(self, noisy: bool, kv16: bool):
        self.tol = 2e-3 if kv16 else 2e-4
        self.noisy = noisy
        self.exact = self.seen = 0

    def __call__(self, got: torch.Tensor, ref: torch.Tensor) -> None:
        span = float(ref.abs().max())
        err = float((got - ref).abs().max())
        self.seen += 1
        self.exact += err <= self.tol * span
        loose = (0.05 if self.noisy else self.tol) * span
        assert err <= loose, f"logits {err:.3g} from the reference's (range {span:.3g})"
        top2 = ref.topk(2, -1).values
        clear = top2[:, 0] - top2[:, 1] > 2 * loose
        assert torch.equal(got.argmax(-1)[clear], ref.argmax(-1)[clear]), "a clear greedy pick differs"

    @property
    def tight(self) -> bool:
        return self.exact >= 0.75 * self.seen


QUANT_NOISY = {"none": False, "fp16": False, "fast-int8": True, "int4": True, "mixed": True}
WINDOWED = [c for c in FAMILY_CASES if CASES[c][2].get("sliding_window")]  # mistral, starcoder2 (16)
# (case, quant, backend): windowed families in every mode on the native library's products, and in
# the modes fbgemm packs (int4 without the library is dequantized per call on the torch forward,
# the native backend's runner too); the other families in float32 and fast-int8 on both
RUNNER_CASES = [(c, q, "native") for c in WINDOWED for q in QUANT_NOISY] + [
    (c, q, "fbgemm") for c in WINDOWED for q in ("none", "fp16", "fast-int8")] + [
    (c, q, b) for c in FAMILY_CASES if c not in WINDOWED for q in ("none", "fast-int8") for b in ("native", "fbgemm")]


@pytest.mark.parametrize("case, quant, backend", RUNNER_CASES)
def test_every_runner_follows_hf_in_every_quant_mode(family_dirs, monkeypatch, case, quant, backend):
    """Each CPU runner make_runner picks (the native step with its fp16 and float32 caches, the
    NumPy step, the torch forward), in each lean quant mode, generates past the family's window
    (prompts of 40 tokens, window 16): plain, then speculative on a prompt that shares 30 tokens
    with the first (the per-file cache kept and cut, verifies of several rows, rollbacks). Every
    forward is checked against HF's own forward over the same quantized products (hf_quantized),
    fed the same calls. backend fbgemm: the native library off (COMPLETER_NATIVE=0), where
    matrices are packed for fbgemm and the NumPy step serves."""
    if backend == "fbgemm":
        monkeypatch.setenv("COMPLETER_NATIVE", "0")
    elif native_or_none() is None:
        pytest.skip("the native step is not built here (test_native_step says why)")
    d = family_dirs[case]
    w = load_model(d, CPU, torch.float32, quant)
    ref_model = hf_quantized(AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval(), w)
    draft = make_runner(family_model(case, hidden=32, layers=1, seed=9))
    rng = random.Random(case)
    base = [rng.randrange(1, V) for _ in range(10)]
    first = base * 4
    second = first[:30] + [rng.randrange(1, V) for _ in range(10)]
    runners = {}
    for r in (LlamaRunner(w), make_runner(w, kv_cache="f32"), make_runner(w)):
        runners.setdefault((type(r).__name__, r.k.dtype), r)
    for (kind, kv), r in runners.items():
        ref = HFRunner(ref_model)
        if kv == torch.float16:
            ref.cache = _F16Cache()
        check = LogitsCheck(QUANT_NOISY[quant], kv == torch.float16)
        twin = Twin(r, ref, check)
        generate(twin, first, 12, Sampling())
        _, st = generate(twin, second, 12, Sampling(), ModelDrafter(draft, Sampling()), AdaptiveK(3, 1, 4))
        assert st.prefill_tokens == 10 and st.proposed > st.accepted  # the cache cut at 30; rejected drafts
        assert check.tight, (case, quant, kind, kv, check.exact, check.seen)
    step = {"native": "NativeRunner", "fbgemm": "NumpyRunner"}[backend]  # make_runner's pick where it takes w
    assert any(kind == step for kind, _ in runners) == eligible(w, native=backend == "native")

@pytest.mark.parametrize("case, fim", [("qwen2", "qwen"), ("starcoder2", "starcoder"), ("gemma", "codegemma")])
def test_engine_serves_a_family_checkpoint(tmp_path, case, fim):
    """A bf16 checkpoint directory with its tokenizer, through the engine with its defaults
    (--quant auto: fp16 storage): the FIM format is the family's, and the completion is HF's
    greedy continuation of the engine's own FIM prompt."""
    from transformers import AutoModelForCausalLM

    from completer.config import EngineConfig
    from completer.engine.engine import Engine

    tok = bpe(FAMILY_TOKENS[fim])
    family_model(case, vocab=tok.get_vocab_size(), seed=5).to(torch.bfloat16).save_pretrained(tmp_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    eng = Engine(EngineConfig(target=str(tmp_path), drafter="ngram", max_new_tokens=10))
    assert (eng.fim.name, eng.fim.layout) == (fim, "psm")
    assert isinstance(eng.pair.target, LlamaWeights) and isinstance(eng.pair.target.layers[0][1], Fp16Weight)
    prompt = eng.fim_prompt("def f(x):\n    return", "\n\nprint(f(2))\n")
    ids, _ = eng.complete_ids(prompt, max_new=10)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ref = hf_greedy(hf, prompt, 10)
    assert ids == ref[:len(ids)] and (len(ids) == 10 or ref[len(ids)] in eng.fim.eos), (ids, ref)


def test_a_family_outside_the_table_takes_the_hf_path(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from completer.engine.models import ModelError

    GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=64, n_layer=1, n_head=4, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(tmp_path)
    m = load_model(str(tmp_path), CPU, torch.float32, "auto")
    assert isinstance(make_runner(m), HFRunner) and len(generate(make_runner(m), [1, 2, 3], 4, Sampling())[0]) == 4
    with pytest.raises(ModelError, match="needs a model of a lean family"):
        load_model(str(tmp_path), CPU, torch.float32, "fast-int8")


def test_hf_path_rolls_back_a_hybrid_window_model():
    """Gemma2 (outside the table: alternating sliding and full layers) on the HF path: a cache
    that keeps every position crops, and the model still masks each layer by its own window."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    m = Gemma2ForCausalLM(Gemma2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                                       max_position_embeddings=128, bos_token_id=0, eos_token_id=0,
                                       pad_token_id=0)).eval()
    assert m.config.layer_types == ["sliding_attention", "full_attention"]
    ids = torch.randint(0, V, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = m(input_ids=torch.tensor([ids])).logits[0]
    r = make_runner(m)
    assert isinstance(r, HFRunner)
    assert torch.allclose(feed_with_rollback(r, ids), ref, atol=1e-4 * float(ref.abs().max()))


def test_rope_frequencies_are_hfs():
    """Each scaling type's inverse frequencies and cos/sin factor equal HF's rope init functions."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from completer.engine.families import rope_of

    for case in ("llama-linear", "llama-dynamic", "llama-llama3", "llama-yarn"):
        cfg = family_model(case, layers=1).config
        kind = cfg.rope_parameters["rope_type"]
        want, scale = ROPE_INIT_FUNCTIONS[kind](cfg, CPU)
        got, gscale = rope_of(cfg.to_dict()).inv_freq(cfg.head_dim, cfg.max_position_embeddings)
        assert torch.equal(got, want) and gscale == scale, case
    yarn = family_model("llama-yarn", layers=1, rope_parameters={
        "rope_type": "yarn", "factor": 8.0, "rope_theta": 10000.0, "original_max_position_embeddings": 16,
        "mscale": 0.9, "mscale_all_dim": 0.8, "beta_fast": 16}).config
    want, scale = ROPE_INIT_FUNCTIONS["yarn"](yarn, CPU)
    got, gscale = rope_of(yarn.to_dict()).inv_freq(yarn.head_dim, yarn.max_position_embeddings)
    assert torch.equal(got, want) and gscale == scale != 1.0


def test_config_spellings_and_refusals():
    """config.json files from older transformers (rope_theta + rope_scaling with "type"), and
    what the table refuses: those models take the generic HF path."""
    old = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 5e5,
           "rope_scaling": {"type": "linear", "factor": 4.0}}
    r = layout_of(old).rope
    assert (r.kind, r.theta, r.factor) == ("linear", 5e5, 4.0)
    qwen = layout_of({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4})
    assert qwen.qkv_bias and not qwen.o_bias and not qwen.tied_embeddings
    sc = layout_of({"model_type": "starcoder2", "hidden_size": 64, "num_attention_heads": 4})
    assert (sc.norm, sc.act, sc.mlp_bias, sc.tied_embeddings, sc.norm_eps) == ("layer", "gelu_mlp", True, True, 1e-5)
    assert layout_of({"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4}).sliding_window == 4096
    bad = [{"model_type": "gpt2"}, {**old, "rope_scaling": {"type": "longrope", "factor": 2.0}},
           {**old, "rope_scaling": {"type": "linear"}},
           {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "use_sliding_window": True},
           {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4,
            "layer_types": ["sliding_attention", "full_attention"]},
           {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "hidden_act": "relu"}]
    for cfg in bad:
        with pytest.raises(Unsupported):
            layout_of(cfg)
        assert not lean_config_ok(cfg)
    with pytest.raises(Unsupported, match="model type 'gpt2'"):
        layout_of(bad[0])
    dyn = family_model("llama-dynamic", layers=1)
    with pytest.raises(ValueError, match="dynamic NTK"):
        make_runner(dyn, max_len=256)  # past max_position_embeddings (128): HF rescales every position


# ---- FIM formats -------------------------------------------------------------------------------

def bpe(special: list[str]) -> Tokenizer:
    """A small byte-level BPE carrying a family's special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=special, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


FAMILY_TOKENS = {  # a tokenizer's special tokens → the format detected
    "qwen": ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
             "<|repo_name|>", "<|file_sep|>", "<|im_end|>"],
    "codegemma": ["<eos>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|file_separator|>"],
    "starcoder": ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                  "<repo_name>", "<file_sep>"],
    "completer": ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<pad>"],
    "deepseek": ["<｜end▁of▁sentence｜>", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "<|EOT|>"],
    "codellama": ["</s>", "▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"],
    "codestral": ["</s>", "[SUFFIX]", "[PREFIX]"],
    "none": ["<|endoftext|>"],
}


@pytest.mark.parametrize("name", list(FAMILY_TOKENS))
def test_fim_format_detected_from_special_tokens(name):
    tok = bpe(FAMILY_TOKENS[name])
    fmt = FimFormat.detect(tok)
    spec = FIM_FORMATS[name]
    assert fmt.name == name and fmt.layout == spec.layout
    ids = {tok.id_to_token(i) for i in fmt.eos}
    assert ids and ids <= set(FAMILY_TOKENS[name])  # the stops this tokenizer has
    prompt = fim_ids(tok, fmt, "def f(x):\n    ", "\n    return y\n", 64)
    sent = [t for t in prompt if tok.id_to_token(t) in FAMILY_TOKENS[name]]
    if spec.layout == "psm":
        assert sent == [fmt.prefix, fmt.suffix, fmt.middle] and prompt[0] == fmt.prefix and prompt[-1] == fmt.middle
    elif spec.layout == "spm":  # the prompt ends at the cursor
        assert sent == [fmt.suffix, fmt.middle] and prompt[0] == fmt.suffix
        assert tok.decode(prompt[prompt.index(fmt.middle) + 1:]) == "def f(x):\n    "
    else:
        assert tok.decode(prompt) == "def f(x):\n    "


def test_starcoder2_is_psm_and_the_embedded_pair_spm():
    """Both spell <fim_*>; StarCoder2's tokenizer also has <fim_pad>/<file_sep> (or the config says
    starcoder2); ours has neither and was trained SPM-first."""
    from completer.engine.models import load_tokenizer
    from draft_models import DEFAULT_TARGET

    ours = load_tokenizer(str(DEFAULT_TARGET))
    assert (FimFormat.detect(ours).name, FimFormat.detect(ours).layout) == ("completer", "spm")
    assert FimFormat.detect(ours, model_type="starcoder2").layout == "psm"
    assert FimFormat.detect(bpe(FAMILY_TOKENS["starcoder"])).layout == "psm"
    gemma = bpe(["<eos>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"])
    assert FimFormat.detect(gemma).name == "qwen" and FimFormat.detect(gemma, model_type="gemma").name == "codegemma"


def test_fim_override_and_bad_names():
    tok = bpe(FAMILY_TOKENS["starcoder"])
    assert FimFormat.detect(tok, "completer").layout == "spm"  # the option wins over detection
    assert FimFormat.detect(tok, "none").layout == "none"
    with pytest.raises(ValueError, match="expected auto or one of"):
        FimFormat.detect(tok, "starcoder3")
    with pytest.raises(ValueError, match="lacks"):
        FimFormat.detect(tok, "qwen")


def test_render_text_prompts_for_remote_servers():
    assert render("qwen", "P", "S") == "<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>"
    assert render("starcoder", "P", "S") == "<fim_prefix>P<fim_suffix>S<fim_middle>"
    assert render("completer", "P", "S") == "<fim_suffix>S<fim_middle>P"
    assert render("deepseek", "P", "S") == "<｜fim▁begin｜>P<｜fim▁hole｜>S<｜fim▁end｜>"
    assert render("codellama", "P", "S") == "<PRE> P <SUF>S <MID>"
    assert render("codestral", "P", "S") == "[SUFFIX]S[PREFIX]P"
    assert render("none", "P", "S") == "P"
    assert "<|file_separator|>" in FIM_FORMATS["codegemma"].stops and "<EOT>" in FIM_FORMATS["codellama"].stops
    assert (FIM_FORMATS["qwen"].repo_name, FIM_FORMATS["starcoder"].file_sep) == ("<|repo_name|>", "<file_sep>")
    with pytest.raises(ValueError):
        render("auto", "P", "S")


CHUNKS = (Chunk("pkg/geometry.py", "def area(w, h):\n    ..."), Chunk("web/util.ts", "export function f() {}\n"))


@pytest.mark.parametrize("name", [n for n in FAMILY_TOKENS if n != "codellama"])  # its "<PRE> " is "▁<PRE>"
def test_repository_context_is_one_rendering_for_tokens_and_text(name):
    """The engine's token prompt with chunks of other files is the OpenAI client's text prompt,
    token for token: file separators where the family has them (before its FIM prompt), else a
    path comment per chunk at the start of the prefix."""
    tok = bpe(FAMILY_TOKENS[name])
    fmt = FimFormat.detect(tok)
    prefix, suffix = "def f(x):\n    return area(", ")\n"
    prompt = fim_ids(tok, fmt, prefix, suffix, 200, CHUNKS)
    assert tok.decode(prompt, skip_special_tokens=False) == render(name, prefix, suffix, CHUNKS)
    sep = FIM_FORMATS[name].file_sep
    if sep is not None:
        assert prompt[0] == tok.token_to_id(sep) and prompt.count(tok.token_to_id(sep)) == len(CHUNKS)
    else:
        assert "# pkg/geometry.py\ndef area(w, h):\n    ...\n\n// web/util.ts\n" in render(name, prefix, suffix, CHUNKS)


def test_chunks_count_in_the_budget_and_stay_whole():
    """Chunks are kept whole and in order while they take at most half the budget; the prompt
    never exceeds it; a context that fits is taken whole (no second cut of the suffix)."""
    tok = bpe(FAMILY_TOKENS["completer"])
    fmt = FimFormat.detect(tok)
    big = (CHUNKS[0], Chunk("big.py", "x = 1\n" * 400), CHUNKS[1])
    prompt = fim_ids(tok, fmt, "y = 2\n" * 100, "", 120, big)
    text = tok.decode(prompt, skip_special_tokens=False)
    assert len(prompt) <= 120 and "# pkg/geometry.py" in text and "big.py" not in text and "util.ts" not in text
    suffix = "    return y\n" * 12  # most of the prompt: more than the 25 % share of a raw cut
    whole = fim_ids(tok, fmt, "def f(x):\n", suffix, 80)  # 50 + 7 tokens: fits
    assert tok.decode(whole, skip_special_tokens=False) == render("completer", "def f(x):\n", suffix)


def test_special_strings_in_a_chunk_stay_text():
    """A chunk's path and code are document text (prompt.encode_text): a literal separator or
    sentinel in them never becomes the family's special token."""
    tok = bpe(FAMILY_TOKENS["starcoder"])
    fmt = FimFormat.detect(tok)
    evil = (Chunk("a<file_sep>.py", "s = '<fim_prefix><file_sep><|endoftext|>'\n"),)
    prompt = fim_ids(tok, fmt, "x = ", "\n", 200, evil)
    specials = [tok.id_to_token(i) for i in prompt if tok.id_to_token(i) in FAMILY_TOKENS["starcoder"]]
    assert specials == ["<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
