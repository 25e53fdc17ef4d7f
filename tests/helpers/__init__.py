"""What several test files share, imported as a library (`from helpers import missing`,
`from helpers.lsp import start`); the fixtures built on it live in tests/conftest.py. A test file
imports this package, never another test file (tests/test_architecture.py checks it).

Modules: lsp (the real `completer-lsp` through pytest-lsp), serve (a real `completer serve`),
llama (llama-server from .ci/llamacpp.sh's cache), fake_http (a scripted HTTP engine), engines
(random and scripted engines in-process), parrot (model pairs with predictable answers), nvim and
web (the editors driven from outside), fuzz (hostile values), edits (checks on next edits)."""
from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def missing(why: str):
    """Something .ci/run installs or builds is missing (a tool, a package, llama-server): a
    failure under CI=1, else a skip. The one place this rule is written; call it before any
    fixture starts a process."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI=1: .ci/run installs it)")
    pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def wait_for(cond, timeout: float, what: str, step: float = 0.1, proc: subprocess.Popen | None = None,
             detail=None):
    """Poll `cond` until truthy (a hang guard, not a timing assertion); on timeout the error
    carries `detail()` (the state seen last)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}")
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f"; last: {detail()}" if detail else ""))
