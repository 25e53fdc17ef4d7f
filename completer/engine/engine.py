"""The engine: a model pair, per-document KV caches (caches.py, LRU under a byte budget),
drafters, the speculative loop, warmup prefill and type-through (records.py). Its jobs, each a
section below: admission (a document's cache within the budget), options (reconfigure),
prompts, generation, type-through, warmup, calibration (calibrate.py) and stats.

Callers run in their own threads. Each request takes a ticket from the scheduler (one live
generation per document, interactive before warmup, at most `max_batch` live generations whose
forwards step together, KV budget); a newer request for a document cancels the older one within
one decode step. Type-through: a request whose prefix extends the document's last completion
request by a prefix of that completion's text is served the rest of it without the model.
"""
from __future__ import annotations

import atexit
import copy
import json
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields, replace
from typing import Any

import torch

from draft_models import DEFAULT_DIR

from .. import confidence
from ..client import (
    Chunk,
    Completion,
    EngineError,
    StopReason,
    StopText,
    accepted_count,
    prompt_budget,
    stop_reason,
)
from ..config import OPTIONS, EngineConfig
from ..edits.formats import EditFormat, EditPrompt, edit_budget, read_answer
from ..edits.formats import detect as detect_edit_format
from ..fim import FimFormat, token_id
from ..prompt import encode_text, fim_ids, piece_ids
from .adaptive import AdaptiveK
from .alternatives import MAX as ALTERNATIVES
from .alternatives import alternatives, shown_text
from .batch import Via
from .caches import DocCache, kv_reserve_bytes
from .calibrate import choose_amx_rows, measure_step_costs
from .drafters import CombinedDrafter, Drafter, EditDrafter, FastPathDrafter, ModelDrafter
from .models import ModelError, Pair, load_pair, quantize_draft
from .quant import model_bytes
from .records import Record, Records, StopFlag
from .runner import LlamaWeights, common_prefix_len
from .sampling import Sampling
from .scheduler import INTERACTIVE, WARMUP, Scheduler, SchedulerConfig
from .speculative import GenStats, StopRule, generate
from .stats import COUNTERS, stop_counter

log = logging.getLogger(__name__)

# The options reconfigure applies to a live engine: every EngineConfig option the schema does
# not mark reload (those need new models or runners: a new Engine).
LIVE_OPTIONS = tuple(f.name for f in fields(EngineConfig) if not OPTIONS[f.name].meta["reload"])


# The engine's own documents (warm_start's, completer doctor's trial) start with this: nobody accepts
# their completions, so they are never prefetched (a prefetch could outlive their forget)
INTERNAL_DOC = "\0"
WARM_START_DOC = INTERNAL_DOC + "startup"
PREFETCH_IDLE_S = 2.0  # the prefetch worker ends after this long without a job (the next one starts it)


_SHUTDOWN = threading.Event()  # the interpreter is exiting: prefetches stop at their next step
_PREFETCHING: weakref.WeakSet[Engine] = weakref.WeakSet()  # engines whose prefetch worker was started


@atexit.register
def _stop_prefetches() -> None:
    """At exit, before daemon threads are dropped mid-call: a prefetch inside the native step when
    the process ended aborted it ("terminate called without an active exception", exit -6)."""
    _SHUTDOWN.set()
    for eng in list(_PREFETCHING):
        with eng._prefetch_cond:
            eng._prefetch_cond.notify_all()
            worker = eng._prefetch_worker
        if worker is not None:
            worker.join(timeout=2.0)


def _prefetch_loop(ref: weakref.ref) -> None:
    """The prefetch worker: runs queued prefetches one at a time, oldest document first; holds its
    engine only while it works (a dropped engine ends it), and ends when idle."""
    while True:
        eng = ref()
        if eng is None or _SHUTDOWN.is_set():
            return
        with eng._prefetch_cond:
            if not eng._prefetch_jobs:
                eng._prefetch_cond.wait(PREFETCH_IDLE_S)
            if not eng._prefetch_jobs or _SHUTDOWN.is_set():
                eng._prefetch_worker = None
                return
            doc, (rec, max_new, extra) = eng._prefetch_jobs.popitem(last=False)
        eng._prefetch_run(rec, doc, max_new, extra)
        del eng


class _Busy:
    """A prefetch's cancel flag: set while interactive work waits or runs (it never delays a request)."""

    def __init__(self, sched: Scheduler):
        self.sched = sched

    def is_set(self) -> bool:
        return _SHUTDOWN.is_set() or self.sched.should_yield()


def to_completion(text: str, ids: list[int], st: GenStats, speculative: bool, shown: int | None = None,
                  unsure_text: str = "", queue_ms: float = 0.0, extra: dict | None = None, **fields) -> Completion:
    """The flat result from the loop's statistics; `shown`: how many of the tokens `text` holds
    (its confidence is theirs; default all); `fields`: Completion's own (type_through, edit_format...);
    `extra`: more numbers to report."""
    return Completion(text, st.new_tokens, st.target_forwards, st.accepted_per_forward, st.ttft_ms, st.total_ms,
                      speculative, st.prompt_tokens, st.prefill_tokens, st.stop_reason, ids,
                      confidence.score(st.logprobs[:shown]), unsure_text, **fields,
                      extra={"proposed": st.proposed, "accepted": st.accepted, "by_source": st.by_source,
                             "prefill_ms": round(st.prefill_ms, 3), "queue_ms": round(queue_ms, 3), **(extra or {})})


