"""llama-server's `POST /infill` on `completer serve` (completer/serve/infill.py), as the plugins
send it, against a real server: the request bodies llama.vim (a1c8e6e, autoload/llama.vim) and
llama.vscode (v0.0.63, src/llama-server.ts) build, with every option they set, replayed and read
as each client reads the answer (llama.vim matches the raw text before decoding it); a
plugin-shaped session (ring warm-ups, a completion, typing through it, n_cmpl: 3);
response_fields; the t_max_predict_ms deadline; stop strings and n_indent; the SSE stream; the
gate; bad bodies in llama-server's error shape; the trust rules. Then the module's rules as tables.

The server runs the embedded pair, as tests/test_openai_api.py does: the tiny recipe pair's
completions are blank after post-processing, and nothing blank can be typed through or cut."""
from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request

import pytest
from helpers.serve import metric, start_server, stop_server

from completer.serve import infill

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BODY = 1 << 20
# llama.vim's response_fields (llama#fim)
VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
              "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
              "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
RING = [{"text": "def sub(a, b):\n    return a - b\n", "time": [1790000000, 250000], "filename": "util.py"}]
# places to complete (lines, row; the cursor at the row's end), for a model's answers to fit a test
ONE_LINE = [(["import json", "", "", "def load(path):", "    with open(path) as f:", "        return json.", ""],
             5),
            (["import os", "", "", "def join(a, b):", "    return os.path.", ""], 4),
            (["import sys", "", "", "def main(argv):", "    if len(argv) < 2:", "        sys.", ""], 5)]
MULTI_LINE = [(["import os", "import sys", "", "", "def main(argv):", "", ""], 5),  # the third build: 3 lines
              (["def read(path):", "    try:", "", ""], 2),
              (["class Point:", "    def __init__(self, x, y):", "", ""], 2),
              (["def load(path):", "    with open(path) as f:", "", ""], 2),
              (["import unittest", "", "", "class TestLoad(unittest.TestCase):", "", ""], 4)]


@pytest.fixture(scope="module")
def server():
    p, addr = start_server("--token", TOKEN, "--max-frame-bytes", str(MAX_BODY), "--max-new-tokens", "32")
    yield addr
    stop_server(p)


@pytest.fixture(scope="module")
def place(server) -> tuple[list[str], int]:
    """(lines, row) of ONE_LINE where the model completes at least 4 characters."""
    for lines, row in ONE_LINE:
        if len(ask(server, vim_body(lines, row, len(lines[row]), RING))["content"]) >= 4:
            return lines, row
    pytest.fail("the model completes none of ONE_LINE with 4 characters or more")


@pytest.fixture(scope="module")
def multi(server) -> tuple[dict, dict]:
    """(a request, its whole answer) at a place of MULTI_LINE the model completes with 2 lines or more."""
    for lines, row in MULTI_LINE:
        body = {**vim_body(lines, row, len(lines[row]), RING), "n_predict": 256, "cache_prompt": False,
                "t_max_predict_ms": 0, "response_fields": []}
        full = ask(server, body)
        if len([line for line in full["content"].split("\n") if line.strip()]) >= 2 and not full["truncated"]:
            return body, full
    pytest.fail("the model completes none of MULTI_LINE with 2 lines or more")


# -- the clients' request bodies --------------------------------------------------------------------
def vim_body(lines: list[str], row: int, col: int, extra: list, first: bool = True) -> dict:
    """llama#fim's request at (row, col) of a buffer (s:fim_ctx_local without a previous
    completion; the default g:llama_config): n_prefix 256, n_suffix 64 lines, the cursor line's
    start as `prompt`, its indentation as n_indent (0 and no line part on a blank line);
    t_max_predict_ms 250 for a first request, 1000 for the speculative one after it. `model` is
    always sent (its existence check tests a string literal), "" by default."""
    cur = lines[row]
    blank = not cur.strip()
    before, after = ("", "") if blank else (cur[:col], cur[col:])
    return {"id_slot": 0, "input_prefix": "\n".join(lines[max(0, row - 256):row]) + "\n",
            "input_suffix": after + "\n" + "\n".join(lines[row + 1:row + 65]) + "\n", "input_extra": extra,
            "prompt": before, "n_predict": 128, "stop": [],
            "n_indent": 0 if blank else len(cur) - len(cur.lstrip()),
            "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 250 if first else 1000,
            "response_fields": VIM_FIELDS, "model": ""}


