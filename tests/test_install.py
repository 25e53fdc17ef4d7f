"""`pip install` off Linux: the dependency set (with the quant extra) resolves to wheels for macOS
arm64 and Windows x86-64 (a download resolution by pip against the package index it is configured
with, nothing installed), and the modes whose packages a platform may lack say which package to install, while the rest works without them.

pip's `--platform` chooses wheel tags but evaluates environment markers against the running
interpreter (so torch's Linux-only CUDA dependencies would be asked for on macOS); the resolver
runs here with the target platform's marker environment set, which is what pip on that machine
would see."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python >= 3.11's tomllib")
REPO = Path(__file__).resolve().parents[1]

PLATFORMS = {
    "macos-arm64": ("macosx_14_0_arm64", {"sys_platform": "darwin", "platform_system": "Darwin",
                                          "platform_machine": "arm64", "os_name": "posix"}),
    "windows-x86_64": ("win_amd64", {"sys_platform": "win32", "platform_system": "Windows",
                                     "platform_machine": "AMD64", "os_name": "nt"}),
}

# pip's resolver with the target's marker environment; argv: marker-env JSON, then pip's arguments.
RESOLVE = """
import json, sys
import pip._vendor.packaging.markers as markers
env = json.loads(sys.argv[1])
host = markers.default_environment
markers.default_environment = lambda: {**host(), **env}
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def index_serves(name: str, version: str) -> bool:
    """Whether the package index pip is configured with (its index-url, a mirror, extra indexes)
    answers and lists `version` of `name`: asked through pip itself, so the test works behind
    any mirror."""
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name, "--retries", "0", "--timeout", "20"],
                       capture_output=True, text=True, timeout=120, check=False)
    listed = next((ln.split(":", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("Available versions:")), "")
    return r.returncode == 0 and version in [v.strip() for v in listed.split(",")]


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory):
    """Both platforms' resolutions started at once (each waits on the index ~30 s): name ->
    (the pip process, its report's path)."""
    pin = names(project()["dependencies"])["torch"].split("==")[1]
    if not index_serves("torch", pin):
        pytest.skip(f"the configured package index does not answer with torch {pin} (pip index versions torch)")
    proj = project()
    deps = proj["dependencies"] + proj["optional-dependencies"]["quant"]  # `pip install completer[quant]`
    out = {}
    for name, (platform, env) in PLATFORMS.items():
        env = {**env, "python_version": "3.11", "python_full_version": "3.11.9",
               "implementation_name": "cpython", "platform_python_implementation": "CPython"}
        d = tmp_path_factory.mktemp(name)
        out[name] = subprocess.Popen(
            [sys.executable, "-c", RESOLVE, json.dumps(env), "install", "--dry-run", "--quiet", "--ignore-installed",
             "--report", str(d / "report.json"), "--target", str(d / "t"), "--platform", platform,
             "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", *deps],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), d / "report.json"
    yield out
    for p, _ in out.values():
        p.kill()
        p.wait()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PLATFORMS))
def test_dependencies_resolve_to_wheels(name, resolutions):
    pin = names(project()["dependencies"])["torch"].split("==")[1]
    platform = PLATFORMS[name][0]
    proc, report = resolutions[name]
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    got = {i["metadata"]["name"].lower(): i for i in json.loads(report.read_text())["install"]}
    assert got["torch"]["metadata"]["version"] == pin
    wheels = [i["download_info"]["url"].rsplit("/", 1)[-1] for i in got.values()]
    assert all(w.endswith(".whl") for w in wheels), wheels
    tag = platform.split("_")[0]  # macosx | win
    assert tag in got["torch"]["download_info"]["url"], got["torch"]["download_info"]["url"]
    assert "triton" not in got and "bitsandbytes" in got


def names(reqs: list[str]) -> dict[str, str]:
    return {re.split(r"[\s;=<>!~\[]", r, maxsplit=1)[0].lower(): r for r in reqs}


