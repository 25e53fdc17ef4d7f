"""Shared fixtures: model pairs built by the project's own recipe (the tiny pair, seconds; the
parrots taught from it), the real processes the end-to-end tests talk to (`completer-lsp`,
llama-server, Chromium, a fake HTTP engine), and random tiny Llama pairs for exactness tests.
What the fixtures stand on is tests/helpers/, imported as a library. Tests run torch on one
thread to stay light.

The fast lane is `pytest -m "not slow"` (docs/development.md): a test that starts a process
fixture below is marked `slow`, and collection fails when one is not."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Triton decides at @jit time whether to interpret: CPU-only tests need it set before any import.
os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests' own user config (every process they start reads it): the embedded pair's confidence
# gate off, so that tests of transports, protocols and editors get the model's text; the gate is
# tested where it is the subject (test_confidence.py, the embedded pair's defaults in test_cli.py),
# and a test that needs another user config points XDG_CONFIG_HOME elsewhere itself.
_USER = Path(tempfile.mkdtemp(prefix="completer-tests-xdg-"))
(_USER / "completer").mkdir()
(_USER / "completer" / "config.toml").write_text("min_confidence = 0.0\n")
os.environ["XDG_CONFIG_HOME"] = str(_USER)

# after the environment above: helpers.lsp gives the language servers it starts this XDG_CONFIG_HOME
import pytest
import pytest_lsp
from helpers import missing
from helpers.fake_http import Fake
from helpers.lsp import SERVER
from lsprotocol import types as t
from pytest_lsp import LanguageClient


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): the `tiny` preset of draft_models.build, trained for a few steps."""
    import torch

    torch.set_num_threads(1)
    from draft_models.build import build

    root = tmp_path_factory.mktemp("tiny_pair")
    build("tiny", root / "out", root / "run", seed=0)
    return root / "out" / "target", root / "out" / "draft"


@pytest.fixture(scope="session")
def tok(tiny_pair):
    """The tiny pair's tokenizer (random pairs use its vocabulary)."""
    from completer.engine.models import load_tokenizer

    return load_tokenizer(str(tiny_pair[0]))


@pytest.fixture(scope="session")
def parrot_pair(tiny_pair, tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): the tiny pair, its target taught to complete with `1` (helpers/parrot.py)."""
    import torch
    from helpers.parrot import make_parrot_pair

    torch.set_num_threads(1)
    return make_parrot_pair(*tiny_pair, tmp_path_factory.mktemp("parrot_pair"))


@pytest.fixture(scope="session")
def edit_parrot_pair(tiny_pair, tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): the tiny pair, its target taught the EDIT_* next edit and empty FIM answers."""
    import torch
    from helpers.parrot import make_edit_parrot_pair

    torch.set_num_threads(1)
    return make_edit_parrot_pair(*tiny_pair, tmp_path_factory.mktemp("edit_parrot_pair"))


# -- processes ---------------------------------------------------------------------------------------
# A test that asks for one of these is `slow` (the fast lane, `pytest -m "not slow"`, leaves it out);
# collection stops on one that is not marked so.
PROCESS_FIXTURES = {"client", "served", "llama", "llama_bin", "chromium", "static_site"}


def pytest_collection_modifyitems(config, items):
    unmarked = [i.nodeid for i in items if PROCESS_FIXTURES & set(getattr(i, "fixturenames", ()))
                and i.get_closest_marker("slow") is None]
    if unmarked:
        raise pytest.UsageError("these tests start a process and are not marked slow (@pytest.mark.slow, or "
                                "pytestmark = pytest.mark.slow in their module):\n  " + "\n  ".join(unmarked))


@pytest_lsp.fixture(config=SERVER)
async def client(lsp_client: LanguageClient):
    """The real `completer-lsp` over stdio, one per test (each test initialises its own session:
    an LSP server takes one `initialize`). `registrations`: what the server asked the client to
    register (file watchers)."""
    lsp_client.registrations = []

    @lsp_client.feature(t.CLIENT_REGISTER_CAPABILITY)
    def register(params: t.RegistrationParams):
        lsp_client.registrations.extend(params.registrations)

    yield
    if lsp_client.capabilities is None:  # never initialised: `exit` alone ends the server (pytest-lsp's
        lsp_client.exit(None)            # teardown waits for the process, and shutdown_session sends nothing)
    else:
        await lsp_client.shutdown_session()


@pytest.fixture(scope="session")
def served(tiny_pair):
    """One `completer serve` on the tiny pair for the session's WebSocket and HTTP tests
    (test_serve.py, test_serve_ws.py): a token, small frames, 4 requests in flight, 24 new tokens
    → (process, host:port)."""
    from helpers.serve import TOKEN, start_server, stop_server

    target, draft = tiny_pair
    p, addr = start_server("--token", TOKEN, "--max-frame-bytes", "4096", "--max-inflight", "4",
                           "--target", str(target), "--draft", str(draft), "--max-new-tokens", "24")
    yield p, addr
    stop_server(p)


@pytest.fixture(scope="session")
def llama_bin() -> tuple[Path, Path]:
    """(llama-server, target .gguf), or a skip (a failure under CI) naming .ci/llamacpp.sh. Session
    fixtures are set up before a test's function fixtures, so a test that asks for it skips before
    any of them starts a process."""
    from helpers.llama import llama_paths

    return llama_paths()


@pytest.fixture(scope="session")
def llama(llama_bin):
    """One llama-server for the session (tests that kill or restart one start their own)."""
    from helpers.llama import LlamaServer

    s = LlamaServer(*llama_bin).start()
    yield s
    s.kill()


@pytest.fixture
def fake():
    """A fake HTTP engine (helpers/fake_http.py) on a free port; a thread, not a process."""
    f = Fake()
    yield f
    f.hang.set()
    f.shutdown()
    f.server_close()


@pytest.fixture
def chromium(tmp_path):
    """Headless Chromium → a DevTools client on its page."""
    from helpers.web import CHROMIUM, chromium_page

    if CHROMIUM is None:
        missing("chromium not installed (apt-get install -y chromium)")
    with chromium_page(tmp_path / "profile") as cdp:
        yield cdp


@pytest.fixture
def static_site():
    """The web editor's page over HTTP after `npm run build` → its base URL."""
    from helpers.web import needs_node_modules, page_site

    needs_node_modules()
    with page_site() as base:
        yield base


def random_llama(hidden: int, layers: int, seed: int, vocab: int = 64, ctx: int = 256,
                 heads: int = 4, kv_heads: int = 2, dtype=None):
    """A random Llama with a small vocabulary (float64 by default: no near-tie flips)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=ctx,
                      eos_token_id=0, bos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval().to(dtype or torch.float64)
