"""bench/record.py: a benchmark's record names the command that made it (as typed again from the
repository root), the CPU it ran on (read from the machine), its cores and threads, the date in
UTC and the commit, around the results; bench/report.py reads it back."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """bench/NAME.py, loaded as its own module (bench/ is no package; dataclasses need the entry)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_record_says_what_ran_where_and_when(tmp_path, monkeypatch):
    record = load("record")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "gate.py"), "--n", "2", "--pair", "new=a b,c"])
    path = record.write("gate", {"n": 2, "table": {"0.0": 1}}, threads=1, path=tmp_path / "gate.json")
    rec = json.loads(path.read_text())
    assert rec["bench"] == "gate"
    assert rec["command"] == "python bench/gate.py --n 2 --pair 'new=a b,c'"
    assert rec["cpu"] == record.cpu_model() and rec["cpu"] not in ("", "unknown")
    assert rec["cores"] >= 1 and rec["threads"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rec["date"])
    assert rec["commit"] is None or re.fullmatch(r"[0-9a-f]{12}", rec["commit"])
    assert isinstance(rec["dirty"], bool)
    assert rec["results"] == {"n": 2, "table": {"0.0": 1}}
    assert load("report").load(tmp_path) == {"gate": rec}


def test_a_relative_script_path_stays_as_typed():
    assert load("record").command(["bench/peers.py", "--threads", "1"]) == "python bench/peers.py --threads 1"


def test_json_that_is_no_record_is_not_read(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"n": 2, "rows": []}))
    (tmp_path / "broken.json").write_text("{")
    assert load("report").load(tmp_path) == {}
