"""A tuning batch of CUDA C++ candidates (cluster decode, the Hopper templates) has its ``nvcc``
builds done ahead, together, on the job's CPUs — into the on-disk cubin cache where the GPUs that
measure them (this process's and the local workers') find them — instead of one after another in
the measuring thread."""
from __future__ import annotations

import itertools
import os

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.autotune.runner import TritonRunner
from tensorfuse.autotune.tasks import make_task
from tests.helpers import needs_nvcc


@needs_nvcc
def test_a_batch_of_decode_candidates_is_built_ahead(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path))
    task = make_task(K.gqa_attention, dict(B=2, H=8, HKV=2, M=1, N=1000, D=128),
                     tf.get_target("cuda:sm_90a"), {})
    assert task.template == "cluster_decode"
    items = [(index, (task.name, {"cluster": c, "warps": w, "stages": 2, "copy": 0}))
             for index, (c, w) in enumerate(itertools.product((2, 4), (2, 4)))]
    runner = TritonRunner({task.name: task})
    try:
        handed = list(runner.compiled_in_turn(items))
    finally:
        runner.close()
    assert sorted(tag for tag, _ in handed) == [0, 1, 2, 3]
    assert all(candidate is not None for _, candidate in handed)   # made here, measured as is
    built = os.listdir(tmp_path / "cuda")
    assert len([name for name in built if name.endswith(".cubin")]) == 4   # one per candidate
