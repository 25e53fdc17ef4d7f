"""Alternatives to cycle (completer/engine/alternatives.py, issue 38 part 2): branches of the main
completion at its least sure tokens over the document's KV cache — the prompt computed once, each
branch one token of prefill and the same tokens as a plain greedy decode from scratch; the main
completion unchanged by asking for more; each judged by its own copy of the stop rule; the
pipeline's post-processing and deduplication; and the surfaces: the language server's
InlineCompletionList, /infill's n_cmpl and /v1/completions' n against a real `completer serve`,
Neovim's next/previous keys over the language server, the web editor's Alt-]/Alt-[ over serve."""
from __future__ import annotations

import json
import math

import pytest
from helpers.engines import engine, random_pair
from helpers.scripted import Scripted

from completer.client import Completion, StopReason
from completer.engine.alternatives import branch_points
from completer.engine.speculative import GenStats
from completer.pipeline import complete_at

PREFIX, SUFFIX = "def total(xs):\n    s = 0\n    for x in xs:\n        s += ", "\n    return s\n"
LN = math.log


def stats(logprobs: list[float], runner_up: list[tuple[int, float]]) -> GenStats:
    return GenStats(logprobs=logprobs, runner_up=runner_up, new_tokens=len(logprobs))


@pytest.mark.parametrize(("lps", "ups", "shown", "k", "want"), [
    # the head's log-probability ranks them: an early near-tie before a later one
    ([LN(.5), LN(.9), LN(.6)], [(7, LN(.4)), (8, LN(.05)), (9, LN(.3))], 3, 2, [(0, 7), (2, 9)]),
    ([LN(.9), LN(.9), LN(.6)], [(7, LN(.05)), (8, LN(.05)), (9, LN(.3))], 3, 2, [(2, 9), (0, 7)]),
    # only the shown tokens may branch; k bounds them
    ([LN(.5), LN(.9), LN(.6)], [(7, LN(.4)), (8, LN(.05)), (9, LN(.3))], 1, 5, [(0, 7)]),
    ([LN(.5), LN(.9)], [(7, LN(.4)), (8, LN(.05))], 2, 0, []),
    # an end of text (token 2 here) is no branch
    ([LN(.5), LN(.9), LN(.6)], [(2, LN(.4)), (8, LN(.05)), (9, LN(.3))], 3, 2, [(2, 9), (1, 8)]),
])
def test_branch_points(lps, ups, shown, k, want):
    assert branch_points(stats(lps, ups), shown, k, frozenset({2})) == want


class Seen:
    """A stop that never fires and keeps the last text it judged (a stop keeps state, as
    syntax/stop.Stop does: a branch judged by the main completion's stop would overwrite it)."""
    reason = None

    def __init__(self):
        self.last = ""

    def __call__(self, text: str) -> int | None:
        self.last = text
        return None


def test_branches_share_the_prompt_and_decode_as_greedy_from_scratch(tok):
    pair = random_pair(tok)
    one = engine(pair).complete(PREFIX, SUFFIX, doc_key="a", n=1)
    e = engine(pair)
    stop = Seen()
    c = e.complete(PREFIX, SUFFIX, doc_key="a", n=3, stop_text=stop)
    # asking for more changes nothing of the main completion, and one answer carries none
    assert (c.text, c.token_ids, c.stop_reason) == (one.text, one.token_ids, one.stop_reason)
    assert one.alternatives == [] and "alternatives" not in one.to_json()
    # the main completion's stop judged the main text only (each branch judged with its own copy)
    assert stop.last and e.decode(c.token_ids).startswith(stop.last)
    assert 1 <= len(c.alternatives) <= 2, c.alternatives
    assert c.prefill_tokens == c.prompt_tokens > 0  # a cold cache: the prompt computed once, by the main one
    prompt = e.fim_prompt(PREFIX, SUFFIX)
    texts = [c.text]
    ref = engine(pair)
    for a in c.alternatives:
        i = next(j for j, (x, y) in enumerate(zip(a.token_ids, c.token_ids, strict=False)) if x != y)
        assert a.token_ids[:i] == c.token_ids[:i]  # it leaves the main completion at one token
        assert a.prefill_tokens == 1  # the runner-up only: the head's KV was the main one's
        assert a.prompt_tokens == len(prompt) + i + 1 and a.confidence is not None
        rest = a.token_ids[i + 1:]
        if rest:  # the same tokens as a plain greedy decode of prompt + head on a cache of its own
            ids, st = ref.complete_ids(prompt + a.token_ids[:i + 1], doc_key=f"ref{i}", max_new=len(rest),
                                       drafter="none")
            assert ids == rest and st.prefill_tokens == len(prompt) + i + 1
        texts.append(a.text)
    assert len(set(texts)) == len(texts)  # distinct
    confidences = [a.confidence for a in c.alternatives]
    assert confidences == sorted(confidences, reverse=True)  # best first
    st = e.stats()
    assert st["alternatives"] == len(c.alternatives) and st["prefill_tokens"] == c.prompt_tokens


