"""Where the native decode step's library comes from (kernels/native.py builds it per CPU
feature set into the user's cache) and the one line that says when the NumPy step serves
instead. Its own module: the weights (quant.py) and the runner (native_runner.py) both ask."""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

from completer_kernels import native

from ..config import env

log = logging.getLogger(__name__)
_announced: set[str] = set()


def cache_dir() -> Path:
    return Path(env("XDG_CACHE_HOME") or Path.home() / ".cache") / "completer" / "native"


def library() -> tuple[ctypes.CDLL | None, str]:
    """(the native step's library, its ISA) or (None, why it is not used)."""
    if (env("COMPLETER_NATIVE") or "1").lower() in ("0", "off", "false", "no"):
        return None, "disabled by COMPLETER_NATIVE"
    return native.load(cache_dir())


def native_or_none():
    """The library, or None after logging (once per reason) that the NumPy step serves instead."""
    lib, why = library()
    if lib is None and why not in _announced:
        _announced.add(why)
        log.warning("native decode step unavailable (%s): using the NumPy step", why)
    return lib