def vim_ring(extra: list) -> dict:
    """s:ring_update's request: the new extra context alone, nothing generated."""
    return {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "",
            "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""], "model": ""}


def vscode_body(lines: list[str], row: int, col: int, extra: list) -> dict:
    """getFIMCompletion's request (createRequestPayload(false, ...), default settings): n_prefix
    256, n_suffix 64, n_cmpl 3 (max_parallel_completions), a whitespace-only line start sent as
    "", n_indent only when not 0, and `model`: the ai_model setting, whose default names a
    hosted chat model (a server that refused other models would refuse every completion)."""
    cur = lines[row]
    prompt = "" if not cur[:col].strip(" \t") else cur[:col]
    body = {"id_slot": 0, "input_prefix": "\n".join(lines[max(0, row - 256):row]) + "\n",
            "input_suffix": cur[col:] + "\n" + "\n".join(lines[row + 1:min(len(lines) - 1, row + 64) + 1]) + "\n",
            "input_extra": extra, "prompt": prompt, "n_predict": 128, "n_cmpl": 3, "top_k": 40, "top_p": 0.99,
            "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True}
    if len(cur) - len(cur.lstrip()):
        body["n_indent"] = len(cur) - len(cur.lstrip())
    return {**body, "t_max_prompt_ms": 500, "t_max_predict_ms": 500, "model": "google/gemini-2.5-flash"}


def vscode_prep(extra: list) -> dict:
    """updateExtraContext's request (createRequestPayload(true, "", "", chunks, "", model))."""
    return {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "",
            "n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}


def vscode_chunks(extra: list) -> list:
    """llama.vscode's chunks: an absolute file name, Date.now() as the time."""
    return [{"text": c["text"], "time": 1790000000000 + i, "filename": "/home/u/proj/" + c["filename"]}
            for i, c in enumerate(extra)]


def post(server: str, body=None, raw: bytes | None = None, headers=AUTH, path: str = "/infill"):
    """(status, headers, raw body) of a POST, as curl or axios sends it (JSON)."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{server}{path}", data=data,
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def ask(server: str, body: dict):
    status, _, raw = post(server, body)
    assert status == 200, raw
    return json.loads(raw)


def events(server: str, body: dict) -> tuple[str, list[bytes]]:
    """(Content-Type, the raw `data:` payloads) of a streamed request."""
    conn = http.client.HTTPConnection(*server.split(":"), timeout=120)
    conn.request("POST", "/infill", json.dumps({**body, "stream": True}),
                 {**AUTH, "Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    raw = r.read()
    conn.close()
    assert raw.endswith(b"\n\n") and all(e.startswith(b"data: ") for e in raw[:-2].split(b"\n\n")), raw
    return r.getheader("Content-Type"), [e[len(b"data: "):] for e in raw[:-2].split(b"\n\n")]


def warmups(server: str) -> dict[str, float]:
    """Warm-ups by outcome (/metrics): ok, dropped (replaced while it waited), error."""
    with urllib.request.urlopen(urllib.request.Request(f"http://{server}/metrics", headers=AUTH)) as r:
        text = r.read().decode()
    return {o: metric(text, f'completer_requests_total{{kind="warmup",outcome="{o}"}}')
            for o in ("ok", "dropped", "error")}


def settle_warmups(server: str, before: dict[str, float], n: int) -> dict[str, float]:
    """Wait until `n` warm-ups sent since `before` have ended (they are not answered) → the counts."""
    deadline = time.monotonic() + 60
    while sum((now := warmups(server)).values()) < sum(before.values()) + n:
        assert time.monotonic() < deadline, "the warm-ups never ran"
        time.sleep(0.05)
    return now


# -- the clients' requests ----------------------------------------------------------------------------
@pytest.mark.slow
def test_llama_vim_reads_the_answer(server, place):
    """llama.vim keeps an answer only when its raw text starts with `{` and holds `"content":"`
    (no space: llama-server's compact JSON); it reads the slash paths as literal keys."""
    lines, row = place
    body = vim_body(lines, row, len(lines[row]), RING)
    status, headers, raw = post(server, body)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert re.match(rb"\s*\{", raw) and re.search(rb'"content"\s*:"', raw), raw
    first = json.loads(raw)
    assert list(first) == VIM_FIELDS  # every field it asked for, in its order, and nothing else
    assert first["content"] and first["truncated"] is False and first["timings/prompt_n"] >= 1
    assert all(isinstance(first[k], float) for k in VIM_FIELDS if k.endswith(("_ms", "_second")))
    again = ask(server, body)  # the same place again: generated again, its prompt from the KV cache
    assert again["content"] == first["content"]
    assert again["tokens_cached"] > 0 and again["timings/prompt_n"] <= 1


@pytest.mark.slow
def test_llama_vscode_gets_an_array_for_n_cmpl(server, place):
    """n_cmpl: 3 answers an array of the distinct completions (one with greedy decoding), each in
    the shape getComplFromContent and the status bar read; without n_cmpl, one object."""
    lines, row = place
    body = vscode_body(lines, row, len(lines[row]), vscode_chunks(RING))
    status, _, raw = post(server, body, headers={**AUTH, "Accept": "application/json, text/plain, */*"})
    assert status == 200
    answers = json.loads(raw)
    assert isinstance(answers, list) and 1 <= len(answers) <= 3
    assert len({a["content"] for a in answers}) == len(answers)
    for i, a in enumerate(answers):
        assert a["index"] == i and a["stop"] is True and isinstance(a["tokens_cached"], int)
        assert a["generation_settings"]["n_ctx"] > 0
        assert {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                "predicted_per_second"} <= set(a["timings"])
    one = ask(server, {k: v for k, v in body.items() if k != "n_cmpl"})
    assert isinstance(one, dict) and one["content"] == answers[0]["content"]


@pytest.mark.slow
def test_a_plugin_session(server, place):
    """Ring warm-ups, a completion, a ring update that prepares the next completion (its prompt
    all in the KV cache when it comes), typing through it, n_cmpl: 3 further on."""
    before = warmups(server)
    assert post(server, vim_ring(RING))[2] == b"{}"  # response_fields [""] names no field
    status, _, raw = post(server, vscode_prep(vscode_chunks(RING)))
    assert status == 200 and json.loads(raw)["content"] == ""
    before = settle_warmups(server, before, 2)

    lines, row = place
    assert ask(server, vim_body(lines, row, len(lines[row]), RING))["content"]
    more = RING + [{"text": "def mul(a, b):\n    return a * b\n", "time": [1790000001, 0], "filename": "ops.py"}]
    assert post(server, vim_ring(more))[2] == b"{}"
    assert settle_warmups(server, before, 1)["ok"] == before["ok"] + 1
    again = ask(server, {**vim_body(lines, row, len(lines[row]), more), "response_fields": []})
    assert again["timings"]["prompt_n"] <= 1 and again["tokens_cached"] >= again["tokens_evaluated"] - 1 > 0

    shown = again["content"]
    assert len(shown) > 3
    typed = lines[:row] + [lines[row] + shown[:2]] + lines[row + 1:]
    rest = ask(server, vim_body(typed, row, len(typed[row]), more, first=False))
    assert rest["content"] == shown[2:] and rest["timings/predicted_n"] == 0  # without the model
    typed[row] += shown[2]
    answers = ask(server, vscode_body(typed, row, len(typed[row]), vscode_chunks(more)))
    assert isinstance(answers, list) and answers[0]["content"] == shown[3:]


@pytest.mark.slow
def test_response_fields_are_literal_paths(server, place):
    lines, row = place
    body = {**vim_body(lines, row, len(lines[row]), RING), "response_fields": [
        "content", "timings/prompt_n", "generation_settings/n_ctx", "stop_type", "no/such", "timings/nope", ""]}
    r = ask(server, body)
    assert list(r) == ["content", "timings/prompt_n", "generation_settings/n_ctx", "stop_type"]
    assert r["generation_settings/n_ctx"] > 0 and r["stop_type"] in ("eos", "limit", "word")


@pytest.mark.slow
def test_t_max_predict_ms_cuts_after_a_whole_line(server, multi):
    """A deadline of 1 ms with a large n_predict: the answer is cut once a line is complete
    (truncated, stop_type limit, a beginning of the whole answer), or it came whole before."""
    body, full = multi
    for _ in range(2):
        cut = ask(server, {**body, "t_max_predict_ms": 1})
        if cut["truncated"]:
            assert cut["stop_type"] == "limit" and cut["content"]
            assert full["content"].startswith(cut["content"]) and len(cut["content"]) < len(full["content"])
        else:
            assert cut["content"] == full["content"] and cut["stop_type"] == full["stop_type"]


@pytest.mark.slow
def test_stop_strings_and_n_indent_cut_the_answer(server, multi):
    body, full = multi[0], multi[1]["content"]
    second = next(line for line in full.split("\n")[1:] if line.strip())  # the first line after one
    stop = second.strip()[:3]
    r = ask(server, {**body, "stop": ["never-generated", stop]})
    assert r["content"] == full[:full.find(stop)] and r["stop_type"] == "word" and r["stopping_word"] == stop
    indent = len(second) - len(second.lstrip()) + 1  # that line is indented less than this
    r = ask(server, {**body, "n_indent": indent})
    assert r["content"] == full[:full.find("\n" + second) + 1] and r["stop_type"] == "limit"


@pytest.mark.slow
def test_the_stream_is_llama_servers(server, multi):
    """Server-sent events: partial results (stop false) whose contents make the answer, then the
    final result with its timings and an empty content; no [DONE]."""
    body, whole = multi
    ctype, raw = events(server, body)
    assert ctype.startswith("text/event-stream")
    assert all(e.startswith(b'{"index":0,"content":') for e in raw)  # compact, llama-server's key order
    got = [json.loads(e) for e in raw]
    *parts, last = got
    assert parts and all(p["stop"] is False for p in parts)
    assert "".join(p["content"] for p in parts) == whole["content"]
    assert last["stop"] is True and last["content"] == "" and last["timings"]["predicted_n"] > 0
    assert last["stop_type"] == whole["stop_type"]


@pytest.mark.slow
def test_what_the_gate_leaves_empty_is_empty(server):
    """Inside an identifier (the syntax layer gates it off): content "", nothing generated."""
    lines = ["import os", "", "print(os.getcwd())", ""]
    r = ask(server, {**vim_body(lines, 2, 3, RING), "response_fields": []})
    assert r["content"] == "" and r["tokens_predicted"] == 0


@pytest.mark.parametrize("body, raw, status, start", [
    (None, b"{not json", 400, "the body is not valid JSON"),
    (None, b"[" * 10_000 + b"]" * 10_000, 400, "the body is not valid JSON"),
    ([1], None, 400, "the body must be a JSON object"),
    (None, b'{"input_suffix": ""}', 400, 'missing field "input_prefix"'),
    (None, b'{"input_prefix": ""}', 400, 'missing field "input_suffix"'),
    ({"input_prefix": 1, "input_suffix": ""}, None, 400, 'field "input_prefix" must be a string'),
    ({"n_predict": "9"}, None, 400, 'field "n_predict" must be an integer'),
    ({"n_predict": -2}, None, 400, "Field 'n_predict': Value must be between -1 <= value <= "),
    ({"n_cmpl": 99}, None, 400, "Field 'n_cmpl': Value must be between 1 <= value <= 8, but got 99"),
    ({"input_extra": {"text": "x"}}, None, 400, 'field "input_extra" must be a list'),
    ({"input_extra": [{"filename": "a.py"}]}, None, 400, '"input_extra[0]": missing field "text"'),
    ({"input_extra": [{"text": "x", "filename": 3}]}, None, 400, '"input_extra[0]": field "filename"'),
    ({"input_extra": [{"text": "x"}] * 65}, None, 400, '"input_extra" has 65 chunks'),
    ({"input_extra": [{"text": "x" * 300_000}]}, None, 400, '"input_extra" holds more than 256 KiB'),
    ({"stop": ["a"] * 17}, None, 400, "Field 'stop'"),
    ({"stop": [1]}, None, 400, "Field 'stop'"),
    ({"response_fields": [1]}, None, 400, "Field 'response_fields'"),
    ({"stream": "yes"}, None, 400, 'field "stream" must be a boolean'),
    (None, b'{"input_prefix": "", "input_suffix": "", "t_max_predict_ms": NaN}', 400,
     "Field 't_max_predict_ms': Value must be between"),
    ({"input_prefix": "x" * (MAX_BODY + 1)}, None, 413, "the body exceeds"),
])
@pytest.mark.slow
def test_bad_bodies_get_llama_servers_error(server, place, body, raw, status, start):
    if isinstance(body, dict):
        body = {"input_prefix": "", "input_suffix": "", **body}
    got, _, answer = post(server, body, raw)
    assert got == status, answer
    assert answer.startswith(b'{"error":{"code":%d,"message":' % status)
    e = json.loads(answer)["error"]
    assert list(e) == ["code", "message", "type"] and e["type"] == "invalid_request_error"
    assert e["message"].startswith(start), e["message"]
    lines, row = place
    assert ask(server, vim_body(lines, row, len(lines[row]), RING))["content"]  # and the server serves on


@pytest.mark.slow
def test_the_trust_rules_are_serves(server):
    body = vim_body(["import os", ""], 1, 0, RING)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, _, raw = post(server, body, headers=headers)
        assert status == 401 and json.loads(raw) == {
            "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
    assert post(server, body, headers={}, path=f"/infill?token={TOKEN}")[0] == 200
    assert post(server, body, headers={**AUTH, "Origin": "http://localhost:5173"})[0] == 200
    assert post(server, body, headers={**AUTH, "Origin": "https://evil.example"})[0] == 403
    assert post(server, body, headers={**AUTH, "Host": "evil.example"})[0] == 403


# -- the module's rules ----------------------------------------------------------------------------
def parse(**fields) -> infill.InfillRequest:
    return infill.parse(json.dumps({"input_prefix": "", "input_suffix": "", **fields}).encode(), 512, 8)


def test_a_request_as_the_engine_gets_it():
    r = parse(input_prefix="def f(x):\n", prompt="    return ", input_suffix="\n",
              input_extra=[{"text": "a = 1\n", "filename": "a.py", "time": [1, 2]},
                           {"text": "b\n", "filename": ""}, {"text": "c\n"}])
    assert (r.prefix, r.suffix) == ("def f(x):\n    return ", "\n")
    assert [c.path for c in r.extra] == ["a.py", "tmp", "tmp"]
    assert (r.n_predict, r.n_cmpl, r.deadline_ms, r.cache, r.stream) == (None, 1, 0, True, False)
    assert parse(n_predict=10_000).n_predict == 256 and parse(n_predict=-1).n_predict is None


@pytest.mark.parametrize("names, language", [
    (["a.py", "b/c.pyi", "README.md"], "python"), (["a.py", "b.ts"], "plaintext"), ([], "plaintext"),
    (["x.rs"], "rust")])
def test_the_language_is_the_one_the_chunks_agree_on(names, language):
    assert parse(input_extra=[{"text": "", "filename": n} for n in names]).language == language


@pytest.mark.parametrize("text, n_indent, cut", [
    ("a\n    b\nc\n", 4, 8), ("a\n    b\n\n  \n    c\nd", 4, 18), ("    a\nb", 1, 6), ("a\nb\n", 0, None),
    ("x\n\tb\n  c", 2, 2), ("x\n  \tb", 3, None), ("a", 4, None)])
def test_n_indent_cuts_at_the_first_line_indented_less(text, n_indent, cut):
    assert infill._indent_cut(text, n_indent) == cut


def test_response_fields_follow_paths():
    out = {"content": "x", "timings": {"prompt_n": 3, "inner": {"a": None}}, "truncated": False}
    assert infill._only(out, ("timings/prompt_n", "timings/inner/a", "content/x", "", "truncated")) == {
        "timings/prompt_n": 3, "timings/inner/a": None, "truncated": False}


def test_a_request_goes_to_the_document_that_holds_its_lines():
    forgotten = []
    docs = infill.Documents(forgotten.append)
    a = "\n".join(f"a{i} = {i}" for i in range(40)) + "\n"
    b = "\n".join(f"b{i} = {i}" for i in range(40)) + "\n"
    first = docs.pick(a + "x = ", "\n")
    assert docs.pick(a + "x = 12", "  # typed\n").key == first.key  # the cursor line changed, not the file
    assert docs.pick(a.split("\n", 5)[5] + "y = 1\nz", "\n").key == first.key  # the window slid
    other = docs.pick(b, "\n")
    assert other.key != first.key and docs.pick(a + "q", "\n").key == first.key
    assert docs.pick("", "\n").key == first.key  # nothing to compare: the last one used
    for i in range(infill.MAX_DOCUMENTS):
        docs.pick(f"f{i}()\n" * 3 + "g", "\n")
    assert first.key in forgotten and len(docs.docs) == infill.MAX_DOCUMENTS