def test_no_branch_once_a_newer_request_for_the_document_came(tok):
    """The branches never supersede a newer request: a record bumped by one (or a ticket of the
    document waiting) leaves none; the same call without it branches."""
    from completer.engine.alternatives import alternatives
    from completer.engine.records import Record
    from completer.engine.sampling import Sampling

    e = engine(random_pair(tok))
    prompt = e.fim_prompt(PREFIX, SUFFIX)
    ids, st = e.complete_ids(prompt, doc_key="a")
    rec = Record(PREFIX, SUFFIX)
    branch = lambda: alternatives(e, rec, "a", prompt, ids, st, len(ids), 2, None, None, None, Sampling())
    assert branch()
    rec.epoch += 1  # what Engine._newer_request does for every request after this one
    assert branch() == []
    rec.epoch = 0
    waiting = e.sched.acquire("a")  # a newer request holds the document
    try:
        assert branch() == []
    finally:
        e.sched.release(waiting)
    assert branch()


def test_the_option_sets_the_default_and_is_bounded(tok):
    pair = random_pair(tok)
    e = engine(pair, alternatives=3)
    assert len(e.complete(PREFIX, SUFFIX, doc_key="a").alternatives) >= 1
    e.reconfigure(alternatives=1)
    assert e.complete(PREFIX, SUFFIX, doc_key="b").alternatives == []
    assert len(e.complete(PREFIX, SUFFIX, doc_key="c", n=50).alternatives) <= 4  # the option's bound: 5 in all
    with pytest.raises(Exception, match="alternatives"):
        e.reconfigure(alternatives=6)


class WithAlternatives(Scripted):
    """Scripted, with alternatives as an engine returns them (raw: before post-processing)."""

    def __init__(self, reply: str, alternatives: list[str]):
        super().__init__(reply)
        self.alts = alternatives

    def complete(self, prefix, suffix="", **kw):
        c = super().complete(prefix, suffix, **kw)
        c.alternatives = [Completion(t, confidence=0.5 - i / 100, stop_reason=StopReason.EOS)
                          for i, t in enumerate(self.alts)]
        return c


SRC = "import os\n\n\ndef area(w, h):\n    \n\n\ndef main():\n    pass\n"


def test_the_pipeline_post_processes_and_dedupes_alternatives():
    eng = WithAlternatives("return w * h\n", [
        "return w * h\n\n\ndef main():\n    pass\n",  # the same once post-processed (the suffix echoed)
        "return h * w\n",
        "   \n",  # shows nothing
        "return h * w",  # the same as the one before
        "return w",  # only the start of the main one
        "return (w *\n",  # its parse errors trimmed: the start of the main one
        "return abs(w) * abs(h)\n",
    ])
    r = complete_at(eng, SRC, (4, 4), language="python", n=3)
    assert eng.calls[0]["n"] == 3  # asked of the engine
    assert r.text == "return w * h"
    assert [a.text for a in r.alternatives] == ["return h * w", "return abs(w) * abs(h)"]  # the engine's order
    one = complete_at(Scripted("return w * h\n"), SRC, (4, 4), language="python")
    assert one.text == r.text and one.alternatives == [] and "alternatives" not in one.to_json()


