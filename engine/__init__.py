"""kog.engine: batch-1 decode engine for Llama-family checkpoints.

reference.py is the plain-torch oracle (gpt-fast style); the monokernel runs a whole decode step,
sampling included, as one persistent Triton launch.
"""
