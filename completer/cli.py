"""`completer ...`: one completion from a file position or a raw prompt, and the engine service."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


class UsageError(Exception):
    """Bad input from the user: one line on stderr, exit code 2."""


def _engine_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("models and decoding (same names as the LSP initializationOptions)")
    g.add_argument("--target", help="target model: HF model directory or hub id (default: embedded pair)")
    g.add_argument("--draft", help="draft model sharing the target's tokenizer (default: embedded pair)")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    g.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    g.add_argument("--quant", default="auto",
                   help="target weights: auto (fp16 storage for a 16-bit checkpoint on CPU, else none) | "
                        "none | fp16 | int8 | nf4 (bitsandbytes) | fast-int8 | mixed (ours)")
    g.add_argument("--quant-groups", default="embed=fp16,attn=int8,mlp=int4,head=int8",
                   help="per-group precision for --quant mixed (embed, attn, mlp, head)")
    g.add_argument("--drafter", default="combined", help="combined | model | ngram | fastpath | none")
    g.add_argument("--draft-len", type=int, default=4, help="initial draft length k (adapted)")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--greedy", action="store_true", help="greedy decoding (temperature 0)")
    g.add_argument("--no-speculative", action="store_true", help="plain decoding, no drafter")
    g.add_argument("--kv-budget-mb", type=float, default=256.0)
    g.add_argument("--seed", type=int, default=0)


def engine_config(a: argparse.Namespace):
    from .engine.engine import EngineConfig

    return EngineConfig(
        target=a.target, draft=a.draft, device=a.device, dtype=a.dtype, quant=a.quant,
        quant_groups=a.quant_groups,
        drafter="none" if a.no_speculative else a.drafter, draft_len=a.draft_len,
        max_new_tokens=a.max_new_tokens, temperature=0.0 if a.greedy else a.temperature,
        top_p=a.top_p, kv_budget_mb=a.kv_budget_mb, seed=a.seed)


def read_source_file(path: str) -> str:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"is a directory, not a file: {path}") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    if b"\x00" in data[:8192]:
        raise UsageError(f"{path} looks binary (NUL bytes); only text files can be completed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 (byte {e.start}); re-encode it as UTF-8") from None


def cmd_complete(a: argparse.Namespace) -> int:
    from .engine.engine import Engine

    if a.prompt_file is None and a.path is None:
        raise UsageError("give a PATH with --line/--col, or --prompt-file")
    if a.prompt_file is not None:
        prompt_text = read_source_file(a.prompt_file)
        engine = Engine(engine_config(a))
        prompt = engine.tok.encode(prompt_text, add_special_tokens=False).ids
        if not prompt:
            raise UsageError(f"{a.prompt_file} is empty")
        if len(prompt) + 1 > engine.ctx:
            raise UsageError(f"prompt of {len(prompt)} tokens does not fit the model's context of {engine.ctx}")
        from .engine.engine import Completion
        ids, st = engine.complete_ids(prompt, max_new=a.max_new_tokens)
        c = Completion(engine.decode(ids), ids, st, engine.cfg.drafter != "none")
    else:
        if a.line is None or a.col is None:
            raise UsageError("--line and --col are required with PATH")
        return _complete_file(a)
    if a.json:
        print(json.dumps(c.to_json()))
    else:
        print(c.text)
    return 0


def _complete_file(a: argparse.Namespace) -> int:
    """File mode: the syntax-aware pipeline (gate → context → engine → post-process)."""
    from .documents import PositionError, language_for
    from .engine.engine import Engine
    from .pipeline import CompletionOptions, _snapshot, complete_at, resolve_offset

    text = read_source_file(a.path)
    language = language_for(path=a.path)
    snap = _snapshot(text, language)
    try:
        resolve_offset(snap, (a.line, a.col))
    except PositionError as e:
        raise UsageError(str(e)) from None
    engine = Engine(engine_config(a))
    r = complete_at(engine, snap, (a.line, a.col), language=language,
                    doc_key=str(Path(a.path).resolve()),
                    options=CompletionOptions(max_new_tokens=a.max_new_tokens))
    if a.json:
        eng = r.stats.pop("engine", None) or {"new_tokens": 0, "target_forwards": 0,
                                              "accepted_per_forward": 0.0, "ttft_ms": 0.0}
        out = {**eng, **r.stats, "text": r.text,
               "total_ms": r.stats.get("total_ms", r.stats.get("syntax_ms", 0.0)),
               "speculative": engine.cfg.drafter != "none"}
        print(json.dumps(out))
    else:
        print(r.text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="completer", description="Code completion with speculative decoding.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("complete", help="complete at a file position, or continue a raw prompt")
    c.add_argument("path", nargs="?", help="source file (with --line and --col)")
    c.add_argument("--line", type=int, help="0-based line")
    c.add_argument("--col", type=int, help="0-based column in characters")
    c.add_argument("--prompt-file", help="raw prompt mode: continue this text (no syntax layer)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    _engine_args(c)
    s = sub.add_parser("serve", help="the engine service: WebSocket+msgpack at /ws, /metrics, /health")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=7421)
    s.add_argument("--token", default=os.environ.get("COMPLETER_TOKEN"),
                   help="auth token (required for a non-loopback --host; env COMPLETER_TOKEN)")
    s.add_argument("--allow-origin", action="append", default=[],
                   help="browser Origin allowed to connect (repeatable; default: none but localhost pages)")
    s.add_argument("--max-frame-bytes", type=int, default=4 * 2**20)
    s.add_argument("--max-batch", type=int, default=8,
                   help="live generations whose forwards step together (1 = serial)")
    s.add_argument("--batch-wait-ms", type=float, default=2.0,
                   help="how long a step waits for the other live generations")
    _engine_args(s)
    a = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _quiet_libraries()
    from .engine.models import ModelError
    try:
        if a.cmd == "complete":
            return cmd_complete(a)
        if a.cmd == "serve":
            from .server import serve_main
            return serve_main(a)
    except (UsageError, ModelError) as e:
        print(f"completer: error: {e}", file=sys.stderr)
        return 2
    return 0


def _quiet_libraries() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


if __name__ == "__main__":
    raise SystemExit(main())