# -- the surfaces, against real processes on the embedded pair ---------------------------------------
# A place in held-out-style code where the embedded pair (second build) has several distinct
# completions after post-processing (found by trying attribute and call sites through complete_at
# with n=3; a retrain may move it: any place with two distinct post-processed items will do).
PLACE = "import os\n\n\ndef read(path):\n    with open(path) as f:\n        return f.\n"
LINE, COL = 5, 17


@pytest.mark.slow
async def test_lsp_answers_several_items_to_cycle(client):
    from helpers.lsp import inline, open_doc, start

    await start(client, {"alternatives": 3, "debounce_ms": 0, "device": "cpu"})
    open_doc(client, PLACE)
    got = await client.text_document_inline_completion_async(inline(LINE, COL))
    texts = [i.insert_text for i in got.items]
    assert len(texts) >= 2 and len(set(texts)) == len(texts) and all(t.strip() for t in texts), texts
    at = {(i.range.start.line, i.range.start.character, i.range.end.line, i.range.end.character) for i in got.items}
    assert at == {(LINE, COL, LINE, COL)}


@pytest.fixture(scope="module")
def embedded_serve():
    from helpers.serve import TOKEN, start_server, stop_server

    p, addr = start_server("--token", TOKEN)
    yield addr
    stop_server(p)


def post(addr: str, path: str, body: dict) -> tuple[int, bytes]:
    import http.client

    from helpers.serve import AUTH

    host, port = addr.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", path, json.dumps(body), {**AUTH, "Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


@pytest.mark.slow
def test_infill_n_cmpl_answers_distinct_alternatives(embedded_serve):
    head, line = PLACE[:PLACE.index("        return f.")], "        return f."
    body = {"input_prefix": head, "prompt": line, "input_suffix": "\n", "n_predict": 32, "cache_prompt": False}
    status, raw = post(embedded_serve, "/infill", {**body, "n_cmpl": 3})
    assert status == 200, raw
    answers = json.loads(raw)
    assert isinstance(answers, list) and 2 <= len(answers) <= 3, answers
    assert [a["index"] for a in answers] == list(range(len(answers)))
    contents = [a["content"] for a in answers]
    assert len(set(contents)) == len(contents) and all(c.strip() for c in contents)
    for a in answers[1:]:  # a branch: the prompt's KV was the main completion's
        assert a["timings"]["prompt_n"] == 1 and a["tokens_cached"] > 0
    status, raw = post(embedded_serve, "/infill", body)
    assert status == 200 and json.loads(raw)["content"] == contents[0]


@pytest.mark.slow
def test_v1_completions_n_answers_choices(embedded_serve):
    body = {"prompt": PLACE[:-1], "suffix": "\n", "max_tokens": 8}
    status, raw = post(embedded_serve, "/v1/completions", {**body, "n": 3})
    assert status == 200, raw
    out = json.loads(raw)
    choices = out["choices"]
    assert 2 <= len(choices) <= 3 and [c["index"] for c in choices] == list(range(len(choices)))
    texts = [c["text"] for c in choices]
    assert len(set(texts)) == len(texts) and all(c["finish_reason"] in ("stop", "length") for c in choices)
    assert out["usage"]["completion_tokens"] > 8  # every choice's tokens
    status, raw = post(embedded_serve, "/v1/completions", body)
    assert status == 200 and [c["text"] for c in json.loads(raw)["choices"]] == texts[:1]
    status, raw = post(embedded_serve, "/v1/completions", {**body, "stream": True, "n": 3})
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
    streamed = {}
    for ev in events:
        for ch in ev["choices"]:
            streamed[ch["index"]] = streamed.get(ch["index"], "") + ch["text"]
    assert streamed == dict(enumerate(texts))
    status, raw = post(embedded_serve, "/v1/completions", {**body, "n": 6})
    assert status == 400 and b'"n"' in raw


