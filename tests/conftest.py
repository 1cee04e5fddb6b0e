import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)  # 2 shared cores: OpenMP spinning across processes is 100x slower


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
