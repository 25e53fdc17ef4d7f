"""The documentation: docs/configuration.md's options table is in step with the option schema
(docs/gen_config.py), the README is a front door that holds the two set-up commands, and every
relative link in the README, the CHANGELOG and docs/ reaches a file and, with a #fragment, a
heading in it."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
MAIN_JOB = ("python3 -m venv .venv && .venv/bin/pip install -e . && "
            ".venv/bin/completer complete examples/stack.py --line 7 --col 19")
# Linked from the README and docs/ while another change writes it (issue 40); checked like any
# other page once it exists.
BEING_WRITTEN: set[str] = set()


def gen_config():
    spec = importlib.util.spec_from_file_location("gen_config", ROOT / "docs" / "gen_config.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_options_table_is_in_step_with_the_schema():
    """Every option of `completer options --json-schema`, its default, bounds, project rule and
    help, as docs/gen_config.py writes them (run it after changing an option)."""
    g = gen_config()
    page = g.PAGE.read_text(encoding="utf-8")
    assert g.render(page, g.schema()) == page, \
        "docs/configuration.md is out of step: run python docs/gen_config.py"
    for name in g.schema()["properties"]:
        assert f"| `{name}`" in page, name


def test_the_readme_is_a_front_door_with_both_set_up_commands():
    """At most 200 lines; the main job's command and, byte for byte, the test command .ci/run runs."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200, len(readme.splitlines())
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    tests = next(ln for ln in ci if ln.startswith("python3 -m venv"))
    assert tests in readme.splitlines(), tests
    assert MAIN_JOB in readme.splitlines()


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation but - and _ dropped,
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            s, n = slug(m.group(1)), 1
            while s in out:  # a repeated heading gets -1, -2, ...
                s, n = f"{slug(m.group(1))}-{n}", n + 1
            out.add(s)
    return out


def test_every_relative_link_reaches_a_file_and_a_heading():
    checked, broken = 0, []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                if dest.relative_to(ROOT).as_posix() not in BEING_WRITTEN:
                    broken.append(f"{page.name}: {target}")
                continue
            if frag and dest.suffix == ".md" and frag not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
            checked += 1
    assert not broken, broken
    assert checked > 50
