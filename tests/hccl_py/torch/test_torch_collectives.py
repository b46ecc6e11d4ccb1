"""torch's own distributed test cases on the "hccl" backend (``cases.py``), 4 ranks started once
(launch.spawn, as hccl-launch would); each case reports as its own test."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tests.hccl_py.torch import cases  # noqa: E402
from tests.mp import run_ranks  # noqa: E402


@pytest.fixture(scope="module")
def outcomes():
    results = run_ranks(cases.run_all, cases.WORLD, timeout=240)
    return results


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(cases.CASES))
def test_case(outcomes, name):
    failures = {rank: result[name] for rank, result in enumerate(outcomes) if result[name] is not None}
    assert not failures, "\n".join(f"rank {rank}:\n{text}" for rank, text in failures.items())
