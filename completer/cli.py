"""`completer ...`: one completion from a file position or a raw prompt, the engine service, and
the option schema (`options --json-schema`, `config`). Every option flag comes from
completer.config; this module only adds the command's own arguments."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import __version__, config, doctor, logs, netguard
from .client import EngineError

CONFIG_SCOPES = tuple(config.SCOPES)  # `completer config` shows every command's options


class UsageError(Exception):
    """Bad input from the user: one line on stderr, exit code 2."""


def read_source_file(path: str) -> str:
    from .documents import is_binary

    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"is a directory, not a file: {path}") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    if is_binary(data):
        raise UsageError(f"{path} looks binary (NUL bytes); only text files can be completed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 (byte {e.start}); re-encode it as UTF-8") from None


def resolve(a: argparse.Namespace, scopes: tuple[str, ...], project_start, root=None) -> config.Resolved:
    """Files < flags, with the CLI's two shorthands, under config's trust rule; warnings go to
    stderr (the run goes on). The project file is the one config.project_config_path finds from
    `project_start` up to `root` (default: its workspace root)."""
    cli = config.from_args(a)
    if getattr(a, "greedy", False):
        cli["temperature"] = 0.0
    if getattr(a, "no_speculative", False):
        cli["drafter"] = "none"
    if "token" in config.OPTIONS and "token" not in cli and config.env("COMPLETER_TOKEN") and "serve" in scopes:
        cli["token"] = config.env("COMPLETER_TOKEN")
    layers, warnings = config.file_layers(project_start, root)
    r = config.resolve([*layers, config.Layer("command line", cli, "cli")], scopes)
    withheld = r.engine_key()[1] if "client" in scopes else None
    for w in warnings + r.warnings + ([withheld] if withheld else []):
        print(f"completer: warning: {w}", file=sys.stderr)
    return r


def cmd_complete(a: argparse.Namespace) -> int:
    if a.prompt_file is None and a.path is None:
        raise UsageError("give a PATH with --line/--col, or --prompt-file")
    if a.prompt_file is None and (a.line is None or a.col is None):
        raise UsageError("--line and --col are required with PATH")
    r = resolve(a, ("engine", "client", "syntax", "workspace"), a.prompt_file or a.path,
                a.workspace if a.prompt_file is None else None)
    if a.prompt_file is not None:
        return _complete_raw(a, r)
    return _complete_file(a, r)


def _complete_raw(a: argparse.Namespace, r: config.Resolved) -> int:
    """Raw prompt mode: no syntax layer; the ids are the target's own greedy ids with --greedy.
    A prompt longer than the context keeps its last tokens (how many were dropped is reported)."""
    from .engine.engine import Engine, to_completion

    text = read_source_file(a.prompt_file)
    engine = Engine(r.build(config.EngineConfig))
    prompt = engine.tok.encode(text, add_special_tokens=False).ids
    if not prompt:
        raise UsageError(f"{a.prompt_file} is empty")
    keep = engine.prompt_budget(engine.cfg.max_new_tokens)
    dropped = max(len(prompt) - keep, 0)
    ids, st = engine.complete_ids(prompt[dropped:])
    c = to_completion(engine.decode(ids), ids, st, engine.cfg.drafter != "none",
                      extra={"prompt_tokens_dropped": dropped})
    print(json.dumps(c.to_json()) if a.json else c.text)
    return 0


def _complete_file(a: argparse.Namespace, r: config.Resolved) -> int:
    """File mode: the syntax-aware pipeline (gate → context → engine → post-process), with the
    definitions from other files of the workspace (`--workspace`, default: the file's project root)."""
    from .documents import PositionError, language_for
    from .pipeline import CompletionOptions, complete_at, make_engine, resolve_offset
    from .workspace import WorkspaceIndex, find_root

    text = read_source_file(a.path)
    language = language_for(path=a.path)
    try:
        resolve_offset(text, (a.line, a.col))
    except PositionError as e:
        raise UsageError(str(e)) from None
    root = Path(a.workspace) if a.workspace else find_root(a.path)
    if not root.is_dir():
        raise UsageError(f"--workspace {a.workspace} is not a directory")
    engine = make_engine(**{k: r.values[k] for k in r.values if config.OPTIONS[k].scope in ("engine", "client")}
                         | {"engine_api_key": r.engine_key()[0], "prefetch": False})  # one shot: nothing to accept
    opts = CompletionOptions(max_new_tokens=r.values["max_new_tokens"], syntax=r.build(config.SyntaxOptions))
    ws_opts = r.build(config.WorkspaceOptions)
    index = None
    if ws_opts.cross_file:
        index = WorkspaceIndex(root, ws_opts, count_tokens=engine.count_tokens)
        index.build()
    c = complete_at(engine, text, (a.line, a.col), language=language, doc_key=str(Path(a.path).resolve()),
                    options=opts, workspace=index, path=str(Path(a.path).resolve()))
    if a.json:  # `dropped` names the rule and the raw text when nothing is left to show
        print(json.dumps(c.to_json()))
    else:
        print(c.text)
        if not c.text.strip():
            why = (c.syntax.why_empty() if c.syntax is not None else None) or \
                f"the model generated nothing (it stopped: {c.stop_reason or 'unknown'})"
            print(f"completer: no completion: {why}", file=sys.stderr)
    engine.close()
    return 0


NEXT_EDIT_OPTIONS = ("next_edit_format", "next_edit_rename", "next_edit_rename_first", "next_edit_lines_above",
                     "next_edit_lines_below", "next_edit_max_lines")


def cmd_next_edit(a: argparse.Namespace) -> int:
    """The next edit after the user changed --before OLD into PATH, cursor at --line/--col: the
    history is the diff OLD → PATH (completer/edits/predict.py)."""
    from .documents import PositionError, offset_at
    from .edits.diff import apply_edits
    from .edits.predict import HistoryError, from_versions, predict
    from .pipeline import make_engine

    text, old = read_source_file(a.path), read_source_file(a.before)
    try:
        offset_at(text, a.line, a.col, exact=True)
    except PositionError as e:
        raise UsageError(str(e)) from None
    try:
        history = from_versions(old, text, Path(a.path).as_posix())
    except HistoryError as e:
        raise UsageError(f"--before {a.before}: {e}") from None
    r = resolve(a, ("engine", "client", "lsp"), a.path)
    v = r.values
    engine = make_engine(**{k: v[k] for k in v if config.OPTIONS[k].scope in ("engine", "client")}
                         | {"engine_api_key": r.engine_key()[0], "prefetch": False})
    ne = predict(engine, text, a.line, a.col, history, path=Path(a.path).as_posix(), fmt=v["next_edit_format"],
                 speculative=not a.no_speculative, doc_key=str(Path(a.path).resolve()),
                 above=v["next_edit_lines_above"], below=v["next_edit_lines_below"], max_lines=v["next_edit_max_lines"],
                 rename=v["next_edit_rename"], rename_first=v["next_edit_rename_first"])
    engine.close()
    if a.json:
        print(json.dumps(ne.to_json()))
    elif ne.dropped is not None:
        print(f"completer: no next edit: {ne.dropped}", file=sys.stderr)
    else:
        import difflib

        new = apply_edits(text, ne.edits)
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(keepends=True), new.splitlines(keepends=True),
                                                   a.path, a.path))
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    from .serve.app import run

    r = resolve(a, ("engine", "serve"), Path.cwd())
    serve_cfg, engine_cfg = r.build(config.ServeConfig), r.build(config.EngineConfig)
    refusal = netguard.listen_refusal(serve_cfg.host, serve_cfg.token)
    if refusal:
        raise UsageError(refusal)

    def make_engine():
        from .engine.engine import Engine

        return Engine(engine_cfg)

    return run(serve_cfg, make_engine)


