import os

import torch

if not torch.cuda.is_available():  # the triton kernels' tests run under Triton's interpreter, chosen at its import
    os.environ.setdefault("TRITON_INTERPRET", "1")
