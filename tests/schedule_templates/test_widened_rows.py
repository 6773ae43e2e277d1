"""Chains whose wider members carry their extra axes only from the tensors they read
(:mod:`tensorfuse.schedule_templates.widened_rows`): a masked mean over tokens planned as rows
(b, d) swept over s — it had looked like attention with a feature axis of 1024 and run on TVM's
untiled default schedule — and what stays as it was: GEMMs (cosine similarity), attention, a
narrower member that is an output."""
import numpy as np
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.schedule_templates.widened_rows import widened
from benchmarks.unlisted_kernels import cosine_similarity, masked_mean_pool


@tf.kernel
def _mean_and_count(x: T.Tensor["B", "S", "D", "f32"], mask: T.Tensor["B", "S", "f32"]):
    b, s, d = T.axes("b s d")
    count = T.sum(mask[b, s], over=s)
    return T.sum(x[b, s, d] * mask[b, s], over=s) / count, count


def test_a_masked_mean_is_planned_as_rows_of_batch_and_features():
    program, note = widened(masked_mean_pool.program)
    assert note.startswith("out_sum_2 recomputed along d")
    count = next(c for c in program.computes if c.name == "out_sum_2")
    assert [a.name for a in count.axes] == ["b", "d"]
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(masked_mean_pool, target="cuda:sm_90a")
    sizes = dict(B=32, S=512, D=1024)
    assert made.schedule_origin(**sizes).startswith("out_sum_2 recomputed along d")
    source = made.source(**sizes)
    assert "tl.dot" not in source and "x + (ax_b * 524288 + offs_n[None, :] * 1024 + " \
        "offs_m[:, None])" in source   # rows d (contiguous), the sweep over s


@pytest.mark.parametrize("kernel", [cosine_similarity, _mean_and_count, K.attention,
                                    K.causal_attention, K.gqa_attention, K.softmax])
def test_gemms_attention_and_outputs_narrower_than_their_chain_are_left_as_they_are(kernel):
    assert widened(kernel.program) is None


def test_the_cpu_target_computes_it_as_written():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 37, 20)).astype("f4") * 4
    lengths = rng.integers(1, 38, 3)
    mask = (np.arange(37)[None, :] < lengths[:, None]).astype("f4")
    f = tf.compile(_mean_and_count, target="llvm")
    mean, count = f(x, mask)
    want = (x.astype("f8") * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    np.testing.assert_allclose(mean, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(count, lengths.astype("f4"))


@pytest.mark.gpu
def test_a_masked_mean_matches_float64_on_the_gpu():
    import torch

    from tests.helpers import relative_error

    x = torch.randn(4, 300, 700, device="cuda").bfloat16() * 4
    lengths = torch.randint(1, 301, (4,), device="cuda")
    mask = (torch.arange(300, device="cuda")[None, :] < lengths[:, None]).bfloat16()
    got = torch.full((4, 700), float("nan"), device="cuda", dtype=torch.bfloat16)
    tf.compile(masked_mean_pool)(x, mask, out=got)
    xd, md = x.double(), mask.double()
    assert relative_error(got, (xd * md[..., None]).sum(1) / md.sum(1, keepdim=True)) < 2e-2


def test_tuning_tunes_the_row_template_tf_compile_runs():
    from tensorfuse.autotune.tasks import make_task
    from tensorfuse.targets import get_target

    task = make_task(masked_mean_pool, dict(B=32, S=512, D=1024), get_target("cuda:sm_90a"))
    assert task.template == "row_reduction"
    assert [a.name for a in next(c for c in task.kernel.program.computes
                                 if c.name == "out_sum_2").axes] == ["b", "d"]