def cmd_doctor(a: argparse.Namespace) -> int:
    """The setup `completer complete` would use in the workspace (default: the current
    directory), checked in order (completer/doctor.py); exit 0 when usable, 1 when not."""
    if a.workspace is not None and not Path(a.workspace).is_dir():
        raise UsageError(f"--workspace {a.workspace} is not a directory")
    root = config.workspace_root(a.workspace or Path.cwd())
    r, warnings = doctor.resolve(config.from_args(a, doctor.SCOPES + ("trust",)), root)
    report = doctor.run(doctor.Subject(r, root, warnings))
    print(json.dumps(report.to_json(), indent=2) if a.json else "\n".join(report.lines()))
    return 0 if report.usable else 1


def cmd_options(a: argparse.Namespace) -> int:
    scopes = a.scope or tuple(config.SCOPES)
    if a.json_schema:
        print(json.dumps(config.json_schema(scopes), indent=2))
        return 0
    print_columns([(o.name, o.scope, config.show(o, o.default), o.meta["help"])
                   for o in config.OPTIONS.values() if o.scope in scopes])
    if a.scope is None:
        print("\nenvironment variables:")
        print_columns(list(config.ENVIRONMENT.items()))
    return 0


def cmd_config(a: argparse.Namespace) -> int:
    """Every option of every command for a file or workspace (default: the current directory):
    its effective value, where it came from, and what the project file set that was not used and
    why (config.Resolved.refused: `rule` is config.REFUSALS' key or "at_most")."""
    if a.workspace is not None and not Path(a.workspace).is_dir():
        raise UsageError(f"--workspace {a.workspace} is not a directory")
    r = resolve(a, CONFIG_SCOPES, a.path or a.workspace or Path.cwd(), a.workspace)

    def plain(v):
        return list(v) if isinstance(v, tuple) else v

    secret = {n for n in r.values if config.OPTIONS[n].meta.get("secret")}
    if a.json:
        out = {n: {"value": None if n in secret and v else plain(v), "source": r.sources[n]} for n, v in r.values.items()}
        for n, x in r.refused.items():
            out[n]["refused"] = {"value": None if n in secret else plain(x.value), "source": x.source, "rule": x.rule,
                                 "why": x.why}
        print(json.dumps(out, indent=2))
        return 0
    rows = []
    for n, v in r.values.items():
        rows.append((n, config.show(config.OPTIONS[n], v), r.sources[n]))
        if n in r.refused:
            x = r.refused[n]
            rows.append(("", "refused: " + config.show(config.OPTIONS[n], x.value), f"{x.source}: {x.why}"))
    print_columns(rows)
    return 0


