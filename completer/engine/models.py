"""Loading a target/draft pair: the embedded default or any HF causal LMs by path or hub id,
with optional quantization of the target. Errors are `ModelError` with one clear sentence."""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..client import EngineError
from ..config import OPTIONS

# The schema's lists are the only ones (config.py's quant, dtype and device options).
# int8 / nf4: bitsandbytes (the memory-capacity path, any HF model); fp16 / fast-int8 / mixed:
# our lean runner's weights (every family of families.py), see quant.py. auto: fp16 storage where
# it is lossless in practice and faster (a 16-bit checkpoint computed in fp32 on the CPU: a
# verify forward over 7 tokens costs ~1.2 single steps instead of ~2.1-2.5 with MKL's fp32
# GEMM, see bench/speculative.py), else none.
QUANT_MODES: tuple[str, ...] = OPTIONS["quant"].meta["choices"]
DTYPE_NAMES: tuple[str, ...] = OPTIONS["dtype"].meta["choices"]
LEAN_MODES = ("fp16", "fast-int8", "int4", "mixed")  # of QUANT_MODES: our lean runner's (the others: bitsandbytes)


class ModelError(EngineError):
    """A model or tokenizer that cannot be used; the message is meant for the user."""
    code = "model"


@dataclass
class Pair:
    target: torch.nn.Module
    draft: torch.nn.Module | None
    tokenizer: object  # tokenizers.Tokenizer (Rust, fast)
    target_name: str
    draft_name: str | None
    device: torch.device


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    valid, allowed = OPTIONS["device"].meta["check"]
    if not valid(device):
        raise ModelError(f"--device {device}: expected {allowed}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"--device {device}: CUDA is not available on this machine")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype not in DTYPE_NAMES:
        raise ModelError(f"--dtype {dtype}: expected one of {', '.join(DTYPE_NAMES)}")
    if dtype == "auto":
        # fp32 on CPU: without AVX-512/AMX (e.g. AVX2 EPYC) bf16 is emulated and ~20x slower.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
            "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}[dtype]


def _check_dir(name: str) -> None:
    p = Path(name)
    looks_local = p.is_absolute() or name.startswith((".", "~")) or p.exists() or name.count("/") != 1
    if looks_local:
        if not p.is_dir():
            raise ModelError(f"model directory not found: {name}")
        if not (p / "config.json").is_file():
            raise ModelError(f"{name} is not a Hugging Face model directory (no config.json)")


def load_tokenizer(name: str):
    """The fast (Rust) tokenizer of a model directory or hub id."""
    tj = Path(name) / "tokenizer.json"
    try:
        if tj.is_file():
            from tokenizers import Tokenizer
            return Tokenizer.from_file(str(tj))
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(name).backend_tokenizer
    except Exception as e:  # noqa: BLE001 - any loader failure is the user's model, say so plainly
        raise ModelError(f"cannot load the tokenizer of {name}: {e}") from None


def _quant_config(quant: str, dtype: torch.dtype):
    if quant in ("auto", "none", *LEAN_MODES):
        return None
    from transformers import BitsAndBytesConfig
    if quant == "int8":
        import logging
        # bitsandbytes logs one warning per matmul when activations are fp32 (they are cast to fp16)
        logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0)
    if quant == "nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_compute_dtype=dtype)
    raise ModelError(f"--quant {quant}: expected one of {', '.join(QUANT_MODES)}")


