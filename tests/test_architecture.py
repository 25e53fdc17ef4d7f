"""Imports point one way (editor-plugin → lsp → completer → kernels, draft_models), with no
circles between modules: read from the source (every import, also those inside functions)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder → the name it is imported as (pyproject's package-dir: kernels/ is completer_kernels)
PACKAGES = {"lsp": "lsp", "completer": "completer", "kernels": "completer_kernels", "draft_models": "draft_models"}
# what each package may import from the others (besides itself)
ALLOWED = {"lsp": {"completer"}, "completer": {"completer_kernels", "draft_models"}, "completer_kernels": set(),
           "draft_models": set()}


def modules() -> dict[str, Path]:
    out = {}
    for folder, name in PACKAGES.items():
        for f in (ROOT / folder).rglob("*.py"):
            parts = [name, *f.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def test_pyproject_lists_every_package_under_its_import_name():
    """pyproject lists the packages (a mapped name is not found by packages.find): every folder
    with an __init__.py, none twice, none missing."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python >= 3.11's tomllib")
    st = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join([PACKAGES[f.relative_to(ROOT).parts[0]], *f.relative_to(ROOT).parent.parts[1:]])
             for folder in PACKAGES for f in (ROOT / folder).rglob("__init__.py")}
    assert sorted(st["packages"]) == sorted(found)
    assert st["package-dir"] == {"completer_kernels": "kernels"}


@pytest.mark.slow
def test_bitsandbytes_finds_no_kernels_of_ours(tmp_path):
    """bitsandbytes imports Hugging Face's `kernels` (CPUs with AVX512-BF16): outside the
    checkout, that name is nobody's here (ours is completer_kernels), so it is not our folder
    that it reads and warns about. Run from a folder outside the checkout, as an installed
    completer is (the checkout's folder would be on sys.path otherwise)."""
    import subprocess
    import sys

    code = ("import importlib.util, completer_kernels.quant; s = importlib.util.find_spec('kernels'); "
            "print(s.origin if s else None); import bitsandbytes")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr
    origin = r.stdout.strip().splitlines()[0]
    assert origin == "None" or not origin.startswith(str(ROOT)), origin
    assert str(ROOT / "kernels") not in r.stderr and "cannot import name 'get_kernel'" not in r.stderr


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (relative imports resolved; `from p import m` → p.m when m is a module)."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def test_packages_import_one_way():
    wrong = [(m, d) for m, deps in graph().items() for d in deps
             if d.split(".")[0] != m.split(".")[0] and d.split(".")[0] not in ALLOWED[m.split(".")[0]]]
    assert not wrong, f"imports against the direction editor-plugin → lsp → completer → kernels, draft_models: {wrong}"


def test_no_import_circles():
    g = graph()
    # a package's __init__ importing its own submodules is how a package exports: not a circle
    edges = {m: {d for d in deps if not (m and d.startswith(m + "."))} for m, deps in g.items()}
    seen: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for d in sorted(edges[m]):
            if seen.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in seen:
                visit(d)
        stack.pop()
        seen[m] = 2

    for m in sorted(edges):
        if m not in seen:
            visit(m)
    assert not cycles, f"import circles: {cycles}"


@pytest.mark.slow
def test_test_files_import_no_other_test_file():
    """What tests share lives in tests/helpers/ (imported as a library) and tests/conftest.py (the
    fixtures); a test file imported by another runs its module code in both and hides what the
    other depends on."""
    allowed = {"test_families"}  # family_model and FAMILY_CASES: moved to helpers when that file's
    # sliding-window work (issue 37, defect 2) is done with it
    found = []
    for f in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [(f.name, n) for n in names if n.startswith("test_") and n.split(".")[0] not in allowed]
    assert not found, found


def test_language_server_needs_no_torch():
    """lsp/ and the modules it reaches at import time stay free of torch (a remote engine's
    language server starts in a fraction of a second)."""
    import subprocess
    import sys

    code = "import sys, lsp.server, completer.remote; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
