"""Training stages of the recipe: a FIM-trained Llama target, then a draft distilled from it.

Each stage checkpoints every `ckpt_every` steps into its run folder and resumes from the last
checkpoint, so a run that outlives its session continues where it stopped. Batches are a pure
function of (seed, step): a resumed run sees exactly the data an uninterrupted one would.
"""
from __future__ import annotations

import bisect
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from .data import EOT, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, PAD, random_fim_split


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    intermediate: int


def llama_config(shape: ModelShape, vocab_size: int, ctx: int, tok: Tokenizer) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads, max_position_embeddings=ctx, tie_word_embeddings=True,
        bos_token_id=tok.token_to_id(EOT), eos_token_id=tok.token_to_id(EOT),
        pad_token_id=tok.token_to_id(PAD), rms_norm_eps=1e-5)


class SampleStream:
    """Batches of plain, FIM and repository-level samples cut from whole files, weighted by file
    length.

    FIM samples use two layouts; SPM is the one inference uses because the prefix ends the
    prompt, so typing at the cursor only appends tokens and the KV cache keeps everything else:
      SPM: <fim_suffix> suffix <fim_middle> prefix middle <eot>
      PSM: <fim_prefix> prefix <fim_suffix> suffix <fim_middle> middle <eot>
    Repository-level samples (`repo`: records of completer.workspace.samples, a `repo_rate` of
    the rows) put the chunks the product retrieved at the hole before the prefix, each as the
    engine writes it for this pair ("# path\ntext\n\n", completer/fim.py), in SPM.
    Parts are tokenized separately, as at inference where the prompt ends at the cursor.
    """

    def __init__(self, texts: list[str], tok: Tokenizer, seq_len: int, seed: int,
                 fim_rate: float = 0.5, spm_rate: float = 0.7, repo: list[dict] = (), repo_rate: float = 0.0):
        self.texts, self.tok, self.seq_len, self.seed = texts, tok, seq_len, seed
        self.fim_rate, self.spm_rate = fim_rate, spm_rate
        self.repo, self.repo_rate = list(repo), repo_rate if repo else 0.0
        self.cum = []
        total = 0
        for t in texts:
            total += len(t)
            self.cum.append(total)
        self.chunk_chars = seq_len * 4  # ≈3.7 chars per token on Python source
        self.ids = {name: tok.token_to_id(name) for name in (EOT, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, PAD)}

    def _enc(self, s: str) -> list[int]:
        return self.tok.encode(s).ids if s else []

    def sample(self, rng: random.Random) -> list[int]:
        if self.repo_rate and rng.random() < self.repo_rate:
            return self._repo_sample(rng.choice(self.repo), rng)
        off = rng.randrange(self.cum[-1])
        i = bisect.bisect_right(self.cum, off)
        text = self.texts[i]
        start = off - (self.cum[i - 1] if i else 0)
        start = text.rfind("\n", 0, start) + 1
        chunk = text[start:start + self.chunk_chars]
        at_end = start + self.chunk_chars >= len(text)
        T, ids = self.seq_len, self.ids
        if rng.random() >= self.fim_rate or len(chunk) < 8:
            out = self._enc(chunk) + ([ids[EOT]] if at_end else [])
            return out[:T]
        sp = random_fim_split(chunk, rng)
        return self._fim(self._enc(sp.prefix), self._enc(sp.middle), self._enc(sp.suffix),
                         rng.random() < self.spm_rate)

    def _fim(self, pre: list[int], mid: list[int], suf: list[int], spm: bool, head: list[int] = ()) -> list[int]:
        """One FIM row: the middle up to a third of the window, the suffix's first tokens (at
        least a quarter of the room), the chunks `head` whole, the prefix's last tokens."""
        T, ids = self.seq_len, self.ids
        mid = mid[: T // 3]
        room = T - 4 - len(mid) - len(head)
        suf_keep = min(len(suf), max(room // 4, room - len(pre)))
        pre = list(head) + pre[len(pre) - min(len(pre), room - suf_keep):]
        suf = suf[:suf_keep]
        if spm:
            return [ids[FIM_SUFFIX]] + suf + [ids[FIM_MIDDLE]] + pre + mid + [ids[EOT]]
        return [ids[FIM_PREFIX]] + pre + [ids[FIM_SUFFIX]] + suf + [ids[FIM_MIDDLE]] + mid + [ids[EOT]]

    def _repo_sample(self, rec: dict, rng: random.Random) -> list[int]:
        head: list[int] = []
        for path, text in rec["chunks"]:  # whole chunks, in order, within half the window (as completer/prompt.py fit_chunks serves them)
            piece = self._enc(f"# {path}\n{text if text.endswith(chr(10)) else text + chr(10)}\n")
            if len(head) + len(piece) > self.seq_len // 2:
                break
            head += piece
        return self._fim(self._enc(rec["prefix"]), self._enc(rec["middle"]), self._enc(rec["suffix"]), True, head)

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = random.Random(self.seed * 1_000_003 + step)
        x = torch.full((batch_size, self.seq_len), self.ids[PAD], dtype=torch.long)
        y = torch.full((batch_size, self.seq_len), -100, dtype=torch.long)
        for b in range(batch_size):
            s = self.sample(rng)
            x[b, : len(s)] = torch.tensor(s)
            y[b, : len(s) - 1] = torch.tensor(s[1:])
        return x, y  # [B, T] inputs, [B, T] next-token labels (-100 = no loss)


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    lr: float
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    ckpt_every: int = 200
    log_every: int = 20
    eval_every: int = 500
    eval_batches: int = 8
    bf16: bool | None = None  # autocast the forward to bf16; None: on CUDA, or where the CPU does bf16 natively
    device: str = "cpu"  # "cuda" where a GPU is lent (the recipe is the same; minutes instead of an hour)
    workers: int = 0  # processes making batches ahead (a GPU step is faster than one process makes a batch)


_STREAM = None  # the stream a forked batch worker reads (inherited, never pickled)


def _batch_at(args: tuple[int, int]):
    return _STREAM.batch(*args)


def batches(stream, start: int, steps: int, batch_size: int, workers: int = 0):
    """`stream.batch(step, batch_size)` for step in [start, steps), in order; made ahead by
    `workers` forked processes when > 0 (batches are a pure function of the step, so the data
    is the same either way)."""
    if workers <= 0:
        yield from (stream.batch(s, batch_size) for s in range(start, steps))
        return
    import multiprocessing

    global _STREAM
    _STREAM = stream
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_batch_at, ((s, batch_size) for s in range(start, steps)), chunksize=2)


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX or AVX-512 BF16): there autocast trains
    2-3x faster than fp32 (measured on an AMX Xeon: 1.2 vs 2.9 s a step); elsewhere bf16 is emulated, 20x slower."""
    return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    p = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def evaluate_loss(model, stream: SampleStream, cfg: TrainConfig, teacher=None) -> dict:
    """Held-out next-token loss and accuracy (and agreement with `teacher` when given)."""
    model.eval()
    dev = next(model.parameters()).device
    tot_loss = tot_ok = tot_agree = n = site_ok = n_sites = 0.0
    for k in range(cfg.eval_batches):
        x, y, *w = (t.to(dev) for t in stream.batch(10_000_000 + k, cfg.batch_size))
        logits = model(input_ids=x).logits
        mask = y != -100
        tot_loss += F.cross_entropy(logits[mask], y[mask], reduction="sum").item()  # host sync: eval only
        pred = logits.argmax(-1)
        tot_ok += (pred[mask] == y[mask]).sum().item()
        if w:  # the positions a stream weighs up (an edit's changed tokens): their accuracy apart
            sites = w[0] > 1
            site_ok += (pred[sites] == y[sites]).sum().item()
            n_sites += sites.sum().item()
        if teacher is not None:
            tpred = teacher(input_ids=x).logits.argmax(-1)
            tot_agree += (pred[mask] == tpred[mask]).sum().item()
        n += mask.sum().item()
    model.train()
    out = {"loss": tot_loss / n, "acc": tot_ok / n}
    if n_sites:
        out["site_acc"] = site_ok / n_sites
    if teacher is not None:
        out["agree"] = tot_agree / n
    return out


def _padded(x: torch.Tensor, y: torch.Tensor, *w: torch.Tensor, pad: int, grid: int = 64) -> tuple[torch.Tensor, ...]:
    """A batch as long as its longest row rounded up to `grid` (padding with no loss: causal
    attention keeps it from the rows' positions). Batches of every length made a new set of
    kernels per shape: the edit fine-tune's memory grew from 5 to 11 GB in 30 minutes. `w`: the
    loss's weight per position, when the stream gives one."""
    T = x.shape[1]
    extra = -T % grid
    if not extra:
        return x, y, *w
    return (F.pad(x, (0, extra), value=pad if pad is not None else 0), F.pad(y, (0, extra), value=-100),
            *(F.pad(t, (0, extra), value=0.0) for t in w))


def run_stage(name: str, model, train: SampleStream, heldout: SampleStream, cfg: TrainConfig,
              run_dir: Path, log, teacher=None, stop_acc: float | None = None) -> dict:
    """Train `model` (CE on labels, or KL to `teacher`'s distribution when given), resumable.
    `stop_acc`: the stage ends early at an evaluation whose held-out accuracy reaches it (a phase
    change measured, not guessed: the induction stage's came at ~750 steps in one run and not in
    900 in another), and a resumed stage that ended so stays ended."""
    from tqdm import tqdm

    ckpt = run_dir / f"{name}.ckpt.pt"
    dev = torch.device(cfg.device)
    model.to(dev)  # before the optimizer: its state follows the parameters' device
    if teacher is not None:
        teacher.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.weight_decay)
    step, elapsed, stopped = 0, 0.0, False
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False, map_location=dev)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, elapsed, stopped = state["step"], state["elapsed"], state.get("stopped", False)
        log(f"[{name}] resumed at step {step} ({elapsed / 60:.1f} min so far)" + (", ended early" if stopped else ""))
    model.train()
    t0 = time.time() - elapsed
    # A log file (not a TTY) gets a progress line every 30 s instead of a redrawn bar.
    bar = tqdm(total=cfg.steps, initial=step, desc=name, mininterval=0.2 if os.isatty(2) else 30.0)
    bf16 = (dev.type == "cuda" or native_bf16()) if cfg.bf16 is None else cfg.bf16
    if step == 0:
        where = dev.type if dev.type != "cpu" else f"cpu, {torch.get_num_threads()} threads"
        log(f"[{name}] forward in {'bf16 (autocast)' if bf16 else 'fp32'} on {where}")
    for batch in batches(train, step, step if stopped else cfg.steps, cfg.batch_size, cfg.workers):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        x, y, *w = (t.to(dev) for t in _padded(*batch, pad=model.config.pad_token_id))
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=x).logits  # [B, T, V]
            if teacher is not None:
                with torch.no_grad():
                    tlogits = teacher(input_ids=x).logits
        mask = y != -100
        logits = logits.float()
        if teacher is None and w:  # a weighted mean: a stream's weighed-up positions count more
            ce = F.cross_entropy(logits[mask], y[mask], reduction="none")
            loss = (ce * w[0][mask]).sum() / w[0][mask].sum()
        elif teacher is None:
            loss = F.cross_entropy(logits[mask], y[mask])
        else:
            tlogits = tlogits.float()
            loss = F.kl_div(F.log_softmax(logits[mask], -1), F.log_softmax(tlogits[mask], -1),
                            log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        bar.update(1)
        if step % cfg.log_every == 0 or step == cfg.steps:
            el = time.time() - t0
            log(f"[{name}] step {step}/{cfg.steps} loss {loss.item():.4f} lr {lr_at(step, cfg):.2e} "
                f"{el / 60:.1f} min {el / step * 1000:.0f} ms/step")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            ev = evaluate_loss(model, heldout, cfg, teacher)
            log(f"[{name}] eval step {step}: {json.dumps(ev)}")
            stopped = stop_acc is not None and ev["acc"] >= stop_acc
            if stopped:
                log(f"[{name}] held-out accuracy {ev['acc']:.3f} >= {stop_acc}: the stage ends at step {step}")
        if step % cfg.ckpt_every == 0 or step == cfg.steps or stopped:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "elapsed": time.time() - t0, "stopped": stopped}, tmp)
            tmp.replace(ckpt)
        if stopped:
            break
    bar.close()
    final = evaluate_loss(model, heldout, cfg, teacher)
    final.update(steps=step, minutes=(time.time() - t0) / 60)
    model.to("cpu")
    if teacher is not None:
        teacher.to("cpu")
    return final


def new_model(shape: ModelShape, vocab_size: int, ctx: int, tok: Tokenizer, seed: int):
    torch.manual_seed(seed)
    cfg = llama_config(shape, vocab_size, ctx, tok)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)
