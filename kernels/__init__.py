"""Triton kernels, each beside its PyTorch reference, with CPU fallbacks. No LSP, no engine."""