class Engine:
    def __init__(self, cfg: EngineConfig | None = None, pair: Pair | None = None,
                 progress: Callable[[int, str], None] | None = None):
        """`progress(percent, message)` is told how loading goes (then warm_start, to 100 %)."""
        cfg = cfg or EngineConfig()
        cfg.validate()
        self.cfg = cfg
        self.progress = progress or (lambda pct, msg: None)
        self.progress(0, "loading models")
        self.pair = pair or load_pair(cfg.target, cfg.draft, device=cfg.device, dtype=cfg.dtype,
                                      quant=cfg.quant, use_draft=cfg.drafter in ("combined", "model"),
                                      lean=cfg.lean, quant_groups=cfg.quant_groups)
        self.progress(60, "models loaded")
        self.tok = self.pair.tokenizer
        model_type = getattr(self.pair.target.config, "model_type", None)
        try:  # the option names a family's format, or auto: from the special tokens and model type
            self.fim = FimFormat.detect(self.tok, cfg.fim_format, model_type)
        except ValueError as e:
            raise ModelError(str(e)) from None
        self.ctx = min(getattr(self.pair.target.config, "max_position_embeddings", 2048), 4096)
        fp = DEFAULT_DIR / "fastpath.json"
        tables = json.loads(fp.read_text()) if fp.is_file() and cfg.target is None else {}
        self.fastpath = (FastPathDrafter(FastPathDrafter.table_of(tables["rows"]))
                         if tables and cfg.drafter in ("combined", "fastpath") else None)
        frequent = tables.get("frequent")
        if frequent and 0 < cfg.draft_vocab < len(frequent) and isinstance(self.pair.draft, LlamaWeights) \
                and self.pair.draft.head_rows is None and isinstance(self.pair.draft.lm_head, torch.Tensor):
            self.pair.draft.restrict_head(frequent[:cfg.draft_vocab])
        # after restrict_head, which needs the dense head
        self.draft_quant = quantize_draft(self.pair.draft, cfg.draft_quant) if self.pair.draft is not None else "none"
        self.sampling = Sampling(cfg.temperature, cfg.top_p)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.budget = int(cfg.kv_budget_mb * 2**20)
        self.cache_bytes = sum(kv_reserve_bytes(m, self.ctx, cfg) for m in (self.pair.target, self.pair.draft)
                               if m is not None)  # one document's caches, reserved
        self.caches: OrderedDict[str, DocCache] = OrderedDict()  # LRU order; guarded by sched.cond
        self.records = Records()
        self.prefetches = Records()  # each document's continuation of its shown completion (_prefetch)
        self._prefetch_cond = threading.Condition()
        self._prefetch_jobs: OrderedDict[str, tuple] = OrderedDict()  # doc → (record, max_new, extra)
        self._prefetch_worker: threading.Thread | None = None
        self.sched = Scheduler(_scheduler_config(cfg), self._admit)
        self._stats_lock = threading.Lock()
        self.step_costs: tuple[float, list[float] | None] = (0.06, None)  # (c, verify costs) for
        # AdaptiveK: defaults until warm_start measures them on this machine
        self.amx_rows: int | None = None  # the native step's AMX-BF16 threshold warm_start chose (calibrate.py)
        # a pair of our FIM format writes next edits only once taught them (draft_models/finetune_edits
        # marks its config); "auto" does not ask one that was not (the shipped pair: MODEL_CARD.md)
        self.edits_trained = bool(getattr(self.pair.target.config, "completer_next_edit", False))
        # the confidence gate's threshold measured for this model (completer/confidence.py), if it has one
        self.calibrated_confidence = getattr(self.pair.target.config, "completer_min_confidence", None)
        # and the next-edit gate's (bench/next_edit.py --calibrate writes it)
        self.calibrated_edit_confidence = getattr(self.pair.target.config, "completer_next_edit_min_confidence", None)
        self.edit_k: AdaptiveK | None = None  # next edits' draft length, learnt across rewrites (a model
        # that never copies its region soon stops paying for long verifies)
        self.counters = dict.fromkeys(COUNTERS, 0)  # declared in stats.py: each is a metric
        # next edits from a model of their own (next_edit_model): an engine of its own, drafting from
        # the region as every rewrite does (no draft model), with its own caches and gate; the
        # completions stay with this pair
        self.editor = (Engine(replace(cfg, target=cfg.next_edit_model, draft=None, drafter="none", next_edit_model=None))
                       if cfg.next_edit_model else None)

    def _count(self, **inc: int) -> None:
        with self._stats_lock:
            for k, v in inc.items():
                if k not in COUNTERS:
                    raise KeyError(f"undeclared engine counter {k!r} (declare it in completer/engine/stats.py)")
                self.counters[k] += v

    # -- admission (called by the scheduler under its lock) ----------------------------------------
    def _admit(self, doc: str, live: set[str]) -> DocCache | bool:
        """The document's caches, made room for by evicting idle documents' in LRU order; False
        while live documents hold the budget (the ticket waits)."""
        if doc in self.caches:
            self.caches.move_to_end(doc)
            return self.caches[doc]
        if self.cache_bytes > self.budget:
            raise EngineError(f"one document's KV cache needs {self.cache_bytes / 2**20:.1f} MiB "
                              f"(target+draft for a {self.ctx}-token context) but --kv-budget-mb is "
                              f"{self.cfg.kv_budget_mb:g}; raise it to at least {self.cache_bytes / 2**20:.1f}",
                              "overloaded")
        if not self._evict(live, room=1):
            return False
        last = next(reversed(self.caches.values()), None)  # the most recently used document's
        self.caches[doc] = cache = DocCache(self.pair, self.ctx, self.cfg, self.step_costs,
                                            last.drafts.k if last is not None else None)
        return cache

    def _evict(self, live: set[str] | dict, room: int = 0) -> bool:
        """Drop idle documents' caches, least recently used first, until they and `room` more
        fit the budget (call under sched.cond); False when the live ones alone are over it."""
        while (len(self.caches) + room) * self.cache_bytes > self.budget:
            idle = next((d for d in self.caches if d not in live), None)
            if idle is None:
                return False
            del self.caches[idle]
            self._count(evictions=1)
        return True

    def forget(self, doc_key: str) -> bool:
        """The editor closed the document: free its caches unless a request is using them."""
        edits = self.editor is not None and self.editor.forget(doc_key)  # the next-edit model's, under the same key
        with self.sched.cond:
            self.records.pop(doc_key)
            if (ahead := self.prefetches.pop(doc_key)) is not None:
                ahead.forgotten = True  # a queued prefetch is skipped; a running one drops the cache after
            if doc_key in self.sched.live or doc_key not in self.caches:
                return edits
            del self.caches[doc_key]
            self.sched.kick()  # a waiting ticket may fit now
            return True

    def kv_bytes(self) -> int:
        """Reserved K/V bytes of all documents' caches (what the budget bounds)."""
        with self.sched.cond:
            return len(self.caches) * self.cache_bytes

    def kv_live_bytes(self) -> int:
        """K/V bytes holding cached tokens."""
        with self.sched.cond:
            return sum(r.kv_bytes() for c in self.caches.values() for r in (c.target, c.draft) if r is not None)

    # -- options -----------------------------------------------------------------------------
    def reconfigure(self, **values: Any) -> None:
        """Apply the LIVE_OPTIONS among `values` from the next request on (a generation under way
        keeps what it started with); the others (other scopes' options, and the reload ones:
        they need a new Engine) are not the engine's to apply. A smaller kv_budget_mb evicts
        idle documents at once and live ones as they finish. A value outside the schema raises
        EngineError ("bad_request") and nothing changes. `stats()["config"]` shows the values."""
        cfg = replace(self.cfg, **{k: v for k, v in values.items() if k in LIVE_OPTIONS})
        cfg.validate()
        old = self.cfg
        with self.sched.cond:
            self.cfg = cfg
            self.sampling = Sampling(cfg.temperature, cfg.top_p)
            if "seed" in values:  # the sampler starts again from it, as after a restart
                self.gen = torch.Generator().manual_seed(cfg.seed)
            if cfg.max_draft_len != old.max_draft_len:
                for cache in self.caches.values():
                    cache.drafts.rebound(cfg.max_draft_len)
            if not cfg.type_through:
                self.records.clear()
            self.budget = int(cfg.kv_budget_mb * 2**20)
            self._evict(self.sched.live)
        self.sched.reconfigure(_scheduler_config(cfg))
        if self.editor is not None:
            self.editor.reconfigure(**values)

    # -- prompts -----------------------------------------------------------------------------
    def prompt_budget(self, max_new: int | None = None) -> int:
        """Prompt tokens that leave room for `max_new` tokens and a draft."""
        return prompt_budget(self.ctx, max_new or self.cfg.max_new_tokens, self.cfg.max_draft_len)

    def count_tokens(self, text: str) -> int:
        return len(encode_text(self.tok, text))

    def fim_prompt(self, prefix: str, suffix: str, max_new: int | None = None,
                   extra: Sequence[Chunk] = ()) -> list[int]:
        """The prompt `complete` and `warmup` build from the same arguments: one function (the
        prompt builder's, completer/prompt.py), so a warmup leaves in the cache exactly what the
        request after it reads."""
        return fim_ids(self.tok, self.fim, prefix, suffix, self.prompt_budget(max_new), extra)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    # -- generation --------------------------------------------------------------------------
    def _drafter(self, cache: DocCache, kind: str, sampling: Sampling):
        model = (ModelDrafter(Via(cache.draft, self.sched.batcher), sampling, self.gen)
                 if cache.draft is not None and kind in ("combined", "model") else None)
        if kind == "model":
            return model
        if kind == "ngram":
            return cache.drafts.ngram
        if kind == "fastpath":
            return self.fastpath
        if kind == "combined":
            return CombinedDrafter(model, cache.drafts.ngram, self.fastpath, cache.target.vocab_size)
        return None

    def _generate(self, prompt: list[int], doc_key: str, max_new: int | None, drafter: str | None,
                  stop, cancel, on_tokens, record: Record | None,
                  node_kind: str | None = None, sampling: Sampling | None = None,
                  draft: tuple[Drafter | None, AdaptiveK | None] | None = None,
                  eos: frozenset[int] | None = None, floor: float = confidence.OFF,
                  priority: int = INTERACTIVE) -> tuple[list[int], GenStats, float]:
        """Run one generation under a scheduler ticket → (ids, stats, ms spent queued). `draft`:
        a drafter made for this generation and its draft lengths (instead of the `drafter` kind's
        over the document's cache); `eos`: the stop ids (default: the FIM format's); `floor`: the
        confidence gate's (generate); `priority`: WARMUP for work nobody waits for (a prefetch)."""
        max_new = max_new or self.cfg.max_new_tokens
        sampling = sampling or self.sampling
        if not prompt:
            raise ModelError("empty prompt")
        if len(prompt) + 1 > self.ctx:
            raise ModelError(f"prompt of {len(prompt)} tokens does not fit the model's context of {self.ctx}")
        t = self.sched.acquire(doc_key, priority)
        try:
            if not t.live:  # superseded while it waited
                ids, st = [], GenStats(prompt_tokens=len(prompt), stop_reason=StopReason.SUPERSEDED)
            else:
                cache: DocCache = t.resource
                if draft is None:
                    d = self._drafter(cache, drafter or self.cfg.drafter, sampling)
                    draft = d, cache.drafts.k_for(node_kind) if d is not None else None
                ids, st = generate(Via(cache.target, self.sched.batcher), prompt, max_new, sampling, *draft,
                                   self.fim.eos if eos is None else eos, stop,
                                   StopFlag(t.superseded, cancel, record), on_tokens, self.gen, floor)
        finally:
            self.sched.release(t)
            with self.sched.cond:
                self._evict(self.sched.live)  # the budget may have shrunk while it ran
        if t.superseded.is_set():
            st.stop_reason = StopReason.SUPERSEDED
        reused = st.prompt_tokens - st.prefill_tokens if t.resource is not None else 0
        self._count(requests=int(priority == INTERACTIVE), tokens_reused=reused, cache_hits=int(reused > 0), prefill_tokens=st.prefill_tokens,
                    generated_tokens=st.new_tokens, superseded=int(t.superseded.is_set()))
        return ids, st, t.queue_ms

    def complete_ids(self, prompt: list[int], *, doc_key: str = "_default", max_new: int | None = None,
                     drafter: str | None = None, stop: StopRule | None = None,
                     cancel: threading.Event | None = None,
                     on_tokens: Callable[[list[int]], None] | None = None) -> tuple[list[int], GenStats]:
        """Generate after raw token ids; a newer request for `doc_key` cancels this one
        (stop_reason "superseded")."""
        ids, st, _ = self._generate(prompt, doc_key, max_new, drafter, stop, cancel, on_tokens, None)
        return ids, st

    def complete(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
                 max_new: int | None = None, stop_text: StopText | None = None,
                 cancel: threading.Event | None = None,
                 on_text: Callable[[str], None] | None = None, node_kind: str | None = None,
                 sampling: Sampling | None = None, extra: Sequence[Chunk] = (), n: int | None = None) -> Completion:
        """Complete at the cursor between `prefix` and `suffix`, after the chunks of other files
        `extra` (laid out by the prompt builder, completer/prompt.py, counted in the prompt budget). `stop_text(text)`
        returns the length to keep once the completion is finished (e.g. its syntax node
        closed), else None; its reason becomes the stop_reason. `node_kind` (the syntax node at
        the cursor) keys the adaptive draft length. `on_text` gets the text as it is verified
        (deltas; the final text may be shorter). `sampling`: this request's temperature and
        top-p (default: the engine's). `n`: up to n completions (default: the option `alternatives`),
        the others in `alternatives` (engine/alternatives.py)."""
        t0 = time.perf_counter()
        old = self._newer_request(doc_key)
        typed = old.typed(prefix, suffix) if old is not None and self.cfg.type_through else None
        if typed is not None:
            c = self._follow(old, typed, cancel, on_text, t0)
            if c is not None:
                return c
        ahead = self._take_prefetch(doc_key, prefix, suffix, extra)
        if ahead is not None:  # the user accepted the shown completion: its continuation is (being) made
            with self.sched.cond:
                self.records.put(doc_key, ahead)  # a newer request stops this one following it
            c = self._follow(ahead, "", cancel, on_text, t0, stop_text)
            if c is not None:
                self._remember(doc_key, prefix, suffix, c.text)
                self._prefetch(doc_key, prefix, suffix, c.text, max_new, extra)
                return c
        rec = Record(prefix, suffix)
        with self.sched.cond:
            self.records.put(doc_key, rec)
        n, spare = min(n or self.cfg.alternatives, ALTERNATIVES), copy.copy(stop_text)  # the branches' stop: unjudged
        try:
            text, ids, st, queue_ms, unsure = self._decode_into(rec, prefix, suffix, doc_key, max_new, stop_text,
                                                                cancel, on_text, node_kind, sampling, extra)
        except BaseException:
            rec.update(rec.text, done=True)
            raise
        self._count(**{stop_counter(st.stop_reason): 1})
        rec.update(text, done=True, ok=st.stop_reason not in (StopReason.CANCELLED, StopReason.SUPERSEDED))
        alts = (alternatives(self, rec, doc_key, self.fim_prompt(prefix, suffix, max_new, extra), ids, st,
                             self._tokens_in(ids, text), n - 1, max_new, spare, cancel, sampling or self.sampling)
                if n > 1 and rec.ok and text.strip() else [])
        st.total_ms = (time.perf_counter() - t0) * 1e3
        if rec.ok:
            self._prefetch(doc_key, prefix, suffix, text, max_new, extra)
        return to_completion(text, ids, st, self.speculative, self._tokens_in(ids, text), unsure, queue_ms,
                             alternatives=alts)

    def _decode_into(self, rec: Record, prefix: str, suffix: str, doc_key: str, max_new: int | None,
                     stop_text: StopText | None, cancel, on_text, node_kind: str | None,
                     sampling: Sampling | None, extra: Sequence[Chunk], priority: int = INTERACTIVE,
                     ) -> tuple[str, list[int], GenStats, float, str]:
        """Generate the completion at (prefix, suffix) into `rec` as it is verified → (text, ids,
        stats, ms queued, what the confidence gate held back)."""
        prompt = self.fim_prompt(prefix, suffix, max_new, extra)
        cut: list[int | None] = [None]
        out_ids: list[int] = []
        floor = confidence.floor(confidence.resolve(self.cfg.min_confidence, self.calibrated_confidence))

        def stop(ids: list[int]) -> StopReason | None:
            if stop_text is None:
                return None
            cut[0] = stop_text(self.decode(ids))
            return stop_reason(stop_text) if cut[0] is not None else None

        def on_tokens(ids_step: list[int]) -> None:
            sent = len(rec.text)
            out_ids.extend(ids_step)
            text = self.decode(out_ids).rstrip("\ufffd")  # an unfinished UTF-8 char waits
            if floor != confidence.OFF:  # an unsure token next would take back the word it ends in
                text = confidence.whole_words(text, "a")
            rec.update(text)
            if on_text is not None and len(text) > sent:
                on_text(text[sent:])

        ids, st, queue_ms = self._generate(prompt, doc_key, max_new, None, stop, cancel, on_tokens, rec,
                                           node_kind, sampling, floor=floor, priority=priority)
        text, unsure = shown_text(self.decode, ids, cut[0], st.unsure)
        return text, ids, st, queue_ms, unsure

    # -- the next completion before Tab (prefetch) --------------------------------------------------
    def _prefetch(self, doc_key: str, prefix: str, suffix: str, text: str, max_new: int | None,
                  extra: Sequence[Chunk]) -> None:
        """`text` was shown at (prefix, suffix): once the engine is idle, complete as if the user
        accepted it (the document's cache already holds it), so that accepting and asking again is
        answered at once. Warmup priority: it waits for interactive work, stops when some arrives
        (Scheduler.should_yield) and is superseded by any other request for the document."""
        if not (self.cfg.prefetch and text.strip()) or doc_key.startswith(INTERNAL_DOC) or _SHUTDOWN.is_set():
            return
        rec = Record(prefix + text, suffix)
        rec.extra = tuple(extra)
        with self.sched.cond:
            self.prefetches.put(doc_key, rec)
        with self._prefetch_cond:  # one worker, the latest job per document (never a thread per request)
            self._prefetch_jobs[doc_key] = (rec, max_new, tuple(extra))
            self._prefetch_jobs.move_to_end(doc_key)
            if self._prefetch_worker is None:
                self._prefetch_worker = threading.Thread(target=_prefetch_loop, args=(weakref.ref(self),),
                                                         name="completer-prefetch", daemon=True)
                _PREFETCHING.add(self)
                self._prefetch_worker.start()
            self._prefetch_cond.notify()

    def _prefetch_run(self, rec: Record, doc_key: str, max_new: int | None, extra: tuple[Chunk, ...]) -> None:
        with self.sched.cond:
            stale = self.prefetches.get(doc_key) is not rec  # taken, dropped or forgotten meanwhile
        if stale:
            rec.update(rec.text, done=True)
            return
        try:
            text, _, st, _, _ = self._decode_into(rec, rec.prefix, rec.suffix, doc_key, max_new, None,
                                                  _Busy(self.sched), None, None, None, extra, WARMUP)
            rec.reason = st.stop_reason
            rec.update(text, done=True, ok=st.stop_reason not in (StopReason.CANCELLED, StopReason.SUPERSEDED))
            self._count(prefetches=1, prefetch_tokens=st.new_tokens)
        except Exception:  # a prefetch is optional: the request that needs it generates
            log.debug("prefetch failed", exc_info=True)
            rec.update(rec.text, done=True)
        with self.sched.cond:  # closed while it ran (or on its way to its ticket): its cache goes now,
            if rec.forgotten and doc_key not in self.sched.live and self.records.get(doc_key) is None \
                    and self.prefetches.get(doc_key) is None and self.caches.pop(doc_key, None) is not None:
                self.sched.kick()  # unless the document was opened and used again meanwhile

    def _take_prefetch(self, doc_key: str, prefix: str, suffix: str, extra: Sequence[Chunk]) -> Record | None:
        """The document's prefetched continuation if it is for exactly this request (taken: it is
        served once), else None (and a stale one is dropped)."""
        with self.sched.cond:
            rec = self.prefetches.get(doc_key)
            if rec is None:
                return None
            self.prefetches.pop(doc_key)
        return rec if (rec.prefix, rec.suffix, rec.extra) == (prefix, suffix, tuple(extra)) and self.cfg.prefetch else None

    def _prefetch_covers(self, doc_key: str, prefix: str, suffix: str, extra: Sequence[Chunk]) -> bool:
        """Whether a prefetch in flight or done for the document already computes (prefix, suffix,
        extra) or the way there (the user typing through the shown completion); when it does not,
        the edit drops it (it would overwrite the warmed cache with a state the user left)."""
        with self.sched.cond:
            rec = self.prefetches.get(doc_key)
            if rec is None:
                return False
            if rec.suffix == suffix and rec.prefix.startswith(prefix) and rec.extra == tuple(extra):
                return True
            self.prefetches.pop(doc_key)  # a queued prefetch finds itself stale; a running one is superseded
            return False

    def _remember(self, doc_key: str, prefix: str, suffix: str, text: str) -> None:
        """`text` is shown at (prefix, suffix): type-through serves from it from now on."""
        rec = Record(prefix, suffix)
        rec.update(text, done=True, ok=True)
        with self.sched.cond:
            self.records.put(doc_key, rec)

    def _tokens_in(self, ids: list[int], text: str) -> int:
        """How many of `ids` the (possibly cut) `text` holds whole."""
        if text == self.decode(ids):
            return len(ids)
        n = 0
        while n < len(ids) and len(self.decode(ids[: n + 1])) <= len(text):
            n += 1
        return n

    # -- next edits (completer/edits) -------------------------------------------------------------
    def edit_format(self, name: str = "auto") -> EditFormat:
        """The next-edit format `name`, or the one this model reads (formats.detect)."""
        if self.editor is not None:
            return self.editor.edit_format(name)
        try:
            return detect_edit_format(name, fim=self.fim.name, model=self.pair.target_name,
                                      has_token=lambda text: token_id(self.tok, text) is not None)
        except ValueError as e:
            raise EngineError(str(e), "bad_request") from None

    def edit_prompt(self, request: EditPrompt, f: EditFormat) -> list[int]:
        """The token ids of `request` in format `f`: a special piece is its token, text is
        document text (never a control token), as the fine-tune encoded its samples."""
        def missing(text: str) -> None:
            raise EngineError(f"next-edit format {f.name!r} needs the token {text!r}, which this tokenizer "
                              "lacks: set next_edit_format", "bad_request")

        return piece_ids(self.tok, f.prompt(request), missing)

    def edits_untrained(self, fmt: str = "auto") -> bool:
        """Whether rewrite(fmt=fmt) answers "untrained" at once, touching no model: `auto` on a
        pair of our format never taught next edits. Thread-safe (the language server then runs
        a next edit beside the engine's worker: only the syntax tree's rename can answer it)."""
        if self.editor is not None:
            return self.editor.edits_untrained(fmt)
        return fmt == "auto" and not self.edits_trained and self.edit_format(fmt).name == "completer"

    def rewrite(self, request: EditPrompt, *, fmt: str = "auto", doc_key: str = "_default",
                max_new: int | None = None, speculative: bool = True,
                cancel: threading.Event | None = None) -> Completion:
        """The editable region of `request` as the model rewrites it (greedy), in format `fmt`:
        `text` is the region read back from the answer ("" and `malformed` when the answer
        held none). Speculative: the region's own tokens are the draft (EditDrafter, long drafts
        while the answer copies), else plain decoding; the ids are the same either way. At most
        `max_new` tokens (default: the region's tokens x 1.25 + 32), within the context (a prompt
        that fills it: no answer, stop_reason "context"). With "auto", a pair of our FIM format
        that was not taught next edits answers nothing (stop_reason UNTRAINED). With a
        next_edit_model, that model's engine answers."""
        if self.editor is not None:
            return self.editor.rewrite(request, fmt=fmt, doc_key=doc_key, max_new=max_new, speculative=speculative,
                                       cancel=cancel)
        t0 = time.perf_counter()
        f = self.edit_format(fmt)
        if self.edits_untrained(fmt):
            st = GenStats(stop_reason=StopReason.UNTRAINED, total_ms=(time.perf_counter() - t0) * 1e3)
            return to_completion("", [], st, speculative, edit_format=f.name)
        prompt = self.edit_prompt(request, f)
        original = encode_text(self.tok, f.draft(request))
        drafter = EditDrafter(original) if speculative else None
        room = self.ctx - len(prompt) - 1  # drafts near the end shrink to fit (generate)
        max_new = min(edit_budget(len(original), max_new), room)
        if max_new < 1:  # the prompt alone fills the context: no answer (stop_reason "context")
            st = GenStats(prompt_tokens=len(prompt), stop_reason=StopReason.CONTEXT, total_ms=(time.perf_counter() - t0) * 1e3)
            return to_completion("", [], st, speculative, edit_format=f.name, malformed=True)
        eos = set(self.fim.eos)
        texts = []
        for s in f.stops:
            i = token_id(self.tok, s)
            if i is not None:
                eos.add(i)
            else:
                texts.append(s)
        stop = (lambda ids: StopReason.STOP if any(s in self.decode(ids) for s in texts) else None) if texts else None
        ids, st, queue_ms = self._generate(prompt, doc_key, max_new, None, stop, cancel, None, None,
                                           sampling=Sampling(0.0),
                                           draft=(drafter, self._edit_k(drafter) if drafter is not None else None),
                                           eos=frozenset(eos), floor=confidence.floor(self._edit_gate()))
        st.total_ms = (time.perf_counter() - t0) * 1e3
        self._count(rewrites=1)
        if st.stop_reason == StopReason.UNSURE:  # the gate: one unsure token and the answer is no answer
            self._count(rewrites_unsure=1)
            c = to_completion("", ids, st, speculative, unsure_text=self.decode([st.unsure]), queue_ms=queue_ms,
                              edit_format=f.name)
            c.confidence = confidence.score([st.unsure_logprob])  # the refused token's: what fell short
            return c
        region = read_answer(f, self.decode(ids))
        return to_completion(region or "", ids, st, speculative, queue_ms=queue_ms, edit_format=f.name,
                             malformed=region is None)

    def _edit_gate(self) -> float:
        """The next-edit gate's threshold in force: the option, else the model's calibration, else 0."""
        if self.editor is not None:
            return self.editor._edit_gate()
        return confidence.resolve(self.cfg.next_edit_min_confidence, self.calibrated_edit_confidence)

    def _edit_k(self, drafter: EditDrafter) -> AdaptiveK:
        if self.edit_k is None:
            self.edit_k = drafter.adaptive_k()
        return self.edit_k

    # -- type-through (records.py; the rule: completer/typethrough.py) -----------------------------
    def _newer_request(self, doc_key: str) -> Record | None:
        """The document's last record; every request bumps its epoch so older followers stop."""
        with self.sched.cond:
            old = self.records.get(doc_key)
        if old is not None:
            with old.cond:
                old.epoch += 1
                old.cond.notify_all()
        return old

    def _follow(self, rec: Record, typed: str, cancel, on_text, t0: float,
                stop_text: StopText | None = None) -> Completion | None:
        """Serve the rest of `rec`'s completion after `typed`, streaming it while it is still being
        generated. None when it turns out not to match (the caller generates). With `stop_text`
        (a prefetched continuation, generated without this request's rule): cut where it says."""
        with rec.cond:
            rec.followers += 1
            epoch = rec.epoch
        sent, ttft, cut = len(typed), None, None
        try:
            while True:
                with rec.cond:
                    rec.cond.wait_for(lambda n=sent: rec.done or len(rec.text) > n or rec.epoch != epoch
                                      or (cancel is not None and cancel.is_set()), timeout=0.05)
                    text, done, ok = rec.text, rec.done, rec.ok
                gone = rec.epoch != epoch or (cancel is not None and cancel.is_set())
                if not text.startswith(typed):
                    return None  # the finished (cut) text no longer covers what was typed
                if stop_text is not None and len(text) > sent and (cut := stop_text(text[len(typed):])) is not None:
                    text, done, ok = text[:len(typed) + cut], True, True  # finished for this request
                if len(text) > sent:  # the rest, also when the generation finished first
                    ttft = ttft if ttft is not None else (time.perf_counter() - t0) * 1e3
                    if on_text is not None:
                        on_text(text[sent:])
                    sent = len(text)
                if done or gone:
                    break
        finally:
            with rec.cond:
                rec.followers -= 1
        if done and not ok and not gone:
            return None  # its generation was cancelled before finishing: generate afresh
        rest = text[len(typed):]
        total = (time.perf_counter() - t0) * 1e3
        ahead = stop_text is not None or not typed
        why = (StopReason.CANCELLED if gone else stop_reason(stop_text) if cut is not None
               else rec.reason if ahead else StopReason.TYPE_THROUGH)
        st = GenStats(ttft_ms=ttft if ttft is not None else total, total_ms=total, stop_reason=why)
        self._count(requests=1, **({"prefetch_served": 1} if ahead else {"type_through": 1}))
        return to_completion(rest, [], st, False, **({"prefetched": True} if ahead else {"type_through": True}))

    # -- warmup ------------------------------------------------------------------------------
    def warmup(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
               extra: Sequence[Chunk] = ()) -> int:
        """Prefill the document's caches (target, and the draft's while the document's schedule
        drafts: where drafting measured slower than plain, a try catches it up) with the prompt
        `complete` builds from the same arguments (and the engine's max_new_tokens), without
        generating, at low priority: chunks of `warmup_chunk` tokens, giving way to interactive
        requests between chunks. Returns the number of tokens computed (0 when the cache already
        held them; also when a prefetch for the document is on its way there)."""
        if self._prefetch_covers(doc_key, prefix, suffix, extra):
            return 0
        return self.prefill(self.fim_prompt(prefix, suffix, None, extra), doc_key=doc_key)

    def hold_warmup(self):
        """A context in which warmups wait (a running one pauses at its next chunk): interactive
        work outside the engine is using the CPU (Scheduler.hold)."""
        return self.sched.hold()

    def wait_quiet(self, timeout: float) -> bool:
        """Until no interactive work (request or hold) is waiting or running; False on timeout."""
        return self.sched.wait_quiet(timeout)

    def prefill(self, prompt: list[int], *, doc_key: str = "_default") -> int:
        """`warmup` for raw token ids."""
        prompt = prompt[: self.ctx - 1]
        t = self.sched.acquire(doc_key, WARMUP)
        done, chunk = 0, self.cfg.warmup_chunk
        try:
            while t.live and not t.superseded.is_set():
                if self.sched.should_yield():
                    self._count(warmup_preempted=1)
                    if not self.sched.pause(t):
                        break
                    continue  # re-admitted: the document's cache may have been evicted meanwhile
                cache: DocCache = t.resource
                todo = []
                for r in (cache.target, cache.draft if cache.drafts.active() else None):
                    if r is None:
                        continue
                    n = common_prefix_len(r.ids, prompt)
                    if n < len(prompt):
                        r.truncate(n)  # an edit: keep the cache up to the first changed token
                        todo.append((r, prompt[n:n + chunk]))
                if not todo:
                    break
                for r, feed in todo:
                    self.sched.batcher.forward(r, feed)
                done += len(todo[0][1]) if todo[0][0] is cache.target else 0
        finally:
            self.sched.release(t)
        self._count(warmups=1, warmup_tokens=done)
        return done

    # -- calibration (calibrate.py) ------------------------------------------------------------
    def warm_start(self) -> float:
        """A synthetic request at startup so the first real one does not pay for lazy
        initialisation (allocator, kernels, tokenizer caches), then a measurement of this
        machine's step costs for the adaptive draft length; returns its milliseconds."""
        t0 = time.perf_counter()
        key = WARM_START_DOC
        self.progress(70, "warm start")
        self.warmup("import os\n\n\ndef main(argv):\n    ", "\n", doc_key=key)
        self.complete("import os\n\n\ndef main(argv):\n    ", "\n", doc_key=key, max_new=4)
        self.forget(key)
        self.progress(80, "measuring step costs")
        self.amx_rows = choose_amx_rows(self.pair, self.ctx, self.cfg)
        self.step_costs = measure_step_costs(self.pair, self.ctx, self.cfg)
        if self.editor is not None:
            self.progress(90, "warming the next-edit model")
            self.editor.warm_start()
        self.progress(100, "ready")
        with self._stats_lock:
            self.counters = dict.fromkeys(self.counters, 0)
        return (time.perf_counter() - t0) * 1e3

    # -- stats and feedback ----------------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        return self.pair.draft is not None or self.cfg.drafter in ("ngram", "fastpath")

    def feedback(self, doc_key: str, text: str, accepted: bool, accepted_chars: int | None = None) -> None:
        """Counted for stats and /metrics; acceptance does not steer decoding (yet)."""
        self._count(**{"feedback_accepted" if accepted else "feedback_rejected": 1},
                    feedback_accepted_chars=accepted_count(text, accepted, accepted_chars))

    def close(self) -> None:
        """Free every document's cache (the engine stays usable)."""
        with self.sched.cond:
            for doc in [d for d in self.caches if d not in self.sched.live]:
                del self.caches[doc]
            self.records.clear()
        if self.editor is not None:
            self.editor.close()

    def stats(self) -> dict:
        """The engine's state and counters; with a next_edit_model, its counters are added in
        (rewrites, tokens, stop reasons) and its model and caches named apart."""
        waiting, live = self.sched.depth()
        counters = dict(self.counters)
        editor = {}
        if self.editor is not None:
            e = self.editor.stats()
            counters = {k: v + e[k] for k, v in counters.items()}
            editor = {"next_edit_model": e["target"], "next_edit_weight_bytes": e["target_weight_bytes"],
                      "next_edit_kv_bytes": e["kv_bytes"]}
        return {"target": self.pair.target_name, "draft": self.pair.draft_name,
                "device": str(self.pair.device), "ctx": self.ctx, "fim": self.fim.layout,
                "config": asdict(self.cfg), "prompt_budget": self.prompt_budget(),
                "kv_bytes": self.kv_bytes(), "kv_live_bytes": self.kv_live_bytes(),
                "kv_budget_bytes": self.budget, "step_costs": self.step_costs, "amx_rows": self.amx_rows,
                "kv_bytes_per_document": self.cache_bytes, "kv_cached_documents": len(self.caches),
                "target_weight_bytes": model_bytes(self.pair.target),
                "draft_weight_bytes": model_bytes(self.pair.draft) if self.pair.draft is not None else 0,
                "draft_stored": self.draft_quant,  # what draft_quant applied
                # the confidence gate's threshold in force: the option, else the model's calibration
                "min_confidence_in_force": confidence.resolve(self.cfg.min_confidence, self.calibrated_confidence),
                "next_edit_min_confidence_in_force": self._edit_gate(),
                "queue_waiting": waiting, "queue_live": live, "batch_steps": self.sched.batcher.steps,
                "batched_calls": self.sched.batcher.batched_calls, "records": len(self.records),
                "record_chars": self.records.chars, **editor, **counters}


def _scheduler_config(cfg: EngineConfig) -> SchedulerConfig:
    return SchedulerConfig(cfg.max_batch, cfg.batch_wait_ms, cfg.max_queue, cfg.batch_step_tokens)
