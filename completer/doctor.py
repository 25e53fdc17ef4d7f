"""`completer doctor` and the language server's `completer/doctor`: what a setup needs, checked in
order, each check one typed `Check` (ok / warn / fail / skip, a one-line message, a one-line fix,
JSON-able details), and the first thing wrong with its fix.

Owns the order of the checks, their shape and the fix each problem suggests. Every rule a check
applies is its owner's: the options, their sources and the trust boundary are config.resolve's
(a refused project option is `Resolved.refused`), the engine is pipeline.make_engine's with the
options `completer complete` gives it, the native step's state is engine.native_lib.library's,
the index is workspace.WorkspaceIndex's, and the trial completion is pipeline.complete_at's with
its SyntaxDecision saying what the syntax layer did. The language server passes its own engine,
index and editor facts (`Subject.live`): they are reported, never built again.

Usable: no check failed. A warning (a refused project option, the NumPy step serving instead of
the native one, a trial the confidence gate quieted) leaves the setup usable and is still the
first thing to look at when no check failed.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import config
from .client import ERROR_CODES, EngineClient, EngineError

if TYPE_CHECKING:
    from .workspace import WorkspaceIndex

log = logging.getLogger(__name__)

STATUSES = ("ok", "warn", "fail", "skip")  # skip: not checked (nothing to check, or an earlier check failed)
SCOPES = ("engine", "client", "syntax", "workspace")  # what `completer complete` reads
MARKS = {"ok": "[ok]  ", "warn": "[warn]", "fail": "[FAIL]", "skip": "[skip]"}

# The trial completion: the doctor's own text (no file of the workspace), cursor at its end.
TRIAL = ('import os\n\n\ndef python_files(root):\n    """The names of the .py files in root, sorted."""\n'
         '    found = []\n    for name in sorted(os.listdir(root)):\n        if name.endswith(".py"):\n'
         '            found.append(name)\n    return ')
TRIAL_KEY = "\0doctor"  # its cache key in the engine, forgotten after


@dataclass(frozen=True)
class Check:
    name: str
    status: str                  # one of STATUSES
    message: str                 # one line: what was found
    fix: str = ""                # one line: what to do ("" when nothing is to be done)
    details: Mapping[str, Any] = field(default_factory=dict)  # JSON-able facts behind the message


@dataclass
class Subject:
    """The setup the checks look at, and what earlier checks leave for later ones (the engine)."""
    resolved: config.Resolved
    root: Path | None                  # the workspace root (None: a language server without a folder)
    warnings: list[str]                # what reading the options said (files, values, a withheld key)
    live: bool = False                 # the language server's: its engine and index are reported as they are
    engine: EngineClient | None = None
    engine_state: str = "not loaded"   # live: the service's (ready | loading | not loaded | failed: …)
    engine_error: str | None = None    # live: the last engine fault since a call succeeded ("code: message")
    index: WorkspaceIndex | None = None  # live: the service's (None: none); else the one check_workspace builds
    editor: Mapping[str, Any] | None = None  # live: client, position_encoding, documents

    @property
    def url(self) -> str | None:
        return self.resolved.values.get("engine")


@dataclass(frozen=True)
class Report:
    checks: tuple[Check, ...]

    @property
    def usable(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    @property
    def first(self) -> Check | None:
        """The first failure, else the first warning: the first thing to look at."""
        return next((c for c in self.checks if c.status == "fail"),
                    next((c for c in self.checks if c.status == "warn"), None))

    def to_json(self) -> dict:
        first = self.first
        return {"usable": self.usable, "checks": [_plain(asdict(c)) for c in self.checks],
                "first_problem": None if first is None else
                {"name": first.name, "status": first.status, "message": first.message, "fix": first.fix}}

    def lines(self) -> list[str]:
        """One line per check with its mark, then the verdict and the first problem's fix."""
        width = max(len(c.name) for c in self.checks)
        out = [f"{MARKS[c.status]} {c.name.ljust(width)}  {c.message}" for c in self.checks]
        first = self.first
        out.append("usable" if self.usable else "not usable")
        if first is not None:
            out[-1] += f"; {'first problem' if first.status == 'fail' else 'to look at'}: {first.name}: {first.message}"
            if first.fix:
                out.append(f"  fix: {first.fix}")
        return out


