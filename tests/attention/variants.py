"""Variants beyond the paper's grid that every attention equality test covers."""

# DeepSeek-V4 compressors (CSA W = 2S with its leading half-empty window, HCA W = S) and the attention sink
V4_VARIANTS = ["W8/S4 · 1 KV · V4 compressor", "W16/S16 · 1 KV · V4 compressor · no slot bias",
               "W8/S8 · 2 KV · V4 compressor · attention sink · staggered windows",
               "W6/S3 · 1 KV · V4 compressor · uncompressed tail · attention sink", "W8/S8 · 1 KV · attention sink"]

# The repair's designs (issue 18): staggered heads (per-KV-head window starts), shared payloads, grid jitter (a
# training option: eval forwards use the fixed grid)
REPAIR_VARIANTS = ["W8/S4 · 2 KV · staggered heads", "W6/S3 · 4 KV · staggered heads · vector gates · staggered windows",
                   "W8/S4 · 2 KV · staggered heads · V4 compressor · local window 5",
                   "W8/S8 · 2 KV · staggered heads · tied K/V · coverage reg 0.1", "W8/S4 · 1 KV · shared payload",
                   "W8/S4 · 1 KV · grid jitter"]
