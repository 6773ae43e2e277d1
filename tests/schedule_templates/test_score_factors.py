"""A score that divides q·k by a factor of the query and one of the key (cosine similarity) is
planned for the Hopper attention kernel as q·k times their reciprocals, each computed once per
row and per column of a fragment; scores of any other form are left as written."""
import numpy as np

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.algebra.exprs import nodes, substitute
from tensorfuse.dsl.evaluate import evaluate_plain
from tensorfuse.dsl.expr import Load, Ref, Symbol
from tensorfuse.dsl.printer import to_text
from tensorfuse.kernels.attention import softmax_attend
from tensorfuse.schedule_templates.hopper_attention_plan import plan_hopper_attention

CHAIN = ("m", "l", "o")


def _cosine(causal: bool, pairwise: bool = False):
    """Attention over q·k divided by the rows' and the keys' norms (given), times tau; with
    ``pairwise`` also by a tensor of (query, key) pairs, which no row or column factor is."""
    @tf.kernel
    def cosine_of_norms(q: T.Tensor["B", "H", "S", "D", "bf16"],
                        k: T.Tensor["B", "H", "S", "D", "bf16"],
                        v: T.Tensor["B", "H", "S", "D", "bf16"],
                        nq: T.Tensor["B", "H", "S", "f32"], nk: T.Tensor["B", "H", "S", "f32"],
                        pairs: T.Tensor["S", "S", "bf16"], tau: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) / (nq[b, h, i] * nk[b, h, j]) * tau
        s = s / pairs[i, j] if pairwise else s
        s = T.where(i >= j, s, -T.inf) if causal else s
        return softmax_attend(s, v[b, h, j, e], j)

    return cosine_of_norms


def _values(score, plan, rng) -> dict:
    """Random values for the dot product, every load (by its text) and the scalar."""
    names = {"qk": rng.standard_normal(64) * 30}
    for n in nodes(score):
        if isinstance(n, Load):
            names[to_text(n)] = rng.uniform(0.05, 500, 64)
    names["tau"] = 2.5
    return names


def _as_symbols(score, dot: str):
    return substitute(score, lambda n: Symbol("qk", "f32") if isinstance(n, Ref) and
                      n.compute.name == dot else Symbol(to_text(n), "f32")
                      if isinstance(n, Load) else None)


def test_a_score_divided_by_row_and_column_factors_multiplies_by_their_reciprocals():
    rng = np.random.default_rng()
    for causal in (False, True):
        plan = plan_hopper_attention(_cosine(causal).program, CHAIN, "j")
        written = to_text(plan.score)
        assert written.count("1.0 /") == 2 or written.count("1 /") == 2, written
        assert written.index("nk[") < written.index("nq["), written   # the columns' first
        assert (plan.mask is not None) == causal
        dot = plan.chain.dot
        env = _values(plan.chain.score, plan, rng)
        as_written = plan.chain.score.a if causal else plan.chain.score
        want = evaluate_plain(_as_symbols(as_written, dot), env)
        got = evaluate_plain(_as_symbols(plan.score, dot), env)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_factor_of_query_and_key_together_leaves_the_score_as_written():
    plan = plan_hopper_attention(_cosine(False, pairwise=True).program, CHAIN, "j")
    assert plan.score is plan.chain.score


def test_the_sm90a_source_divides_no_element():
    source = tf.compile(_cosine(True), target="cuda:sm_90a").source(B=1, H=2, S=512, D=128)
    assert "qk * (1.0f / " in source and "qk / (" not in source
