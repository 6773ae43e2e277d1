"""Shared fixtures: fresh random inputs every run (the seed is printed on failure), GPU skipping."""
import os
import secrets

import numpy as np
import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one worker a core (setup.cfg: -n auto): thread pools of their own would spin on each
    # other's cores (two golden-source processes with TVM's default pool took 3 min, not 50 s)
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (skipped without one)")


def _has_gpu() -> bool:
    import tvm

    return bool(tvm.cuda(0).exist)


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    """A generator seeded freshly each run; TENSORFUSE_SEED reproduces a failing run."""
    seed = int(os.environ.get("TENSORFUSE_SEED", secrets.randbits(32)))
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed} (rerun with TENSORFUSE_SEED={seed})")
    return np.random.default_rng(seed)