def test_optional_packages_are_extras_or_marked():
    """A CPU install stays lean: triton (~1 GB, CUDA kernels, no macOS/Windows wheels) is the gpu
    extra, bitsandbytes/accelerate (--quant int8/nf4) the quant extra that gpu includes; dev
    brings gpu because the kernel tests run Triton on the CPU."""
    proj, extras = project(), project()["optional-dependencies"]
    deps = names(proj["dependencies"])
    assert not {"triton", "bitsandbytes", "accelerate"} & deps.keys(), deps
    assert set(names(extras["quant"])) == {"bitsandbytes", "accelerate"}
    gpu = names(extras["gpu"])
    assert "sys_platform == 'linux'" in gpu["triton"] and "completer[quant]" in extras["gpu"]
    assert "completer[gpu]" in extras["dev"]


# Run the code as if a package were not installed: its import fails as it would there.
WITHOUT = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {missing!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
"""


def run_without(missing: set[str], code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT.format(missing=missing) + code], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_quantized_matmuls_work_without_triton():
    """A CPU install has no triton: where a kernel would run (here: TRITON_INTERPRET=1), the
    reference computes it and one warning names the extra to install."""
    r = run_without({"triton"}, """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from completer_kernels import quant as kq
torch.manual_seed(0)
x, w = torch.randn(3, 64), torch.randn(16, 64)
q, s = kq.quantize_int8(w)
y = kq.int8_matmul(x, q, s)
assert torch.allclose(y, kq.int8_matmul_ref(x, q, s))
assert (y - x @ w.T).abs().max() < 0.05 * (x @ w.T).abs().max()
p, sc, z = kq.quantize_int4(w, 32)
assert torch.allclose(kq.int4_matmul(x, p, sc, z, 32), kq.int4_matmul_ref(x, p, sc, z, 32))
print("ok")
""")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert r.stderr.count("triton is not installed") == 1 and "pip install -e '.[gpu]'" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["int8", "nf4"])
def test_bitsandbytes_modes_name_the_package_to_install(quant, tmp_path):
    from conftest import random_llama

    random_llama(32, 1, seed=0).float().save_pretrained(tmp_path / "m")
    r = run_without({"bitsandbytes"}, f"""
import torch
from completer.engine.models import ModelError, load_model
try:
    load_model({str(tmp_path / 'm')!r}, torch.device('cpu'), torch.float32, {quant!r})
except ModelError as e:
    print(e)
else:
    print("loaded")
""")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "bitsandbytes" in r.stdout and "pip install" in r.stdout, r.stdout


@pytest.mark.slow
def test_remote_tests_skip_cleanly_without_llama_server(tmp_path):
    """The README's test command on a machine that never ran .ci/llamacpp.sh (its cache hidden,
    CI unset): every test that needs llama-server skips before a fixture starts a process, naming
    what to run, and nothing errors (a teardown once waited 300 s per test on a language server
    that was never initialised). Under CI=1 the same tests fail instead (llama_paths)."""
    files = sorted(f"tests/{p.name}" for p in (REPO / "tests").glob("test_*.py")
                   if p.name != "test_install.py" and "LlamaServer" in p.read_text())
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"COMPLETER_CACHE": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-o", "timeout=60",
                        *files], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:]
    summary = r.stdout.strip().splitlines()[-1]
    assert "skipped" in summary and "error" not in summary and "failed" not in summary, summary
    skips = [ln for ln in r.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert skips and all(".ci/llamacpp.sh" in ln for ln in skips), skips


def test_the_readme_and_the_tests_reach_no_registry_by_url():
    """Every URL the README or a test names is loopback, a documentation address (RFC 2606's
    .example, RFC 5737's 203.0.113.0/24) or a placeholder: a package index or a download host is
    what pip is configured with, never written here."""
    host = re.compile(r"(?:https?|wss?)://([^\s/`'\")]+)")
    texts = [REPO / "README.md", *sorted((REPO / "tests").glob("*.py"))]
    named = {(p.name, m.group(1)) for p in texts for m in host.finditer(p.read_text(encoding="utf-8"))}
    loopback = re.compile(r"(127\.0\.0\.1|localhost|\[::1\])(:[\w{}\[\]().,]*)?$")
    placeholder = lambda h: h.startswith(("203.0.113.", "HOST:")) or not re.match(r"[\w.]", h) or "{" in h
    other = [(f, h) for f, h in named
             if not (loopback.match(h) or h.split(":")[0].endswith(".example") or placeholder(h) or h == "…")]
    assert not other, other