def print_columns(rows: list[tuple[str, ...]]) -> None:
    """Each column as wide as its widest cell (values such as paths and URLs can be long); the
    last column is free text."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)] if rows else []
    for r in rows:
        print("  ".join([cell.ljust(w) for cell, w in zip(r, widths)] + [r[-1]]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="completer", description="Code completion with speculative decoding.")
    ap.add_argument("--version", action="version", version=f"completer {__version__}")
    common = argparse.ArgumentParser(add_help=False)  # every command's own flags
    logs.add_argument(common)
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    c = sub.add_parser("complete", parents=[common], help="complete at a file position, or continue a raw prompt")
    c.add_argument("path", nargs="?", help="source file (with --line and --col)")
    c.add_argument("--line", type=int, help="0-based line")
    c.add_argument("--col", type=int, help="0-based column in characters")
    c.add_argument("--prompt-file", help="raw prompt mode: continue this text (no syntax layer)")
    c.add_argument("--json", action="store_true", help="print one JSON object (with `context`: what the prompt holds)")
    c.add_argument("--workspace", metavar="DIR", help="the workspace other files' definitions come from (default: "
                   "the nearest parent with .git, pyproject.toml, setup.py, package.json, go.mod or Cargo.toml, "
                   "else the file's directory)")
    c.add_argument("--greedy", action="store_true", help="greedy decoding (temperature 0)")
    c.add_argument("--no-speculative", action="store_true", help="plain decoding, no drafter")
    config.add_arguments(c, ("engine", "client", "syntax", "workspace", "trust"))
    n = sub.add_parser("next-edit", parents=[common], help="predict the next edit after the changes from --before to PATH")
    n.add_argument("path", help="source file as it is now")
    n.add_argument("--line", type=int, required=True, help="0-based line of the cursor")
    n.add_argument("--col", type=int, required=True, help="0-based column in characters")
    n.add_argument("--before", required=True, metavar="OLD", help="the same file before the recent edits (the "
                   "history is the diff OLD -> PATH)")
    n.add_argument("--json", action="store_true", help="print one JSON object: edits (0-based lines, columns in "
                   "characters, in PATH) and the engine's numbers")
    n.add_argument("--no-speculative", action="store_true", help="plain decoding (no speculative edits)")
    config.add_arguments(n, ("engine", "client", "trust"))
    config.add_arguments(n, ("lsp",), "next-edit options", only=NEXT_EDIT_OPTIONS)
    s = sub.add_parser("serve", parents=[common], help="the engine service: WebSocket+msgpack at /ws, OpenAI /v1/completions, "
                                     "/metrics, /health")
    config.add_arguments(s, ("serve", "engine", "trust"))
    d = sub.add_parser("doctor", parents=[common], help="check the setup in order (config, engine, model, native "
                       "step, workspace index, a trial completion) and say the first thing wrong with its fix")
    d.add_argument("--workspace", metavar="DIR", help="the workspace to check (its .completer.toml, its index) "
                   "[default: the current directory]")
    d.add_argument("--json", action="store_true", help="print one JSON object: usable, checks, first_problem")
    config.add_arguments(d, (*doctor.SCOPES, "trust"))
    o = sub.add_parser("options", parents=[common], help="list the options (the one schema behind flags, LSP options, config files)")
    o.add_argument("--json-schema", action="store_true", help="print them as a JSON Schema")
    o.add_argument("--scope", action="append", choices=tuple(config.SCOPES), help="only these scopes")
    g = sub.add_parser("config", parents=[common], help="print every option's effective value, where it came from, "
                       "and what the project's .completer.toml set that was not used")
    g.add_argument("path", nargs="?", help="a file (its workspace root found as for `complete`) or a workspace root "
                   "directory (as the language server opens it); default: --workspace, else the current directory")
    g.add_argument("--workspace", metavar="DIR", help="the workspace root: a .completer.toml above it never applies")
    g.add_argument("--json", action="store_true")
    config.add_arguments(g, CONFIG_SCOPES)
    a = ap.parse_args(argv)
    if a.cmd is None:  # a bare `completer`: what it can do, not argparse's "arguments are required"
        ap.print_help(sys.stderr)
        return 2
    logs.configure(a.log_level)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _quiet_libraries(progress=not getattr(a, "json", False))
    commands = {"complete": cmd_complete, "next-edit": cmd_next_edit, "serve": cmd_serve, "options": cmd_options,
                "config": cmd_config, "doctor": cmd_doctor}
    try:
        return commands[a.cmd](a)
    except (UsageError, EngineError) as e:
        print(f"completer: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _reader_gone()


def entry() -> None:
    """The `completer` command: main(), then exit without finalising the interpreter. Tearing
    down torch's ~800 modules took 0.2-0.45 s after the completion was printed (measured on the
    2-core build machine); nothing of ours needs it: logs and stdout are flushed here."""
    import logging

    rc = main()
    logging.shutdown()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        rc = _reader_gone()
    sys.stderr.flush()
    os._exit(rc)


def _reader_gone() -> int:
    """stdout's reader left (`completer options | head -3`): no traceback. stdout now goes to
    /dev/null so that no later flush fails again; the status is a SIGPIPE death's, as for tools
    that do not catch it."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + 13


def _quiet_libraries(progress: bool) -> None:
    """Library warnings off; hub download bars (stderr) only when stdout is not JSON for a tool."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if not progress:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


if __name__ == "__main__":
    entry()
