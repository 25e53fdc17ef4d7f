"""The same edit again (completer/edits/repeat.py, issue 39 §2): the user makes one token-level
change at two places of a file, and the other places where it applies get it, through the
follower (completer/edits/follow.py) as the other kinds are: the region's edits and a jump to the
next place, one at a time as an editor takes them (each applied place is one more edit in the
history). Tables of files before → after per language; then edits that need nothing (two
different changes, no third place, nothing to pin the change, a rename) get nothing."""
from __future__ import annotations

import pytest

from completer.edits.diff import apply_edits
from completer.edits.follow import Follower
from completer.edits.formats import HistoryItem
from completer.edits.predict import predict


def _two_edits(before: str, edits: list[tuple[str, str]]) -> tuple[str, list[HistoryItem], int, int]:
    """`before` with each (old, new) made on the first line holding old, in order, as the
    editor's history records them (one item a line); the cursor after the last."""
    text, history = before, []
    for old, new in edits:
        i = text.index(old)
        s, e = text.rfind("\n", 0, i) + 1, text.index("\n", i) + 1
        line_old = text[s:e]
        line_new = line_old.replace(old, new, 1)
        text = text[:s] + line_new + text[e:]
        history.append(HistoryItem("m", line_old, line_new))
        line, col = text.count("\n", 0, s), line_new.index(new) + len(new)
    return text, history, line, col


def _follow(path: str, before: str, edits: list[tuple[str, str]], language: str, below: int = 2) -> tuple[str, int]:
    """Every place offered, taken one answer at a time (the region's edits, then the jump's), each
    applied place added to the history as the editor records it; the file at the end and how
    many answers came."""
    text, history, line, col = _two_edits(before, edits)
    history = [HistoryItem(path, h.old, h.new) for h in history]
    follower = Follower()
    for answers in range(50):
        got = follower.answer(text, path, line, col, history, language=language, read={path: text}.get, below=below)
        if got is None:
            return text, answers
        assert got.source == "repeat"
        p = next(q for q in got.all if q.edits)  # the region's first, else the jump's place
        old_lines = "".join(text.splitlines(keepends=True)[p.line:p.end_line + 1])
        text = apply_edits(text, list(p.edits))
        history.append(HistoryItem(path, old_lines, "".join(text.splitlines(keepends=True)[p.line:p.end_line + 1])))
        line, col = p.line, p.edits[-1].start_col + len(p.edits[-1].text)
    raise AssertionError("the chain never ended")


PY = """\
def main(client, a, b, x, y):
    client.get(a, b)
    log = 1
    client.get(x, y)
    client.get(g(1), 2)
    client.post(a, b)
    client.get()
    client.get(
        a,
        b,
    )
    client.get(x, timeout=3)
    print("client.get(a, b)")
    other.get(a, b)
"""

