"""The CUDA decode step: a static-shape forward captured as CUDA graphs, one per verify width.

On a GPU a batch-1 step of a small model is launch-bound: ~15 kernels per layer, each a few µs
of work behind ~5-10 µs of Python and launch overhead. As gpt-fast does, the step is written with
static shapes — the K/V cache preallocated for the whole context (LlamaRunner's), positions as a
device tensor, the K/V write an `index_copy_`, attention over every cache position under a
position mask — so that one forward of T tokens can be captured once and replayed: one host→device
copy of the ids and positions, one `replay()`, no per-step allocation. The only host sync is the
caller's (the accepted count, in `verify`).

Widths are bucketed (1, 2, 4, 8, 16): a verify of k+1 tokens replays the smallest bucket that
holds it, its padding written to dead cache positions past the live tokens (overwritten later,
masked meanwhile). Longer forwards (prompt prefill) and those whose padding would run past the
context take LlamaRunner's eager path over the same K/V. Runners of one model share the captured
graphs' memory pool, not the graphs (each graph is bound to its runner's cache).

Every layout of the family table runs (biases, q/k norm, sliding window, LayerNorm, GELU MLPs,
embedding scale), with dense bf16/fp16/fp32 weights and our Triton int8/int4 kernels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .runner import _ACT, LlamaRunner, _f32, _linear, _norm, _rms

BUCKETS = (1, 2, 4, 8, 16)


class GraphRunner(LlamaRunner):
    """A LlamaRunner whose short forwards replay a CUDA graph of `static_forward`."""

    def __init__(self, weights, max_len: int | None = None):
        super().__init__(weights, max_len)
        dev = self.device
        self.ids_buf = torch.zeros(BUCKETS[-1], dtype=torch.long, device=dev)
        self.pos_buf = torch.zeros(BUCKETS[-1], dtype=torch.long, device=dev)
        self.kpos = torch.arange(self.max_len, device=dev)  # [P] key positions
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # bucket → (graph, logits)

    @torch.inference_mode()
    def static_forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits [T, V] of tokens `ids` [T] at positions `pos` [T] (device tensors), their K/V
        written at `pos`; shapes depend on T only. Does not touch `self.ids` (the caller does)."""
        H, Hkv, hd, eps, lay = self.n_heads, self.n_kv, self.hd, self.eps, self.layout
        T, dt = ids.shape[0], self.dtype
        x = self.embed[ids].to(dt)  # [T, D]
        if lay.embed_scale is not None:
            x = x * lay.embed_scale
        rot = self.rot[pos].view(T, 1, hd // 2)
        see = self.kpos[None] <= pos[:, None]  # [T, P]: causal over the whole cache
        if lay.sliding_window is not None:
            see = see & (self.kpos[None] > pos[:, None] - lay.sliding_window)
        act = _ACT.get(lay.act)
        cplx = dt in (torch.float32, torch.float64)  # no complex bf16: rotate in fp32 then
        for li, (w_in, wqkv, wo, w_post, wgu, wdown) in enumerate(self.layers):
            e = self.extra[li]
            qkv = _linear(_norm(x, w_in, e.in_b, eps), wqkv, e.qkv_b)  # [T, (H+2Hkv)·hd]
            qk = qkv[:, :(H + Hkv) * hd].reshape(T, H + Hkv, hd)
            if e.q_norm is not None:
                qk = torch.cat([_rms(qk[:, :H], e.q_norm, eps), _rms(qk[:, H:], e.k_norm, eps)], dim=1)
            qk = torch.view_as_complex((qk if cplx else qk.float()).reshape(T, H + Hkv, hd // 2, 2)) * rot
            qk = torch.view_as_real(qk).reshape(T, H + Hkv, hd).to(dt).transpose(0, 1)  # [H+Hkv, T, hd]
            self.k[li, 0].index_copy_(1, pos, qk[H:])
            self.v[li, 0].index_copy_(1, pos, qkv[:, (H + Hkv) * hd:].view(T, Hkv, hd).transpose(0, 1))
            o = F.scaled_dot_product_attention(qk[None, :H], self.k[li], self.v[li], attn_mask=see,
                                               enable_gqa=Hkv != H)[0]  # [H, T, hd]
            x = _linear(o.transpose(0, 1).reshape(T, H * hd), wo, x if e.o_b is None else x + e.o_b)
            h = _linear(_norm(x, w_post, e.post_b, eps), wgu, e.gu_b)
            if act is None:  # plain MLP (StarCoder2)
                h = F.gelu(h, approximate="tanh")
            else:
                g, u = h.chunk(2, dim=-1)
                h = act(g) * u
            x = _linear(h, wdown, x if e.down_b is None else x + e.down_b)
        return _f32(_linear(_norm(x, self.norm, self.norm_b, self.eps), self.lm_head))

    def _graph(self, b: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        if b not in self.graphs:
            pool = self.weights.derive("graph_pool", torch.cuda.graph_pool_handle)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm up outside the capture (cuBLAS handles, Triton JIT)
                for _ in range(2):
                    self.static_forward(self.ids_buf[:b], self.pos_buf[:b])
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = self.static_forward(self.ids_buf[:b], self.pos_buf[:b])
            self.graphs[b] = (g, out)
        return self.graphs[b]

    def forward(self, new_ids: list[int]) -> torch.Tensor:
        p, T = len(self.ids), len(new_ids)
        b = next((b for b in BUCKETS if b >= T), None)
        if b is None or p + b > self.max_len:
            return super().forward(new_ids)  # prefill, or padding past the context: eager
        g, out = self._graph(b)
        # one small host→device copy each: ids, then positions (padding: the dead slots after)
        self.ids_buf[:b].copy_(torch.tensor(new_ids + [0] * (b - T)), non_blocking=True)
        self.pos_buf[:b].copy_(torch.arange(p, p + b), non_blocking=True)
        g.replay()
        self.ids.extend(new_ids)
        return out[:T].clone()  # the graph's output buffer is overwritten by the next replay
