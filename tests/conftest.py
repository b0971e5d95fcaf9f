import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # makes tests/helpers.py importable


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tests use tiny models, which run fastest on one intra-op thread; two threads spin-wait on a 2-core
    machine that the multi-process tests share."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
