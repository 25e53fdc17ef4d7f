"""The CUDA step's static-shape forward (cuda_graphs.py) computes LlamaRunner's forward for every
family, bucket padding included; on a machine with a GPU, the replayed graphs generate the
eager runner's greedy ids."""
from __future__ import annotations

import pytest
import torch
from test_families import FAMILY_CASES, family_model

from completer.engine.cuda_graphs import BUCKETS, GraphRunner
from completer.engine.runner import LlamaRunner, LlamaWeights
from completer.engine.runner_factory import make_runner
from completer.engine.sampling import Sampling
from completer.engine.speculative import generate

torch.set_num_threads(1)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_static_forward_matches_the_lean_runner(case):
    """Steps of 1-9 tokens padded to their bucket (padding written to dead positions), after an
    eager prefill, with a rollback, past Mistral/StarCoder2's 16-token window."""
    w = LlamaWeights.from_hf(family_model(case).double())
    ref, got = LlamaRunner(w, 128), GraphRunner(w, 128)
    ids = torch.randint(0, 256, (80,), generator=torch.Generator().manual_seed(2)).tolist()
    for r in (ref, got):
        r.forward(ids[:20])
    for a, b in [(20, 21), (21, 26), (26, 27), (27, 36), (33, 34), (34, 40)]:
        if a < len(ref.ids):  # roll back "rejected" positions
            ref.truncate(a)
            got.truncate(a)
        want = ref.forward(ids[a:b])
        T = b - a
        bucket = next(x for x in BUCKETS if x >= T)
        pos = torch.arange(a, a + bucket)
        out = got.static_forward(torch.tensor(ids[a:b] + [0] * (bucket - T)), pos)[:T]
        got.ids.extend(ids[a:b])
        assert torch.allclose(out, want, atol=1e-9), (case, a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", ["qwen2", "mistral"])
def test_graphs_generate_the_eager_greedy_ids(case):
    w = LlamaWeights.from_hf(family_model(case).cuda())
    prompt = list(range(1, 40))
    r = make_runner(w, 128)
    assert type(r) is GraphRunner
    ref, _ = generate(LlamaRunner(w, 128), prompt, 40, Sampling())
    out, _ = generate(r, prompt, 40, Sampling())
    assert out == ref and set(r.graphs) == {1}