CASES = [
    # an argument added at two calls: every other call of client.get (an empty one without the
    # comma, a trailing comma kept last), not another callee, not one passing it already, not strings
    ("m.py", "python", PY, [("client.get(a, b)", "client.get(a, b, timeout=t)"),
                            ("client.get(x, y)", "client.get(x, y, timeout=t)")],
     PY.replace("client.get(a, b)\n    log", "client.get(a, b, timeout=t)\n    log")
       .replace("client.get(x, y)", "client.get(x, y, timeout=t)")
       .replace("client.get(g(1), 2)", "client.get(g(1), 2, timeout=t)")
       .replace("client.get()", "client.get(timeout=t)")
       .replace("        b,\n    )", "        b, timeout=t,\n    )")),
    # a keyword's value changed, at the end of the call or not
    ("m.py", "python", ("run(a, retries=3)\nrun(b, retries=3)\nrun(c, retries=3, x=1)\nrun(d, retries=30)\n"
                        "run(e, timeout=3)\n"),
     [("run(a, retries=3)", "run(a, retries=5)"), ("run(b, retries=3)", "run(b, retries=5)")],
     "run(a, retries=5)\nrun(b, retries=5)\nrun(c, retries=5, x=1)\nrun(d, retries=30)\nrun(e, timeout=3)\n"),
    # an argument removed
    ("m.py", "python", 'print(a, end="")\nprint(b, end="")\nprint(c, end="", file=f)\nprint(d)\n',
     [('print(a, end="")', "print(a)"), ('print(b, end="")', "print(b)")],
     "print(a)\nprint(b)\nprint(c, file=f)\nprint(d)\n"),
    # a wrapper added around the same argument of a call
    ("m.py", "python", "emit(name, 1)\nemit(name, 2)\nemit(name, 3)\nemit(other, 4)\n",
     [("emit(name, 1)", "emit(str(name), 1)"), ("emit(name, 2)", "emit(str(name), 2)")],
     "emit(str(name), 1)\nemit(str(name), 2)\nemit(str(name), 3)\nemit(other, 4)\n"),
    # the two edited calls were alike (`Timeout(timeout)` twice): the end of the arguments holds it
    ("m.py", "python", "a = Timeout(timeout)\nb = Timeout(timeout)\nc = Timeout(self.timeout)\nd = Timeout(5.0)\n",
     [("Timeout(timeout)", "Timeout(timeout, strict=True)"), ("b = Timeout(timeout)", "b = Timeout(timeout, strict=True)")],
     ("a = Timeout(timeout, strict=True)\nb = Timeout(timeout, strict=True)\nc = Timeout(self.timeout, strict=True)\n"
     "d = Timeout(5.0, strict=True)\n")),
    # a keyword taken out wherever it stands: last, in the middle, first, alone
    ("m.py", "python", ("Style(color=1, dim=True)\nStyle(bold=2, dim=True)\nStyle(dim=True, color=3)\n"
                        "Style(dim=True)\nStyle(a, dim=True, b=1)\nStyle(dim=False)\n"),
     [("Style(color=1, dim=True)", "Style(color=1)"), ("Style(bold=2, dim=True)", "Style(bold=2)")],
     "Style(color=1)\nStyle(bold=2)\nStyle(color=3)\nStyle()\nStyle(a, b=1)\nStyle(dim=False)\n"),
    # taken out before another keyword (the diff reads `x=1, ` after `a, `), and alone at one call
    ("m.py", "python", ('S(a, "h", theme="d", wrap=True)\nS(b, "h", theme="d", wrap=True)\nS(c, theme="d")\n'
                        'S(theme="d")\nS(d, theme="e")\n'),
     [('S(a, "h", theme="d", wrap=True)', 'S(a, "h", wrap=True)'), ('S(b, "h", theme="d", wrap=True)', 'S(b, "h", wrap=True)')],
     'S(a, "h", wrap=True)\nS(b, "h", wrap=True)\nS(c)\nS()\nS(d, theme="e")\n'),
    ("m.py", "python", "Style(dim=True)\nStyle(color=1, dim=True)\nStyle(bold=1, dim=True, x=2)\n",
     [("Style(dim=True)", "Style()"), ("Style(color=1, dim=True)", "Style(color=1)")],
     "Style()\nStyle(color=1)\nStyle(bold=1, x=2)\n"),
    # after the last argument of a call over several lines, not on the closing bracket's line
    ("m.py", "python", "f(a, b)\nf(c, d)\nf(\n    e,\n    g\n)\n", [("f(a, b)", "f(a, b, k=1)"), ("f(c, d)", "f(c, d, k=1)")],
     "f(a, b, k=1)\nf(c, d, k=1)\nf(\n    e,\n    g, k=1\n)\n"),
    # a call over several lines: after its last argument, not in the comment after it; taken out
    # of a call over several lines, in the middle or first
    ("m.py", "python", "concat(a)\nconcat(b)\nrv = concat(\n    [x for x in y]  # type: ignore\n)\n",
     [("concat(a)", "concat(a, k=1)"), ("concat(b)", "concat(b, k=1)")],
     "concat(a, k=1)\nconcat(b, k=1)\nrv = concat(\n    [x for x in y], k=1  # type: ignore\n)\n"),
    ("m.py", "python", "echo(m, file=f)\necho(n, file=f, color=c)\necho(\n    o,\n    file=f,\n    color=c,\n)\n",
     [("echo(m, file=f)", "echo(m)"), ("echo(n, file=f, color=c)", "echo(n, color=c)")],
     "echo(m)\necho(n, color=c)\necho(\n    o,\n    color=c,\n)\n"),
    ("m.py", "python", "u(obj=obj, name=a)\nu(obj=obj, name=b)\nu(\n    obj=obj,\n    name=c,\n)\n",
     [("u(obj=obj, name=a)", "u(name=a)"), ("u(obj=obj, name=b)", "u(name=b)")],
     "u(name=a)\nu(name=b)\nu(\n    name=c,\n)\n"),
    # the only argument taken out at both: last in a call over several lines, its comma too
    ("m.py", "python", "x = init(col=col)\ny = init(col=col)\ninit(\n    a,\n    col=col,\n)\n",
     [("x = init(col=col)", "x = init()"), ("y = init(col=col)", "y = init()")],
     "x = init()\ny = init()\ninit(\n    a,\n)\n"),
    # an argument put first: an empty call gets it without a comma
    ("m.py", "python", "send(a, b)\nsend(c)\nsend()\n", [("send(a, b)", "send(ctx, a, b)"), ("send(c)", "send(ctx, c)")],
     "send(ctx, a, b)\nsend(ctx, c)\nsend(ctx)\n"),
    ("m.js", "javascript", "log.info(a, b);\nlog.info(c);\nlog.info(d, e);\nlog.warn(f);\n",
     [("log.info(a, b)", "log.info(a, b, ctx)"), ("log.info(c)", "log.info(c, ctx)")],
     "log.info(a, b, ctx);\nlog.info(c, ctx);\nlog.info(d, e, ctx);\nlog.warn(f);\n"),
    ("m.ts", "typescript", "const a = fetchJson(u1);\nconst b = fetchJson(u2);\nconst c = fetchJson(u3);\n",
     [("fetchJson(u1)", "fetchJson(u1, { retry: 2 })"), ("fetchJson(u2)", "fetchJson(u2, { retry: 2 })")],
     ("const a = fetchJson(u1, { retry: 2 });\nconst b = fetchJson(u2, { retry: 2 });\n"
      "const c = fetchJson(u3, { retry: 2 });\n")),
    ("m.go", "go", "package m\n\nfunc f() {\n\tsend(ctx, a)\n\tsend(ctx, b)\n\tsend(ctx, c)\n}\n",
     [("send(ctx, a)", "send(ctx, a, opts)"), ("send(ctx, b)", "send(ctx, b, opts)")],
     "package m\n\nfunc f() {\n\tsend(ctx, a, opts)\n\tsend(ctx, b, opts)\n\tsend(ctx, c, opts)\n}\n"),
    ("m.rs", "rust", "fn f() {\n    g(a);\n    g(b);\n    h(c);\n    g(d);\n}\n",
     [("g(a)", "g(a, &ctx)"), ("g(b)", "g(b, &ctx)")],
     "fn f() {\n    g(a, &ctx);\n    g(b, &ctx);\n    h(c);\n    g(d, &ctx);\n}\n"),
]


