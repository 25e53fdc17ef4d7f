"""Held-out code for benchmarks: stdlib packages the models never trained on
(draft_models.data.HELD_OUT) plus real third-party code fetched with `pip download --no-deps`
at benchmark time (never committed): wheels (`third_party_files`) and the source trees of
multi-file packages with many cross-module calls (`PACKAGES`, `fetch`). Prompts are FIM holes at
real positions. The benchmarks share it as a module: a script's own directory is on its path."""
from __future__ import annotations

import random
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from draft_models.data import corpus_files, read_source

CACHE = Path(__file__).resolve().parent / "out" / "thirdparty"
# sdists of real packages for repository-level measurements (context, holes, gate, next edits)
PACKAGES = ("httpx==0.27.2", "rich==13.9.4", "click==8.1.7", "jinja2==3.1.4")
SKIP_PARTS = {"tests", "test", "docs", "doc", "examples", "scripts", "benchmarks"}  # not the package's code


def fetch(specs: list[str], sdists: Path | None, into: Path) -> list[Path]:
    """Each package's unpacked source tree (from `sdists` when it holds the tarball)."""
    roots = []
    for spec in specs:
        name, ver = spec.split("==")
        found = [p for d in ([sdists] if sdists else []) for p in d.glob("*.tar.gz")
                 if p.name.lower().replace("_", "-").startswith(f"{name.lower()}-{ver}")]
        if not found:
            dl = into / "sdists"
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec,
                            "-d", str(dl), "-q"], check=True)
            found = [p for p in dl.glob("*.tar.gz") if p.name.lower().startswith(name.lower())]
        with tarfile.open(found[0]) as tf:
            top = tf.getnames()[0].split("/")[0]
            tf.extractall(into, filter="data")
        roots.append(into / top)
    return roots


def third_party_files(package: str) -> list[Path]:
    """Python files of a pure-Python wheel from PyPI, cached under bench/out/ (not in git)."""
    dest = CACHE / package
    if not dest.exists():
        wheels = CACHE / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "-d", str(wheels), package], capture_output=True, text=True, check=False)
        whl = sorted(wheels.glob(f"{package.replace('-', '_')}*.whl"))
        if r.returncode != 0 or not whl:
            print(f"[heldout] could not fetch {package}: {r.stderr.strip()[:200]}", file=sys.stderr)
            return []
        with zipfile.ZipFile(whl[-1]) as z:
            z.extractall(dest)
    return sorted(p for p in dest.rglob("*.py") if p.stat().st_size > 500)


@dataclass(frozen=True)
class Hole:
    file: str
    prefix: str
    suffix: str
    middle: str  # the real code that was cut out


def fim_holes(n: int, seed: int = 0, third_party: tuple[str, ...] = ("more-itertools",),
              kind: str = "line") -> list[Hole]:
    """`n` holes: kind "line" = rest of a line cut mid-line; "block" = a whole indented block
    after a line ending in ':'; "start" = cursor at the start of a line's code."""
    files = corpus_files(split="heldout")
    for pkg in third_party:
        files += third_party_files(pkg)
    rng = random.Random(seed)
    texts = [(str(f), read_source(f)) for f in files]
    out: list[Hole] = []
    tries = 0
    while len(out) < n and tries < 100 * n:
        tries += 1
        name, t = rng.choice(texts)
        lines = t.split("\n")
        i = rng.randrange(len(lines))
        ln = lines[i]
        code = ln.strip()
        if len(code) < 12 or code.startswith(("#", '"""', "'''", "@")):
            continue
        start = sum(len(x) + 1 for x in lines[:i])
        indent = len(ln) - len(code)
        if kind == "line":
            cut = rng.randint(indent + 2, len(ln) - 3)
            a, b = start + cut, start + len(ln)
        elif kind == "start":
            a, b = start + indent, start + len(ln)
        else:  # block: the body under a header line
            if not code.endswith(":") or i + 1 >= len(lines):
                continue
            body_indent = len(lines[i + 1]) - len(lines[i + 1].lstrip())
            if body_indent <= indent:
                continue
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
                j += 1
            while j > i + 1 and not lines[j - 1].strip():
                j -= 1
            a = start + len(ln) + 1 + body_indent
            b = sum(len(x) + 1 for x in lines[:j]) - 1
            if b - a > 600 or b <= a:
                continue
        out.append(Hole(name, t[:a], t[b:], t[a:b]))
    return out
