"""Triton kernels, by phase. They know nothing of autograd; ``flashattn.ops`` launches them."""