@pytest.mark.parametrize("path,language,before,edits,after", CASES, ids=[c[0] + ":" + c[3][0][1] for c in CASES])
def test_the_same_edit_again_at_each_place_it_applies(path, language, before, edits, after):
    got, answers = _follow(path, before, edits, language)
    assert got == after
    assert answers >= 1


def test_all_places_at_once_and_the_jump_past_the_region():
    # the region (below=2) holds the next call; the jump names the one past it
    before = "".join(f"client.get(a{i})\n" if i % 10 == 0 else f"x{i} = {i}\n" for i in range(60))
    text, history, line, col = _two_edits(before, [("client.get(a0)", "client.get(a0, t=1)"),
                                                   ("client.get(a10)", "client.get(a10, t=1)")])
    history = [HistoryItem("m.py", h.old, h.new) for h in history]
    got = Follower().answer(text, "m.py", line, col, history, language="python", read={"m.py": text}.get, below=2)
    assert got is not None and got.source == "repeat" and got.edits == []
    assert got.jump is not None and got.jump.line == 20 and got.left == 4
    assert apply_edits(text, [e for p in got.all for e in p.edits]) == before.replace(")\n", ", t=1)\n")
    # predict (the CLI's and completer serve's path) names the same jump
    ne = predict(None, text, line, col, history, path="m.py", language="python", below=2)
    assert (ne.source, ne.jump.line, ne.edits) == ("repeat", 20, [])


@pytest.mark.parametrize("before,edits", [
    # two different changes
    ("f(a)\nf(b)\nf(c)\n", [("f(a)", "f(a, x=1)"), ("f(b)", "f(b, y=1)")]),
    # the same change at two calls of different functions
    ("f(a)\ng(b)\nf(c)\ng(d)\n", [("f(a)", "f(a, x=1)"), ("g(b)", "g(b, x=1)")]),
    # no third place
    ("f(a)\nf(b)\ng(c)\n", [("f(a)", "f(a, x=1)"), ("f(b)", "f(b, x=1)")]),
    # nothing to pin it: a comma before every closing bracket of a tuple
    ("p = (a, b)\nq = (c, d)\nr = (e, f)\n", [("(a, b)", "(a, b,)"), ("(c, d)", "(c, d,)")]),
    # a rename at two places is rename.py's (scoped), not a repeated edit
    ("def f(count):\n    g(count)\n    h(count)\n    k(count)\n", [("g(count)", "g(n)"), ("h(count)", "h(n)")]),
    # one edit only (and the same line edited twice: one place)
    ("f(a)\nf(b)\nf(c)\n", [("f(a)", "f(a, x=1)")]),
    ("f(a)\nf(b)\nf(c)\n", [("f(a)", "f(a, x)"), ("f(a, x)", "f(a, x, y)")]),
    # the places it would reach do not parse with it
    ("f(a)\nf(b)\nf(*c)\n", [("f(a)", "f(a, *)"), ("f(b)", "f(b, *)")]),
])
def test_no_clear_match_gets_nothing(before, edits):
    text, history, line, col = _two_edits(before, edits)
    history = [HistoryItem("m.py", h.old, h.new) for h in history]
    assert Follower().answer(text, "m.py", line, col, history, language="python", read={"m.py": text}.get) is None
