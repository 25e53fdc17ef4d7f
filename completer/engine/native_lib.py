"""Where the native decode step's library comes from (kernels/native.py builds it per CPU
feature set into the user's cache), the one line that says when the NumPy step serves instead,
and the one that says whether int8 products of several rows (and fp16 ones, where the CPU has
AMX-BF16) run on AMX and, if not, why.
Its own module: the weights (quant.py) and the runner (native_runner.py) both ask."""
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


def _off(name: str) -> bool:
    return (env(name) or "1").lower() in ("0", "off", "false", "no")


def library() -> tuple[ctypes.CDLL | None, str]:
    """(the native step's library, its ISA) or (None, why it is not used)."""
    lib, isa, _ = _library()
    return lib, isa


def _library() -> tuple[ctypes.CDLL | None, str, str | None]:
    """library() and why int8 products do not run on AMX (None: they do)."""
    if _off("COMPLETER_NATIVE"):
        return None, "disabled by COMPLETER_NATIVE", None
    flags = native.cpu_flags()
    if not native.AMX <= flags:
        return *native.load(cache_dir(), flags), "this CPU reports no AMX (amx_tile, amx_int8)"
    if _off("COMPLETER_NATIVE_AMX"):
        return *native.load(cache_dir(), flags - native.AMX), "disabled by COMPLETER_NATIVE_AMX"
    lib, isa = native.load(cache_dir(), flags)
    if lib is None:  # the AMX build failed or AMX was refused: the same build without it
        return *native.load(cache_dir(), flags - native.AMX), isa
    return lib, isa, None if isa.endswith("+amx") else f"the {isa} build has no AMX kernels"


def native_or_none():
    """The library, or None after logging (once per reason) that the NumPy step serves instead;
    with it, one line (once per reason) says whether int8 products of several rows run on AMX."""
    lib, isa, no_amx = _library()
    if lib is None:
        line = f"native decode step unavailable ({isa}): using the NumPy step"
    elif no_amx is None:
        line = f"native decode step ({isa}): int8 products of {lib.nstep_amx_rows(-1)}+ rows on AMX tiles"
        if lib.nstep_amxh_rows(-1) > 0:
            line += f"; fp16 products (bf16-valued weights) of {lib.nstep_amxh_rows(-1)}+ rows on AMX-BF16"
    else:
        line = f"native decode step ({isa}): int8 products on {isa} vectors, not AMX ({no_amx})"
    if line not in _announced:
        _announced.add(line)
        log.log(logging.WARNING if lib is None else logging.INFO, line)
    return lib
