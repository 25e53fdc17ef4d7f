"""`completer complete` end to end: the embedded pair on a real file, the JSON contract, raw
prompt mode, and bad input (one clear line on stderr, exit code 2, no traceback)."""
from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fib.py"


def run(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "completer.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, check=False)


def test_embedded_pair_completes_a_real_file():
    r = run("complete", str(ROOT / "examples" / "stack.py"), "--line", "7", "--col", "19", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("text", "new_tokens", "target_forwards", "accepted_per_forward", "ttft_ms",
                "total_ms", "speculative"):
        assert key in out
    assert out["speculative"] is True and out["new_tokens"] > 0 and out["ttft_ms"] > 0


def test_the_main_job_on_the_shipped_defaults_completes_and_a_gate_says_why(tmp_path):
    """The README's main job with no user config: the embedded pair (its fourth build, whose
    calibrated gate is 0: off) completes `append(item)` after `self.items.` in push(self, item);
    a stricter --min-confidence keeps its less sure answer quiet and the command says which rule
    dropped it."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}  # not the suite's user config (gate off)
    args = [sys.executable, "-m", "completer.cli", "complete", str(ROOT / "examples" / "stack.py"), "--line", "7",
            "--col", "19"]
    shown = subprocess.run(args, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env, check=False)
    assert shown.returncode == 0 and shown.stdout.strip() == "append(item)", shown.stderr
    quiet = subprocess.run([*args, "--min-confidence", "0.9"], capture_output=True, text=True, timeout=180,
                           cwd=ROOT, env=env, check=False)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "", quiet.stderr
    assert "no completion: the confidence rule dropped" in quiet.stderr


@pytest.mark.parametrize("eol", ["\r\n", "\r"])
def test_a_crlf_or_lone_cr_file_completes_where_the_language_server_would(tmp_path, eol):
    from completer.documents import Document

    text = (ROOT / "examples" / "stack.py").read_text().replace("\n", eol)
    (tmp_path / "stack.py").write_bytes(text.encode())
    r = run("complete", str(tmp_path / "stack.py"), "--line", "7", "--col", "19", "--json", "--max-new-tokens", "4")
    assert r.returncode == 0, r.stderr
    prefix = next(s for s in json.loads(r.stdout)["spans"] if s[0] == "prefix")
    assert prefix[2] == Document("u", text, "python").offset_at(7, 19, strict=True)


def test_raw_prompt_greedy_equals_no_speculative(tiny_pair, tmp_path):
    target, draft = tiny_pair
    prompt = tmp_path / "p.txt"
    prompt.write_text("import os\n\n\ndef main():\n    ")
    common = ["complete", "--prompt-file", str(prompt), "--max-new-tokens", "20", "--greedy",
              "--json", "--target", str(target), "--draft", str(draft)]
    spec, plain = run(*common), run(*common, "--no-speculative")
    assert spec.returncode == 0 and plain.returncode == 0, spec.stderr + plain.stderr
    a, b = json.loads(spec.stdout), json.loads(plain.stdout)
    assert a["token_ids"] == b["token_ids"] and len(a["token_ids"]) > 0
    assert a["speculative"] and not b["speculative"]


@pytest.mark.parametrize("args,message", [
    (["complete", "no/such/file.py", "--line", "0", "--col", "0"], "file not found"),
    (["complete", str(EXAMPLE), "--line", "99", "--col", "0"], "out of range"),
    (["complete", str(EXAMPLE), "--line", "0", "--col", "999"], "out of range"),
    (["complete", str(EXAMPLE)], "--line and --col are required"),
    (["complete", str(EXAMPLE), "--line", "0", "--col", "0", "--target", "/no/model"], "model directory not found"),
    (["complete", str(EXAMPLE), "--line", "0", "--col", "0", "--target", str(ROOT)], "not a Hugging Face model"),
])
def test_bad_input_is_one_clear_line(args, message):
    r = run(*args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_invalid_option_falls_back_with_one_warning():
    r = run("complete", str(EXAMPLE), "--line", "1", "--col", "4", "--quant", "int3", "--draft-len", "12", "--json")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in r.stderr
    assert "'quant' = 'int3'" in lines[0] and "one of auto, none" in lines[0] and "using 'auto'" in lines[0]
    assert "'draft_len' = 12" in lines[1] and "≤ 8" in lines[1] and "using 4" in lines[1]
    assert "text" in json.loads(r.stdout)


def test_long_raw_prompt_keeps_the_last_tokens_that_fit(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200)))
    r = run("complete", "--prompt-file", str(long), "--max-new-tokens", "8", "--greedy", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    ctx = json.loads((ROOT / "draft_models" / "default" / "target" / "config.json").read_text())["max_position_embeddings"]
    assert out["prompt_tokens_dropped"] > 0 and out["prompt_tokens"] + 8 < ctx and len(out["token_ids"]) == 8


def test_options_schema_and_config_sources(tmp_path):
    schema = json.loads(run("options", "--json-schema").stdout)["properties"]
    assert schema["draft_len"]["minimum"] == 1 and schema["quant"]["enum"][0] == "auto"
    assert schema["engine_api_key"]["x-scope"] == "client" and schema["debounce_ms"]["x-scope"] == "lsp"
    (tmp_path / "proj" / "pkg").mkdir(parents=True)
    (tmp_path / "proj" / ".git").mkdir()
    (tmp_path / "proj" / "pkg" / "m.py").write_text("x = 1\n")
    (tmp_path / "proj" / ".completer.toml").write_text('grid_lines = 32\nmax_lines = "many"\nbogus = 1\n')
    user = tmp_path / "xdg" / "completer"
    user.mkdir(parents=True)
    (user / "config.toml").write_text("grid_lines = 16\ntemperature = 0.5\n")
    r = subprocess.run([sys.executable, "-m", "completer.cli", "config", str(tmp_path / "proj" / "pkg" / "m.py"), "--json",
                        "--temperature", "0.2"], capture_output=True, text=True, cwd=ROOT, check=False,
                       env={**__import__("os").environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert r.returncode == 0, r.stderr
    eff = json.loads(r.stdout)
    assert eff["grid_lines"] == {"value": 32, "source": str(tmp_path / "proj" / ".completer.toml")}
    assert eff["temperature"] == {"value": 0.2, "source": "command line"}
    assert eff["draft_len"] == {"value": 4, "source": "default"}
    assert "unknown option 'bogus'" in r.stderr and "'max_lines' = 'many'" in r.stderr


def test_binary_and_non_utf8_files(tmp_path):
    binf, latin = tmp_path / "a.bin", tmp_path / "b.py"
    binf.write_bytes(b"\x00\x01\x02abc")
    latin.write_bytes("x = 'caf\xe9'\n".encode("latin-1"))
    for f, msg in ((binf, "binary"), (latin, "not UTF-8")):
        r = run("complete", str(f), "--line", "0", "--col", "0")
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


def test_tokenizer_mismatch_is_refused(tiny_pair, tmp_path):
    import shutil

    from tokenizers import Tokenizer

    target, draft = tiny_pair
    other = tmp_path / "draft"
    shutil.copytree(draft, other)
    tok = Tokenizer.from_file(str(other / "tokenizer.json"))
    tok.add_tokens(["<extra_token>"])
    tok.save(str(other / "tokenizer.json"))
    r = run("complete", "--prompt-file", str(EXAMPLE), "--target", str(target), "--draft", str(other))
    assert r.returncode == 2 and "tokenizer mismatch" in r.stderr


def test_version_and_a_bare_command():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"completer {__import__('completer').__version__}"
    r = run()
    assert r.returncode == 2 and "required" not in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.startswith("usage: completer") and all(c in r.stderr for c in ("complete", "serve", "config"))


def test_a_reader_that_leaves_is_no_traceback():
    """`completer options | head -1`: the pipe's reader is gone before the first write (closed at
    once, the interpreter is still starting): exit 141 like a SIGPIPE death, stderr empty."""
    for args in (["options"], ["config"], ["options", "--json-schema"]):
        p = subprocess.Popen([sys.executable, "-m", "completer.cli", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=ROOT)
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 141 and err == "", (args, err)


def test_log_level_has_choices():
    r = run("options", "--log-level", "loud")
    assert r.returncode == 2 and "invalid choice: 'LOUD'" in r.stderr and "DEBUG" in r.stderr
    assert "Traceback" not in r.stderr
    assert run("options", "--log-level", "debug").returncode == 0
    assert "--log-level LEVEL" in run("serve", "--help").stdout


def test_columns_stay_aligned_with_long_values():
    long_target = "/models/" + "a-very-long-directory-name/" * 3 + "target"
    lines = run("config", "--target", long_target).stdout.splitlines()
    assert any(long_target in ln for ln in lines)
    # the source column starts at the same offset on every line
    starts = {ln.rindex("command line") if ln.endswith("command line") else ln.rindex("  ") + 2 for ln in lines}
    assert len(starts) == 1, starts
    options, environment = run("options").stdout.split("\n\nenvironment variables:\n")
    from completer import config

    lines = options.splitlines()
    helps = [config.OPTIONS[ln.split()[0]].meta["help"] for ln in lines]
    assert len({ln.index(h) for ln, h in zip(lines, helps)}) == 1
    lines = environment.splitlines()
    assert len({ln.index(config.ENVIRONMENT[ln.split()[0]]) for ln in lines}) == 1 and len(lines) == len(config.ENVIRONMENT)


def test_the_main_job_imports_neither_triton_nor_transformers():
    """Cold start: triton (~0.3 s to import; the gpu extra) and transformers (seconds) are for CUDA
    kernels and models outside the lean families; the embedded pair needs neither."""
    code = ("import sys; from completer.cli import main; "
            f"rc = main(['complete', {str(ROOT / 'examples' / 'stack.py')!r}, '--line', '7', '--col', '19']); "
            "print(rc, sorted({m.split('.')[0] for m in sys.modules} & {'triton', 'transformers', 'bitsandbytes'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "0 []", r.stdout


def test_the_docs_name_real_flags():
    """Every `--flag` written after `completer COMMAND` or `completer-lsp` in the READMEs and docs/
    is one that command takes (the web editor's README once said --allow-origin)."""
    helps: dict[str, str] = {}
    docs = [ROOT / "README.md", ROOT / "editor-plugin" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = 0
    for doc in docs:
        for m in re.finditer(r"completer(-lsp| serve| complete| config| options)([^|`#\n]*)", doc.read_text()):
            cmd = m.group(1).strip()
            if cmd not in helps:
                argv = ["-m", "lsp.server"] if cmd == "-lsp" else ["-m", "completer.cli", cmd]
                helps[cmd] = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True,
                                            cwd=ROOT, timeout=120, check=False).stdout
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", m.group(2)):
                assert re.search(rf"{flag}\b(?!-)", helps[cmd]), f"{doc.name}: completer{m.group(1)} has no {flag}"
                checked += 1
    assert checked > 10


UTIL = '''"""Helpers."""


def scale_all(values, factor):
    """Every value times factor."""
    return [v * factor for v in values]


def unrelated(a):
    return a
'''
MAIN = '''from pkg.util import scale_all


def main(xs):
    return scale_all(
'''


class _FakeOpenAI(threading.Thread):
    """An OpenAI-compatible /v1 on 127.0.0.1 that keeps every prompt it is sent and answers a
    fixed completion, streamed (no /tokenize: the client estimates)."""

    def __init__(self, reply: str = "xs, 2)"):
        super().__init__(daemon=True)
        prompts = self.prompts = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: bytes, kind: str = "application/json"):
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    return self._send(200, json.dumps({"data": [{"id": "deepseek-coder-1.3b", "max_model_len": 4096}]}).encode())
                self._send(404, b"{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/completions":
                    return self._send(404, b"{}")
                prompts.append(body["prompt"])
                ev = {"choices": [{"text": reply, "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 100, "completion_tokens": 3}}
                self._send(200, f"data: {json.dumps(ev)}\n\ndata: [DONE]\n\n".encode(), "text/event-stream")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def run(self):
        self.server.serve_forever()


def test_a_definition_from_another_file_is_in_the_context_and_the_prompt(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'w'\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "util.py").write_text(UTIL)
    (tmp_path / "main.py").write_text(MAIN)
    fake = _FakeOpenAI()
    fake.start()
    try:
        engine = ["--engine", f"openai:http://127.0.0.1:{fake.server.server_address[1]}/v1"]
        r = run("complete", str(tmp_path / "main.py"), "--line", "4", "--col", "21", "--json", *engine)
        off = run("complete", str(tmp_path / "main.py"), "--line", "4", "--col", "21", "--json", "--no-cross-file",
                  *engine)
    finally:
        fake.server.shutdown()
    assert r.returncode == 0 and off.returncode == 0, r.stderr + off.stderr
    context = json.loads(r.stdout)["context"]  # the workspace root: the nearest pyproject.toml
    util = [c for c in context if c["path"] == "pkg/util.py"]
    assert [c["kind"] for c in util] == ["definition"] and util[0]["tokens"] > 0
    assert util[0]["start_line"] <= UTIL.splitlines().index("def scale_all(values, factor):") <= util[0]["end_line"]
    own = {c["kind"]: c for c in context if c["path"] == "main.py"}
    assert own["prefix"]["start_line"] == 0 and own["prefix"]["end_line"] == 4
    assert "def scale_all(values, factor):" in fake.prompts[0] and "unrelated" not in fake.prompts[0]
    assert "scale_all(values" not in fake.prompts[1]
    assert [c["path"] for c in json.loads(off.stdout)["context"]] == ["main.py", "main.py"]


def test_a_completion_that_shows_nothing_says_why(tmp_path):
    """The engine's whole reply is dropped (blank lines: the degenerate rule): --json names the
    rule and the raw text; the plain output prints nothing and says why on stderr; so does a
    position the gate turns down, without asking the engine."""
    (tmp_path / "a.py").write_text("def f(w, h):\n    \n\n\ndef g():\n    pass\n")
    fake = _FakeOpenAI(reply="\n\n\n\n\n\n\n\n")
    fake.start()
    try:
        engine = ["--engine", f"openai:http://127.0.0.1:{fake.server.server_address[1]}/v1"]
        js = run("complete", str(tmp_path / "a.py"), "--line", "1", "--col", "4", "--json", *engine)
        plain = run("complete", str(tmp_path / "a.py"), "--line", "1", "--col", "4", *engine)
        gated = run("complete", str(tmp_path / "a.py"), "--line", "0", "--col", "2", *engine)
    finally:
        fake.server.shutdown()
    assert js.returncode == plain.returncode == gated.returncode == 0, js.stderr + plain.stderr + gated.stderr
    out = json.loads(js.stdout)
    assert out["text"] == "" and out["dropped"]["rule"] == "degenerate"
    assert out["dropped"]["text"].startswith("\n\n") and "\n\n\n\n\n\n\n\n".startswith(out["dropped"]["text"])
    assert plain.stdout.strip() == "" and "Traceback" not in plain.stderr
    assert plain.stderr.strip().startswith("completer: no completion: the degenerate rule dropped")
    assert gated.stderr.strip() == "completer: no completion: gated off (inside an identifier)"
    assert len(fake.prompts) == 2  # the gated position never reached the engine
