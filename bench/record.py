"""A benchmark's record: what ran (the command line), where (the CPU's model name, its cores, the
threads the benchmark used), when (UTC), at which commit, and its results, written as one JSON file
to bench/out/<name>.json. bench/report.py turns the records into docs/benchmarks.md's current
section and its figures; the records are committed beside the page they feed.

    {"bench": "gate", "command": "python bench/gate.py --n 150 ...", "cpu": "AMD EPYC", "cores": 2,
     "threads": 1, "date": "2026-12-05T10:32:11Z", "commit": "5f25206abc12", "dirty": false,
     "results": {...}}
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> str:
    """The CPU, its cores and the load average: others share this machine."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{cpu_model()}, {os.cpu_count()} cores, load average {load}"


def commit() -> tuple[str | None, bool]:
    """HEAD's hash (12 digits) and whether tracked files differ from it; (None, False) outside git."""
    def git(*args: str) -> str | None:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
        return r.stdout.strip() if r.returncode == 0 else None
    head = git("rev-parse", "--short=12", "HEAD")
    return head, bool(head and git("status", "--porcelain", "--untracked-files=no"))


def command(argv: list[str]) -> str:
    """The command line as a user would type it again from the repository root."""
    script = Path(argv[0])
    if script.is_absolute() and script.is_relative_to(ROOT):
        script = script.relative_to(ROOT)
    return shlex.join(["python", script.as_posix(), *argv[1:]])


def write(name: str, results: dict, *, threads: int | None, path: Path | None = None) -> Path:
    """Writes the record of this process's run to `path` (default bench/out/<name>.json) and returns
    the path. `threads`: the threads the measured work ran on (None where nothing was timed)."""
    head, dirty = commit()
    rec = {"bench": Path(sys.argv[0]).stem, "command": command(sys.argv), "cpu": cpu_model(),
           "cores": os.cpu_count(), "threads": threads,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": head, "dirty": dirty,
           "results": results}
    path = path or OUT / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path