@pytest.mark.slow
def test_neovim_cycles_the_items_with_its_next_and_previous_keys(tmp_path):
    """The plugin's <M-]> / <M-[> (vim.lsp.inline_completion.select) show the other items of the
    language server's list, and back; Tab takes the one shown."""
    from helpers import missing
    from helpers.nvim import NVIM, WHY, Nvim, ghost_after, lsp_cmd, wait_ready

    if NVIM is None:
        missing(WHY)
    src = tmp_path / "read.py"
    src.write_text(PLACE.removesuffix(".\n") + "\n")  # the last line without its dot: typing it asks
    nv = Nvim(tmp_path, lsp_cmd(), {"alternatives": 3, "min_confidence": 0, "next_edit": False, "debounce_ms": 0}, src)
    try:
        wait_ready(nv)
        first = ghost_after(nv, "GA.")
        items = nv.lua("T.ask()")["items"]
        texts = [i["insertText"] for i in items]
        assert len(texts) >= 2 and first[0]["lines"][0].startswith(texts[0].split("\n")[0]), (first, texts)

        def showing(i: int) -> bool:  # Neovim writes "(i/n)" after a selected item's first line
            g = [g for g in nv.lua("T.ghost()") if "".join(g["lines"]).strip()]
            return bool(g) and g[0]["lines"][0].startswith(texts[i].split("\n")[0] + f" ({i + 1}/{len(texts)})")
        nv.send("<M-]>")
        nv.wait(lambda: showing(1), 10, "the second item shown")
        nv.send("<M-[>")
        nv.wait(lambda: showing(0), 10, "the first item again")
        nv.send("<M-]>")
        nv.wait(lambda: showing(1), 10, "the second item again")
        before = nv.buffer()
        nv.send("<Tab>")
        after = nv.wait(lambda: (b := nv.buffer()) != before and b, 10, "the item taken")
        assert after == before + texts[1], (after, texts)
    finally:
        nv.close()


@pytest.mark.slow
def test_the_web_editor_cycles_the_alternatives_with_alt_brackets(chromium, static_site, embedded_serve):
    """?alternatives=3: the done frame's alternatives; Alt-] shows the next, Alt-[ the previous,
    Tab takes the one shown."""
    from urllib.parse import quote

    from helpers import wait_for
    from helpers.serve import TOKEN
    from helpers.web import page_state

    cdp = chromium
    cdp.call("Page.enable")
    ws = quote(f"ws://{embedded_serve}/ws", safe="")
    cdp.call("Page.navigate", url=f"{static_site}/index.html?ws={ws}&token={TOKEN}&next=0&alternatives=3")
    wait_for(lambda: page_state(cdp)["state"] == "ready", 60, "the page to connect", detail=lambda: page_state(cdp))
    head = PLACE.removesuffix("\n")  # the cursor after "return f.": one request, there
    cdp.js(f"(() => {{ const v = window.completerView; v.focus(); v.dispatch({{ changes: {{ from: 0, "
           f"to: v.state.doc.length, insert: {json.dumps(PLACE)} }}, selection: {{ anchor: {len(head)} }} }}); }})()")
    first = wait_for(lambda: (s := page_state(cdp))["ghost"].strip() and "page:" in s["latency"] and s, 60,
                     "the ghost text", detail=lambda: page_state(cdp))["ghost"]
    alt = "]", "BracketRight", 221
    back = "[", "BracketLeft", 219
    cdp.key(*alt, modifiers=1)  # Alt
    second = wait_for(lambda: (g := page_state(cdp)["ghost"]) != first and g, 10, "the next alternative")
    cdp.key(*back, modifiers=1)
    wait_for(lambda: page_state(cdp)["ghost"] == first, 10, "the first completion again")
    cdp.key(*alt, modifiers=1)
    wait_for(lambda: page_state(cdp)["ghost"] == second, 10, "the alternative again")
    cdp.key("Tab", "Tab", 9)
    s = wait_for(lambda: (s := page_state(cdp))["value"] != PLACE and s, 10, "the alternative taken")
    assert s["value"] == head + second + "\n", s["value"]