def _plain(v: Any) -> Any:
    """JSON's types (tuples → lists, paths → strings), for the CLI and the language server alike."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v) if isinstance(v, Path) else v


# -- the CLI's subject -------------------------------------------------------------------------------
def resolve(cli: Mapping[str, Any], root: Path) -> tuple[config.Resolved, list[str]]:
    """The options `completer complete` would use in the workspace `root` (its files under the
    command line, config's precedence and trust rule) and the warnings reading them gave."""
    layers, warnings = config.file_layers(root, root)
    r = config.resolve([*layers, config.Layer("command line", dict(cli), "cli")], SCOPES)
    withheld = r.engine_key()[1]
    return r, warnings + r.warnings + ([withheld] if withheld else [])


def engine_options(r: config.Resolved) -> dict[str, Any]:
    """pipeline.make_engine's arguments, as `completer complete` passes them (the key the trust rule allows)."""
    return {n: v for n, v in r.values.items() if config.OPTIONS[n].scope in ("engine", "client")} | \
        {"engine_api_key": r.engine_key()[0]}


# -- the checks, in order ----------------------------------------------------------------------------
def check_config(s: Subject) -> Check:
    """The config files found, what each sets, what a project file set that is not used, and
    what reading them warned about."""
    r = s.resolved
    files = [{"path": la.source, "kind": la.kind, "sets": sorted(la.values)} for la in r.layers
             if la.kind in ("user", "project") and la.values]
    user = config.user_config_path()
    refused = {n: {"source": x.source, "rule": x.rule, "why": x.why} for n, x in r.refused.items()}
    details = {"files": files, "user_file": str(user), "refused": refused, "warnings": list(s.warnings)}
    said = "; ".join(f"{f['kind']} file {f['path']} sets {', '.join(f['sets'])}" for f in files) or \
        f"no config files (looked for {user}" + (f" and {s.root / config.PROJECT_FILE})" if s.root else ")")
    if r.refused:
        source = next(iter(r.refused.values())).source
        by_why: dict[str, list[str]] = {}  # grouped as config's warning groups them, in order
        for n, x in r.refused.items():
            by_why.setdefault(x.why, []).append(n)
        message = f"{source}: " + "; ".join(f"{', '.join(ns)} not used ({why})" for why, ns in by_why.items())
        if all(x.rule == "widen" for x in r.refused.values()):
            fix = f"set trusted_workspaces in your own config, {user}"
        else:
            fix = (f"only if you trust this project: add {Path(source).parent} to trusted_workspaces in {user}; "
                   f"else set them in {user} or on the command line")
        return Check("config", "warn", message, fix, details)
    if s.warnings:
        more = f" (+{len(s.warnings) - 1} more)" if len(s.warnings) > 1 else ""
        return Check("config", "warn", s.warnings[0] + more,
                     "correct or remove the option (`completer options` lists each one's allowed values)", details)
    return Check("config", "ok", said, "", details)


def check_engine(s: Subject) -> Check:
    """The engine `completer complete` would use, built and warmed (models loaded, or the server
    asked for its model and FIM format); the language server's as its service left it."""
    where = {"engine": s.url or "in-process", "source": s.resolved.sources.get("engine", "default")}
    if s.live:
        return _live_engine(s, where)
    t0 = time.perf_counter()
    from .pipeline import make_engine

    try:
        s.engine = make_engine(**engine_options(s.resolved))
        s.engine.warm_start()
    except EngineError as e:
        _close(s)
        return Check("engine", "fail", e.message, engine_fix(e.code, s), {**where, "code": e.code})
    except Exception as e:  # a bad model directory, out of memory...: said in a line, not a traceback
        _close(s)
        log.debug("engine failed to load", exc_info=True)
        return Check("engine", "fail", f"{type(e).__name__}: {e}", engine_fix("internal", s), where)
    ms = (time.perf_counter() - t0) * 1e3
    st = s.engine.stats()
    what = (f"{s.url} answers ({ms:.0f} ms)" if s.url else
            f"in-process engine on {st.get('device', '?')} ready (loaded and warmed in {ms / 1e3:.1f} s)")
    return Check("engine", "ok", what, "", {**where, "ms": round(ms, 1)})


def _live_engine(s: Subject, where: dict) -> Check:
    state = s.engine_state
    if state.startswith("failed"):
        code, _, why = state.removeprefix("failed: ").partition(": ")
        code = code if code in ERROR_CODES else "internal"
        return Check("engine", "fail", f"failed to load: {why or state}", engine_fix(code, s),
                     {**where, "state": state})
    if s.engine is None:
        return Check("engine", "warn", f"the engine is {state}: ask again when it is ready",
                     "wait for the status to say ready (a model load takes seconds to minutes)",
                     {**where, "state": state})
    if s.engine_error:
        code = s.engine_error.partition(":")[0]
        return Check("engine", "warn", f"ready, but its last call failed: {s.engine_error}",
                     engine_fix(code if code in ERROR_CODES else "internal", s), {**where, "state": state})
    return Check("engine", "ok", f"{s.url} connected" if s.url else "in-process engine loaded", "",
                 {**where, "state": state})


def engine_fix(code: str, s: Subject) -> str:
    """What to do about an engine error of `code` (client.ERROR_CODES) with this setup's engine."""
    url, src = s.url, s.resolved.sources.get("engine", "default")
    if url:
        fixes = {
            "unavailable": f"start the server ({url}), or point engine ({src}) at one that runs, or unset "
                           "engine to load the models in-process",
            "not_ready": f"the server at {url} is loading its model: ask again when it is up",
            "unauthorized": "set engine_api_key beside engine in the same place (or COMPLETER_API_KEY)",
            "model": "set engine_model to a model the server lists, or fim_format to the model's family "
                     "(`completer options --scope engine`)",
            "overloaded": f"the server at {url} is busy: try again, or give it more capacity",
        }
    else:
        fixes = {
            "model": "check target and draft (a Hugging Face directory or hub id; the draft must share the "
                     "target's tokenizer); `completer config` says where each came from",
            "overloaded": "raise kv_budget_mb as the message says, or lower max_batch",
        }
    if code == "bad_request":
        return "correct the option the message names (`completer options` lists what is allowed)"
    return fixes.get(code, "run again with --log-level DEBUG and report the message")


def check_model(s: Subject) -> Check:
    """What the engine serves: the model (pair), whether the draft shares the target's tokenizer
    (checked when it loads), the FIM format, the context and the confidence gate in force."""
    if s.engine is None:
        return _skipped("model", "no engine")
    st = s.engine.stats()
    v = s.resolved.values
    ctx = st.get("ctx")
    if s.url:
        if not (st.get("model") or st.get("ctx")):
            return _skipped("model", f"the server at {s.url} has not answered yet")
        fmt = st.get("fim_format") or "the server's own (/infill or completer serve)"
        details = {"model": st.get("model"), "fim_format": fmt, "ctx": ctx}
        return Check("model", "ok", f"model {st.get('model') or '?'}; FIM {fmt}; context {ctx or '?'} tokens", "",
                     details)
    draft = st.get("draft")
    if v.get("target") is None:
        pair = "the embedded pair" + (" (its draft shares the target's tokenizer)" if draft else "")
    else:
        pair = f"target {st.get('target')}" + (f", draft {draft} (shares its tokenizer)" if draft else "")
    if not draft:
        pair += f", no draft model (drafter {v.get('drafter')})"
    if st.get("next_edit_model"):
        pair += f"; next edits by {st['next_edit_model']}"
    gate, edit_gate = st.get("min_confidence_in_force"), st.get("next_edit_min_confidence_in_force")
    details = {"target": st.get("target"), "draft": draft, "fim": st.get("fim"), "ctx": ctx,
               "device": st.get("device"), "draft_stored": st.get("draft_stored"), "min_confidence_in_force": gate,
               "next_edit_model": st.get("next_edit_model"), "next_edit_min_confidence_in_force": edit_gate}
    message = (f"{pair}; FIM {st.get('fim')}; context {ctx} tokens; "
               f"confidence gate {f'{gate:g}' if gate else 'off'}"
               + (f", next edits' {edit_gate:g}" if edit_gate else ""))
    if st.get("fim") == "none":
        return Check("model", "warn", f"{message}: no FIM tokens, completions see only the text before the cursor",
                     "use a model trained for fill-in-the-middle, or set fim_format to its family", details)
    return Check("model", "ok", message, "", details)


def check_native(s: Subject) -> Check:
    """The native CPU decode step: built for this CPU, or why not (then the NumPy step serves:
    a warning, the trial says whether that works)."""
    v = s.resolved.values
    if s.url:
        return Check("native", "skip", f"not used: the engine runs at {s.url}")
    if s.engine is None:
        return _skipped("native", "no engine")
    device = str(s.engine.stats().get("device", "cpu"))
    if not device.startswith("cpu"):
        return Check("native", "skip", f"not used on {device}")
    if not v.get("lean", True):
        return Check("native", "skip", "not used: lean = false (Hugging Face's forward serves)")
    from completer_kernels import native

    from .engine import native_lib

    lib, isa = native_lib.library()  # what the engine's runners got (loaded once per process)
    details = {"isa": isa if lib is not None else None, "why_not": None if lib is not None else isa,
               "cache": str(native_lib.cache_dir())}
    if lib is not None:
        return Check("native", "ok", f"built for {isa} ({native_lib.cache_dir()})", "", details)
    if native.isa_flags(native.cpu_flags()) is None:  # nothing to fix on this CPU
        return Check("native", "ok", f"not available ({isa}): the NumPy step serves", "", details)
    if config.env("COMPLETER_NATIVE") is not None and isa.startswith("disabled"):  # the user's choice
        return Check("native", "ok", f"off ({isa}): the NumPy step serves", "", details)
    return Check("native", "warn", f"not built ({isa}): the NumPy step serves, slower",
                 "install g++ (or set CXX to a working C++ compiler); it builds on the next start", details)


def check_workspace(s: Subject) -> Check:
    """The workspace index: files indexed and how long the walk took (CLI), or what the language
    server's index holds."""
    ws = s.resolved.build(config.WorkspaceOptions)
    if not ws.cross_file:
        return Check("workspace", "skip", "cross_file = false: no workspace index")
    if s.root is None:
        return Check("workspace", "skip", "no workspace folder: no cross-file context")
    if s.live:
        if s.index is None:
            return Check("workspace", "warn", f"{s.root} is not indexed: no cross-file context",
                         "see the language server's log for why", {"root": s.root})
        st, ms = s.index.stats(), None
    else:
        from .workspace import WorkspaceIndex, estimate_tokens

        t0 = time.perf_counter()
        try:
            s.index = WorkspaceIndex(s.root, ws, count_tokens=s.engine.count_tokens if s.engine else estimate_tokens)
            s.index.build()
        except OSError as e:
            return Check("workspace", "warn", f"cannot index {s.root}: {e}", "check the folder's permissions",
                         {"root": s.root})
        st, ms = s.index.stats(), round((time.perf_counter() - t0) * 1e3, 1)
    details = {"root": s.root, "ms": ms, **{k: st[k] for k in ("files", "bytes", "complete", "found", "partial")}}
    took = f" in {ms:.0f} ms" if ms is not None else "" if st["complete"] else " so far (still walking)"
    size = f"{st['bytes'] / 2**20:.1f} MiB" if st["bytes"] >= 2**20 else f"{st['bytes'] / 1024:.0f} KiB"
    message = f"{s.root}: {st['files']} file{'' if st['files'] == 1 else 's'} indexed{took} ({size})"
    if st["partial"]:
        return Check("workspace", "warn", f"{message}; {st['partial']}",
                     "open the project's own folder as the workspace (--workspace), or raise index_memory_mb",
                     details)
    return Check("workspace", "ok", message, "", details)


def check_trial(s: Subject) -> Check:
    """One completion through the pipeline (gate → context → engine → post-process) on the
    doctor's own text: its timings, and what the syntax layer did when nothing shows."""
    if s.engine is None:
        return _skipped("trial", "no engine")
    from .pipeline import CompletionOptions, complete_at

    r = s.resolved
    opts = CompletionOptions(max_new_tokens=r.values["max_new_tokens"], syntax=r.build(config.SyntaxOptions))
    try:
        c = complete_at(s.engine, TRIAL, len(TRIAL), language="python", doc_key=TRIAL_KEY, options=opts)
    except EngineError as e:
        return Check("trial", "fail", e.message, engine_fix(e.code, s), {"code": e.code})
    finally:
        try:
            s.engine.forget(TRIAL_KEY)
        except EngineError:
            pass  # a remote engine that is down keeps nothing
    syn = c.syntax
    details = {"text": c.text, "new_tokens": c.new_tokens, "ttft_ms": round(c.ttft_ms, 1),
               "total_ms": round(c.total_ms, 1), "accepted_per_forward": round(c.accepted_per_forward, 2),
               "confidence": c.confidence, "stop_reason": c.stop_reason,
               **({} if syn is None else {"gate": syn.gate, "gate_reason": syn.gate_reason,
                                          "syntax_ms": syn.syntax_ms, "engine_total_ms": syn.engine_total_ms,
                                          "postprocess_ms": syn.postprocess_ms,
                                          "dropped": None if syn.dropped is None else asdict(syn.dropped)})}
    timing = f"{c.new_tokens} tokens, first after {c.ttft_ms:.0f} ms, {c.total_ms:.0f} ms in all"
    if c.text.strip():
        first = c.text.strip().splitlines()[0]
        return Check("trial", "ok", f"completed {first[:60]!r} ({timing})", "", details)
    why = (syn.why_empty() if syn is not None else None) or \
        f"the model generated nothing (it stopped: {c.stop_reason or 'unknown'})"
    if syn is not None and syn.dropped is not None and syn.dropped.rule == "confidence":
        gate = s.engine.stats().get("min_confidence_in_force", r.values["min_confidence"]) or 0.0
        source = r.sources["min_confidence"] if r.values["min_confidence"] is not None else "the model's calibration"
        return Check("trial", "warn", f"nothing shown: {why} (min_confidence {gate:g}, {source}; {timing})",
                     "if good completions go missing, lower min_confidence (0 turns the gate off)", details)
    return Check("trial", "warn", f"nothing shown: {why} ({timing})",
                 "the syntax layer dropped what the model wrote: a stronger model helps (docs/models.md)", details)


def check_editor(s: Subject) -> Check:
    """The editor attached to the language server: its name, the position encoding it
    negotiated, its open documents, and whether completions are on."""
    if s.editor is None:
        return Check("editor", "skip", "no editor here: an editor asks its language server (completer/doctor)")
    e = dict(s.editor)
    message = (f"{e.get('client') or 'an unnamed client'} attached; position encoding "
               f"{e.get('position_encoding')}; {e.get('documents', 0)} open documents")
    if s.resolved.values.get("enable") is False:
        return Check("editor", "warn", f"{message}; completions are off (enable = false, "
                     f"{s.resolved.sources.get('enable')})",
                     "turn them on: VS Code's status menu, :Completer enable, or enable = true", e)
    return Check("editor", "ok", message, "", e)


CHECKS: tuple[Callable[[Subject], Check], ...] = (check_config, check_engine, check_model, check_native,
                                                  check_workspace, check_trial, check_editor)


def _skipped(name: str, why: str) -> Check:
    return Check(name, "skip", f"not checked: {why}")


def _close(s: Subject) -> None:
    if s.engine is not None and not s.live:
        s.engine.close()
    s.engine = None


def run(s: Subject) -> Report:
    """Every check in order (a check that raises is a failure with the exception's words); what
    the CLI's run built (the engine, the index) is closed after."""
    out = []
    try:
        for fn in CHECKS:
            name = fn.__name__.removeprefix("check_")
            try:
                out.append(fn(s))
            except Exception as e:  # a check's own bug: reported, the others still run
                log.debug("check %s raised", name, exc_info=True)
                out.append(Check(name, "fail", f"{type(e).__name__}: {e}",
                                 "run again with --log-level DEBUG and report the message"))
    finally:
        if not s.live:
            _close(s)
            if s.index is not None:
                s.index.close()
    return Report(tuple(out))
