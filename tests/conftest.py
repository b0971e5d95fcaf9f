"""Fixtures of the whole suite. Shared helpers live in tests/helpers/ (pyproject.toml puts tests/ on sys.path)."""

import pytest

pytest.register_assert_rewrite("helpers")  # helpers' asserts explain themselves like the tests' own

import torch  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tests use tiny models, which run fastest on one intra-op thread; two threads spin-wait on a 2-core
    machine that the multi-process tests share."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
