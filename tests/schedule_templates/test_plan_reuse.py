"""A row-tile plan is made once per the sizes planning reads and given the call's sizes after
(``TilePlanner.plan``): at a new length of the swept axis it equals the plan made afresh; a size
that planning reads (the rows of a decode, whose heads fold into them; a swept size another axis
shares) plans again."""
from __future__ import annotations

import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.schedule_templates.auto import choose
from tensorfuse.schedule_templates.tile_plan import TilePlanner, plan_rowtile
from tensorfuse.targets import get_target

SPEC = get_target("cuda:sm_90a")


@tf.kernel
def self_attention_one_size(q: T.Tensor["S", "D", "bf16"], k: T.Tensor["S", "D", "bf16"],
                            v: T.Tensor["S", "D", "bf16"]):
    """Queries and keys of one size name: the swept extent is also the rows'."""
    i, j, d, e = T.axes("i j d e")
    s = T.sum(q[i, d] * k[j, d], over=d)
    m = T.max(s, over=j)
    w = T.exp(s - m)
    return T.sum(w * v[j, e], over=j) / T.sum(w, over=j)


def _planner(kernel) -> TilePlanner:
    from tensorfuse.algebra import plan_chain

    _, fusion = choose(kernel.program, SPEC)
    return TilePlanner(kernel.program, plan_chain(kernel.program, fusion.names, fusion.axis))


def _same(a, b) -> bool:
    """Two plans alike in everything the emitters read."""
    return a.describe() == b.describe() and a.fold == b.fold and \
        [o[2] for o in a.outputs] == [o[2] for o in b.outputs] and \
        (a.rows, a.cols, a.feature_extent) == (b.rows, b.cols, b.feature_extent)


@pytest.mark.parametrize("kernel, first, second", [
    (K.softmax, dict(M=4096, N=3008), dict(M=4096, N=3504)),
    (K.gqa_attention, dict(B=8, H=32, HKV=8, M=1, N=4096, D=128),
     dict(B=8, H=32, HKV=8, M=1, N=4097, D=128)),
    (K.causal_attention, dict(B=2, H=4, M=700, N=1000, D=64),
     dict(B=2, H=4, M=700, N=1300, D=64))])
def test_a_new_swept_length_reuses_the_plan_with_its_own_sizes(kernel, first, second):
    planner = _planner(kernel)
    planner.plan(first)
    again = planner.plan(second)
    assert len(planner._plans) == 1 and again.sizes == second
    assert _same(again, plan_rowtile(planner.program, planner.chain, second))


@pytest.mark.filterwarnings("ignore::tensorfuse.errors.FusedPrecisionWarning")
def test_sizes_planning_reads_plan_again():
    """A decode's query rows decide whether its heads fold into them; one size name for rows and
    keys is read by planning too."""
    planner = _planner(K.gqa_attention)
    one = planner.plan(dict(B=8, H=32, HKV=8, M=1, N=4096, D=128))
    many = planner.plan(dict(B=8, H=32, HKV=8, M=128, N=4096, D=128))
    assert len(planner._plans) == 2 and one.fold is not None and many.fold is None
    shared = _planner(self_attention_one_size)
    assert not shared._swept_only
    shared.plan(dict(S=1000, D=64))
    shared.plan(dict(S=1100, D=64))
    assert len(shared._plans) == 2
