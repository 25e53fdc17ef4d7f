"""docs/img/make.py without editors or a model: its scenes are in the examples, its captions go
under its pictures in the docs (and only there), and every picture it takes is in docs/img and
shown with a caption that names the command and the model. What the pair answers is the script's
own check (EXPECT), never a test's."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("img_make", ROOT / "docs" / "img" / "make.py")
make = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make)


def test_the_scenes_are_in_the_examples():
    text, dot = make.completion_scene()
    src = (ROOT / "examples" / "top_words.py").read_text()
    assert text[:dot] + "." + make.EXPECT + text[dot:] == src  # only the `.` and the expected completion taken out
    at, line = make.rename_at()
    wordcount = (ROOT / "examples" / "wordcount.py").read_text()
    assert wordcount[at:].startswith(make.RENAME[0] + "(") and wordcount.splitlines()[line - 1].startswith("def ")
    assert f"import {make.RENAME[0]}" in src  # the chain goes on into top_words.py


def test_a_caption_is_replaced_or_added_and_nothing_else_moves():
    page = ("# P\n\n![a](img/a.png)\n\n*old caption,\nover two lines*\n\ntext\n\n![b](docs/img/b.png)\n"
            "\n![c](img/c.png)\n\n*c's own*\n")
    caps = {"a.png": "A with `**kwargs`", "b.png": "B " + "word " * 30}
    once = make.set_captions(page, caps)
    assert once == make.set_captions(once, caps)  # a rerun changes nothing
    assert "*old caption" not in once and "*A with `\\*\\*kwargs`*" in once
    assert "\n![b](docs/img/b.png)\n\n*B word" in once and all(len(li) <= 100 for li in once.splitlines())
    assert once.endswith("\n![c](img/c.png)\n\n*c's own*\n") and "\ntext\n" in once


def test_every_picture_is_shown_with_its_caption():
    caps = make.captions(make.EXPECT, "the shipped pair (a build)")
    pages = {p.name: p.read_text() for p in make.CAPTIONED}
    for png, cap in caps.items():
        assert (make.OUT / png).is_file(), png
        where = [name for name, text in pages.items() if f"img/{png})" in text]
        assert where, f"{png} is shown nowhere in {list(pages)}"
        assert "`python docs/img/make.py`" in cap and "Model: " in cap, cap
        for page in where:  # under each, its caption as make.py writes it
            under = re.findall(rf"img/{re.escape(png)}\)\n\n(\*(?:[^*\\]|\\.)*\*)\n", pages[page])
            assert len(under) == pages[page].count(f"img/{png})"), (page, png)
            assert all("`python docs/img/make.py`" in c and "Model: " in c for c in under), (page, under)
