"""llama-server from the cache .ci/llamacpp.sh fills (built once per machine, about 20 minutes),
serving the embedded target converted to GGUF; the `llama_bin` and `llama` fixtures in
conftest.py stand on it."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from . import ROOT, free_port, missing

TARGET = ROOT / "draft_models" / "default" / "target"
SOURCE = ('import os\n\n\ndef read_lines(path):\n    """Return the lines of a file."""\n    with open(path) as f:\n'
          '        return f.read().splitlines()\n\n\ndef main():\n    for line in read_lines(os.environ["FILE"]):\n'
          '        print(line)\n')
PREFIX, SUFFIX = SOURCE[:SOURCE.index("        print")], SOURCE[SOURCE.index("\n\n\ndef main"):]


def llama_paths() -> tuple[Path, Path]:
    """(llama-server, target .gguf) from the cache .ci/llamacpp.sh fills; skip (fail under CI)
    when it was never built: the build takes about 20 minutes and is .ci/run's job."""
    env = {**os.environ, "LLAMACPP_NO_BUILD": "1", "PYTHON": sys.executable}
    run = lambda *a: subprocess.run(["bash", str(ROOT / ".ci" / "llamacpp.sh"), *a], check=False, capture_output=True,
                                    text=True, env=env, timeout=600)
    cache, gguf = run(), run("--gguf", str(TARGET), "f32")
    if cache.returncode or gguf.returncode:
        why = (cache.stderr or gguf.stderr).strip()
        missing(f"no llama-server: {why}")
    return Path(cache.stdout.strip()) / "bin" / "llama-server", Path(gguf.stdout.strip())


class LlamaServer:
    """A llama-server subprocess on a fixed port (so it can be killed and started again)."""

    def __init__(self, binary: Path, gguf: Path, *extra: str):
        self.argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(free_port()),
                     "-c", "2048", "-np", "4", "-t", "1", "--metrics", "--spm-infill", *extra]
        self.port = int(self.argv[self.argv.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.p: subprocess.Popen | None = None
        self.key = extra[extra.index("--api-key") + 1] if "--api-key" in extra else None

    def start(self) -> LlamaServer:
        self.p = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):  # /health answers 200 once the model is loaded
            assert self.p.poll() is None, "llama-server exited at start"
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError("llama-server did not become healthy")

    def kill(self) -> None:
        if self.p is not None and self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=30)

    def get(self, path: str) -> str:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.key}"}
                                     if self.key else {})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read().decode()

    def predicted_total(self) -> int:
        """`llamacpp:tokens_predicted_total` once every slot is idle (a cancelled slot's tokens
        are counted when it is released)."""
        for _ in range(400):
            if '"is_processing":true' not in self.get("/slots").replace(" ", ""):
                break
            time.sleep(0.01)
        m = re.search(r"^llamacpp:tokens_predicted_total (\d+)", self.get("/metrics"), re.MULTILINE)
        return int(m.group(1))