def load_model(name: str, device: torch.device, dtype: torch.dtype, quant: str = "none",
               lean: bool = True, quant_groups: str | None = None):
    """A directory of a lean family (families.py) loads straight into shared fused weights (no
    transformers import: seconds off a CPU cold start); anything else goes through
    AutoModelForCausalLM."""
    if quant == "auto":
        model = load_model(name, device, dtype, "none", lean)
        fp16_if_pays(model)
        return model
    if quant in LEAN_MODES:
        from .quant import DEFAULT_GROUPS, MODE_GROUPS, quantize_weights
        from .runner import LlamaWeights, lean_supported
        model = load_model(name, device, dtype, "none", True)
        if not isinstance(model, LlamaWeights):
            if not lean_supported(model):
                from .families import FAMILIES
                raise ModelError(f"--quant {quant} needs a model of a lean family ({', '.join(FAMILIES)}); "
                                 f"{name} is {model.config.model_type} (use int8 or nf4)")
            model = LlamaWeights.from_hf(model)
        try:
            quantize_weights(model, MODE_GROUPS.get(quant) or quant_groups or DEFAULT_GROUPS)
        except (ValueError, RuntimeError) as e:
            raise ModelError(f"--quant {quant}: {e}") from None
        return model
    cfg_path = Path(name) / "config.json"
    if lean and quant == "none" and cfg_path.is_file():
        import json

        from .runner import LlamaWeights, lean_config_ok
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot read {cfg_path}: {e}") from None
        if lean_config_ok(cfg) and any(Path(name).glob("*.safetensors")):
            try:
                return LlamaWeights.from_dir(name, dtype, device)
            except (KeyError, OSError, ValueError, RuntimeError) as e:
                raise ModelError(f"cannot load model {name}: {type(e).__name__}: {e}") from None
    from transformers import AutoModelForCausalLM
    try:
        kw = {}
        q = _quant_config(quant, dtype)
        if q is not None:
            kw = {"quantization_config": q, "device_map": str(device)}
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **kw)
    except ModelError:
        raise
    except ImportError as e:
        raise ModelError(f"--quant {quant} is not available here ({e}): pip install 'completer[quant]'"
                         " (bitsandbytes, accelerate)") from None
    except Exception as e:  # noqa: BLE001
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"cannot load model {name}: {first}") from None
    if q is None:
        model = model.to(device)
    elif quant == "nf4" and device.type == "cpu":
        _check_nf4_cpu(model, name)
    return model.eval()


def _check_nf4_cpu(model, name: str) -> None:
    """bitsandbytes' CPU 4-bit kernel repacks each weight by rows of `blocksize` inputs and fails
    at the first forward (a reshape error) when a layer's input width is not a multiple of it."""
    for mod_name, m in model.named_modules():
        state = getattr(getattr(m, "weight", None), "quant_state", None)
        block = getattr(state, "blocksize", None)
        if block and getattr(m, "in_features", 0) % block:
            raise ModelError(f"--quant nf4 on the CPU needs layer input widths divisible by {block} "
                             f"(bitsandbytes); {name}'s {mod_name} takes {m.in_features}: use fast-int8 "
                             "or mixed (ours), or nf4 on CUDA")


def fp16_if_pays(model) -> bool:
    """--quant auto's rule applied to a loaded model: its matrices stored in fp16 where _fp16_pays
    (the draft's under draft_quant fp16: it proposes the same tokens, since its bf16 values survive
    fp16)."""
    from .runner import LlamaWeights

    if not isinstance(model, LlamaWeights) or not _fp16_pays(model, model.device, model.dtype):
        return False
    from .quant import MODE_GROUPS, quantize_weights
    quantize_weights(model, MODE_GROUPS["fp16"])
    return True


DRAFT_QUANTS = ("auto", "none", "fp16", "int8", "int4")
DRAFT_GROUPS = {"int8": "embed=fp16,attn=int8,mlp=int8,head=int8",
                "int4": "embed=fp16,attn=int4,mlp=int4,head=int8"}


def quantize_draft(model, mode: str = "auto") -> str:
    """The draft's weights stored per the draft_quant option (after its head is restricted, which
    needs the dense head); returns what was applied ("none": nothing). A draft only proposes, so
    its precision moves acceptance, never the output. auto: int8 where the native step runs on
    the CPU (the embedded draft's step reads 1.3 MB instead of 2.6, inside a core's L2: 0.10 vs
    0.32 ms a proposed token on an Intel Xeon core, `bench/steps.py` prints both), else fp16
    where that pays (the float32 draft's bf16 values survive fp16)."""
    from .runner import LlamaWeights

    if mode not in DRAFT_QUANTS:
        raise ModelError(f"draft_quant {mode!r}: expected one of {', '.join(DRAFT_QUANTS)}")
    if mode == "none" or not isinstance(model, LlamaWeights) or model.device.type != "cpu":
        return "none"
    if mode == "auto":
        from .native_lib import library

        mode = "int8" if library()[0] is not None and model.dtype == torch.float32 else "fp16"
    if mode == "fp16":
        return "fp16" if fp16_if_pays(model) else "none"
    from .quant import quantize_weights
    try:
        quantize_weights(model, DRAFT_GROUPS[mode])
    except (ValueError, RuntimeError) as e:
        raise ModelError(f"draft_quant {mode}: {e}") from None
    return mode


