"""The CUDA backend: Triton kernels, registered on the `CUDA` dispatch key.

Persistent matmul with fixed tiles and no split-K (matmul.py), one-program-per-row reductions
(reduction.py), elementwise ops (pointwise.py) and the fixed-partition paged attention
(attention.py); their fixed configurations are in config.py. `registry.py` registers the
adapters of adapters.py, which import the kernels on first call: importing this package, or
`oracle_kernels`, does not import triton. sampling.py (a sampled row's token, log-probability and
top-2 in one read) is no override: the native engine's sampler calls it in invariant mode.
"""
