"""A schedule's plan can be printed, and the template it applies is written on its TensorIR."""
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.errors import ScheduleError

PREFILL = dict(B=2, H=16, M=4096, N=4096, D=128)


def test_plan_of_an_attention_template_at_given_sizes():
    sch = tf.schedule(K.causal_attention, "cuda:sm_90a")
    sch.rolling_update("m", "l", "o", axis="j")
    sch.apply_template("attention", tile_n=64)
    text = sch.plan(**PREFILL)
    assert "o: linear over m" in text and "exp(m.old - m.new)" in text   # the chain plan
    assert "grid: b=2, h=16 × rows i (4096)" in text                    # the template plan
    assert "s_sum = q[b, h, i, d] · k[b, h, j, d] on tensor cores (bf16)" in text
    assert "mask: i + T.size('N') - T.size('M') >= j" in text
    assert "block_m=128, block_n=64" in text and \
        "knobs from: the knobs given (tile_n=64), the rest template defaults" in text
    assert "plan(**sizes)" in sch.plan()   # without sizes: how to see the tiles


def test_applying_a_template_annotates_the_tensorir_and_undo_removes_it():
    sch = tf.schedule(K.softmax, "cuda:sm_90a")
    sch.rolling_update("m", "l", axis="j")
    before = sch.script()
    sch.apply_template("row_reduction", block=1024)
    text = sch.script()
    assert '"tensorfuse.template": "row_reduction"' in text
    assert '"tensorfuse.knob.block": 1024' in text
    sch.undo()
    assert sch.script() == before


def test_plan_of_cluster_templates():
    ffn = tf.schedule(K.ffn_gelu, target="cuda:sm_90a")
    ffn.cluster_distribute("n", cluster=4)
    text = ffn.plan(M=1024, K=4096, N=14336, O=4096)
    assert "GEMM-chain plan" in text and "cluster=4" in text
    assert '"tensorfuse.template": "cluster"' in ffn.script()
    dec = tf.schedule(K.gqa_attention, target="cuda:sm_90a")
    dec.rolling_update("m", "l", "o", axis="j")
    dec.cluster_distribute("j", warps=2)
    assert "cluster-decode plan" in dec.plan(B=4, H=32, HKV=8, M=1, N=4096, D=128)


def test_plan_refuses_sizes_the_kernel_does_not_have():
    sch = tf.schedule(K.softmax, "cuda:sm_90a")
    sch.rolling_update("m", "l", axis="j")
    sch.apply_template("row_reduction")
    with pytest.raises(ScheduleError, match="Q"):
        sch.plan(M=64, Q=3)
