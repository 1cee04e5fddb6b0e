"""Layer 3 (above errors/io and config): the attention mechanism of one layer, as tensors and modules.

`positions.Grid` owns window geometry and visibility; `compressor` holds the compressor variants (the
paper's per-offset compressor, DeepSeek-V4's); `attention.Attention` runs one joint softmax over entries
and exact tokens; `blockwise` has the fast paths beside the dense reference; `cache` the decode caches;
`rope` and `norm` the small pieces. It builds from a `ModelConfig` and knows nothing of whole models,
data or training, so everything above can rely on it and it on nothing above.
"""