def _fp16_pays(model, device: torch.device, dtype: torch.dtype) -> bool:
    """--quant auto: lean weights (any family) from a bf16/fp16 checkpoint, computed in fp32 on the
    CPU, whose matrices all fit fp16's range (values from bf16 below fp16's normal range keep fewer
    bits: their effect on logits is ~1e-6, fp32 summation noise; bench/quant.py measures
    agreement). Biases and norms stay in fp32."""
    from .runner import LlamaWeights

    if not (isinstance(model, LlamaWeights) and device.type == "cpu" and dtype == torch.float32
            and getattr(model, "source_dtype", None) in (torch.bfloat16, torch.float16)):
        return False
    mats = [model.lm_head] + [m for layer in model.layers for m in (layer[1], layer[2], layer[4], layer[5])]
    return all(isinstance(m, torch.Tensor) and float(m.abs().max()) < 65504 for m in mats)


def same_vocab(a, b) -> bool:
    return a.get_vocab_size() == b.get_vocab_size() and a.get_vocab() == b.get_vocab()


def _same_file(dir_a: str, dir_b: str, name: str) -> bool:
    """Both model directories hold byte-identical `name` (the embedded pair's tokenizer: one parse
    instead of two, ~15 ms of a cold start)."""
    a, b = Path(dir_a) / name, Path(dir_b) / name
    return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()


def load_pair(target: str | None = None, draft: str | None = None, *, device: str = "auto",
              dtype: str = "auto", quant: str = "auto", use_draft: bool = True,
              lean: bool = True, quant_groups: str | None = None) -> Pair:
    from draft_models import DEFAULT_DRAFT, DEFAULT_TARGET

    if quant not in QUANT_MODES:
        raise ModelError(f"--quant {quant}: expected one of {', '.join(QUANT_MODES)}")
    if target is None and draft is None:
        target, draft = str(DEFAULT_TARGET), str(DEFAULT_DRAFT)
        if not (DEFAULT_TARGET / "config.json").is_file():
            raise ModelError(f"the embedded model pair is missing from {DEFAULT_TARGET.parent}; "
                             "rebuild it with `python -m draft_models.build`")
    elif target is None:
        raise ModelError("--draft needs --target (a draft must share the target's tokenizer)")
    for name in (target, draft if use_draft else None):
        if name is not None:
            _check_dir(name)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tok = load_tokenizer(target)
    dmodel = None
    if draft is not None and use_draft and not _same_file(target, draft, "tokenizer.json"):
        dtok = load_tokenizer(draft)
        if not same_vocab(tok, dtok):
            raise ModelError(f"tokenizer mismatch: draft {draft} and target {target} do not share "
                             "a vocabulary, so draft tokens cannot be verified")
    with _one_thread():
        tmodel = load_model(target, dev, dt, quant, lean, quant_groups)
        if draft is not None and use_draft:
            dmodel = load_model(draft, dev, dt, lean=lean)
    return Pair(tmodel, dmodel, tok, target, draft if use_draft else None, dev)


@contextmanager
def _one_thread():
    """Loading runs on one torch thread. Its ~250 conversions, copies and packs are each a parallel
    region that waits for its second thread when another process holds that core: on the 2-core
    build machine, with the other core busy, the embedded pair's weights took 41-53 ms on one
    thread and 726-1108 ms on two (idle: 37 vs 41); the copies are memory-bound either way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
