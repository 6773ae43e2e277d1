"""The rewrite rules: which dependences are corrected, how, and which are refused (with the
expression named). Every accepted scheme also passes the numerical check in the algebra itself."""
import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.algebra import plan_chain, register_rule
from tensorfuse.algebra.transfer import USER_RULES, Terms
from tensorfuse.dsl.evaluate import evaluate_plain
from tensorfuse.dsl.printer import to_text
from tensorfuse.errors import RollingUpdateError
from tests.helpers import line_of

X = T.Tensor["M", "N", "f64"]


def chain_of(fn, names, axis="j"):
    return plan_chain(tf.kernel(fn).program, names, axis)


def test_online_softmax_correction_is_exp_of_the_max_change():
    def k(x: X):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        l = T.sum(T.exp(x[i, j] - m), over=j)  # noqa: E741
        return l

    scheme = chain_of(k, ["m", "l"]).schemes["l"]
    assert scheme.kind == "linear" and scheme.deps == ("m",)
    assert "exp(m.old - m.new)" in repr(scheme.correct[0])


def test_division_by_a_running_sum_is_deferred_to_the_end():
    def k(x: X, v: X):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        p = T.exp(x[i, j] - m)
        l = T.sum(p, over=j)  # noqa: E741
        o = T.sum(p / l * v[i, j], over=j)
        return o

    scheme = chain_of(k, ["m", "l", "o"]).schemes["o"]
    assert set(scheme.deps) == {"l", "m"}
    assert [to_text(st.body) for st in scheme.states] == ["v[i, j] * exp(x[i, j] - m)"]
    # l is not in the running state at all: the state is only rescaled when m moves ...
    assert "l." not in to_text(scheme.correct[0]) and "exp(m.old - m.new)" in to_text(
        scheme.correct[0])
    # ... and divided by the final l once, in the value (an empty state stays 0)
    assert to_text(scheme.value[0]) == "where(o#0 == 0.0, 0.0, 1.0 / l.new * o#0)"
    assert float(evaluate_plain(scheme.value[0], {"o#0": 3.0, "l.new": 2.0})) == 1.5


def test_a_mean_is_referenced_as_the_running_mean_however_it_is_written():
    """Mid-sweep, later members are kept relative to a dependency's reference: the value formula
    with running sums extrapolated to the whole axis (× N/seen). A mean written Σ y / N is the
    running sum extrapolated; one written Σ y / Σ 1 is the running sum over the running count,
    where the extrapolations cancel — extrapolating that value again put it N/seen times too far
    from the data, and Σ (y − w)² lost every digit on data with an offset."""
    def over_n(y: X):
        i, j = T.axes("i j")
        w = T.sum(y[i, j] / T.size("N"), over=j)
        return T.sum((y[i, j] - w) ** 2, over=j)

    def over_count(y: X):
        i, j = T.axes("i j")
        count = T.sum(y[i, j] * 0.0 + 1.0, over=j)
        w = T.sum(y[i, j] / count, over=j)
        return T.sum((y[i, j] - w) ** 2, over=j)

    over_n_ref = chain_of(over_n, ["w", "out"]).schemes["w"].reference()
    assert float(evaluate_plain(over_n_ref, {"w#0": 12.0, "__extrapolation": 2.5})) == 30.0
    # an overflowed running value is no reference, nor, mid-sweep, 0 (a member may divide by
    # it: a masked prefix's count): 1 instead (exact all the same); once the whole axis is seen
    # the reference is the value itself, 0 included
    assert float(evaluate_plain(over_n_ref, {"w#0": float("inf"), "__extrapolation": 2.5})) == 1
    assert float(evaluate_plain(over_n_ref, {"w#0": 0.0, "__extrapolation": 2.5})) == 1
    assert float(evaluate_plain(over_n_ref, {"w#0": 0.0, "__extrapolation": 1.0})) == 0
    ref = chain_of(over_count, ["count", "w", "out"]).schemes["w"].reference()
    # S_y · E / (count's reference, itself count · E): the running mean, at any E
    for e in (1.0, 7.5):
        got = evaluate_plain(ref, {"w#0": 12.0, "count.new": 4.0 * e, "__extrapolation": e})
        assert float(got) == 3.0


def test_welford_style_variance_is_centred():
    def k(x: X):
        i, j = T.axes("i j")
        mean = T.sum(x[i, j], over=j) / T.size("N")
        var = T.sum((x[i, j] - mean) ** 2, over=j)
        return var

    scheme = chain_of(k, ["mean_sum", "var"]).schemes["var"]
    assert len(scheme.states) == 3  # Σ(x−μ)², Σ(x−μ), count
    bodies = [repr(s.body) for s in scheme.states]
    assert any("x[i, j] - mean_sum" in b for b in bodies)


def test_max_of_shifted_and_positively_scaled_values():
    def k(x: X):
        i, j = T.axes("i j")
        total = T.sum(T.abs(x[i, j]) + 1.0, over=j)
        top = T.max(x[i, j] / total, over=j)
        return top

    scheme = chain_of(k, ["total", "top"]).schemes["top"]
    assert scheme.kind == "affine"


def test_max_of_a_value_scaled_by_a_possibly_negative_number_is_refused():
    def k(x: X):
        i, j = T.axes("i j")
        total = T.sum(x[i, j], over=j)
        top = T.max(x[i, j] * total, over=j)  # <- here
        return top

    with pytest.raises(RollingUpdateError, match="not provably positive") as info:
        chain_of(k, ["total", "top"])
    assert info.value.location.lineno == line_of(k, "# <- here")


def test_tanh_of_a_shifted_value_is_refused_naming_the_expression():
    def k(x: X):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        t = T.sum(T.tanh(x[i, j] - m), over=j)  # <- here
        return t

    with pytest.raises(RollingUpdateError) as info:
        chain_of(k, ["m", "t"])
    text = str(info.value)
    assert "tanh(x[i, j] - m)" in text and "cannot fuse t" in text
    assert info.value.location.lineno == line_of(k, "# <- here")


def test_condition_on_a_dependency_is_refused():
    def k(x: X):
        i, j = T.axes("i j")
        m = T.sum(x[i, j], over=j)
        c = T.sum(T.where(x[i, j] > m, 1.0, 0.0), over=j)
        return c

    with pytest.raises(RollingUpdateError, match="switch branches"):
        chain_of(k, ["m", "c"])


def test_argmax_as_a_dependent_reduction_uses_a_reset():
    def k(x: X):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        first = T.min(T.where(x[i, j] == m, j, T.size("N")), over=j)
        return first

    assert chain_of(k, ["m", "first"]).schemes["first"].kind == "reset"


def test_a_sum_resets_to_its_identity_where_the_maximum_moves():
    """Counting the elements equal to the maximum: 0 for those seen before it moved, which any
    monoid allows; a reset to another value only where the monoid declares it."""
    def count(x: X):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        c = T.sum(T.where(x[i, j] == m, 1.0, 0.0), over=j)
        return c

    assert chain_of(count, ["m", "c"]).schemes["c"].kind == "reset"

    def shifted(x: X):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        c = T.sum(T.where(x[i, j] == m, 1.0, 2.0), over=j)   # 2 for every other element
        return c

    with pytest.raises(RollingUpdateError, match="2.0, which is not its identity"):
        chain_of(shifted, ["m", "c"])


def test_product_of_rescaled_values_is_corrected_by_a_power_of_the_count():
    def k(x: X):
        i, j = T.axes("i j")
        total = T.sum(T.abs(x[i, j]) + 1.0, over=j)
        p = T.prod(x[i, j] / total, over=j)
        return p

    scheme = chain_of(k, ["total", "p"]).schemes["p"]
    assert scheme.kind == "power" and len(scheme.states) == 2


def test_logsumexp_accepts_shifts_only():
    def shifted(x: X):
        i, j = T.axes("i j")
        mu = T.sum(x[i, j], over=j)
        r = T.logsumexp(x[i, j] - mu, over=j)
        return r

    assert chain_of(shifted, ["mu", "r"]).schemes["r"].kind == "affine"

    def scaled(x: X):
        i, j = T.axes("i j")
        s = T.sum(T.abs(x[i, j]) + 1.0, over=j)
        r = T.logsumexp(x[i, j] / s, over=j)
        return r

    with pytest.raises(RollingUpdateError, match="only corrected by shifts"):
        chain_of(scaled, ["s", "r"])


def test_three_dependent_reductions():
    def k(x: X, v: X):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        l = T.sum(T.exp(x[i, j] - m), over=j)  # noqa: E741
        q = T.sum(T.exp(x[i, j] - m) / l * v[i, j] * v[i, j], over=j)
        return q

    chain = chain_of(k, ["m", "l", "q"])
    assert chain.schemes["q"].deps == ("l", "m")


def test_chain_validation_errors():
    def k(x: X):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        p = T.exp(x[i, j] - m)
        return p

    prog = tf.kernel(k).program
    with pytest.raises(RollingUpdateError, match="no value named 'mm'"):
        plan_chain(prog, ["mm"], "j")
    with pytest.raises(RollingUpdateError, match="not a reduction"):
        plan_chain(prog, ["p"], "j")
    with pytest.raises(RollingUpdateError, match="named 'i'"):
        plan_chain(prog, ["m"], "i")


def test_a_user_rule_extends_the_table_and_is_checked_numerically():
    """Built in, a power needs a constant exponent. A user rule for ``b ** p`` with a scalar
    parameter ``p`` ((κ·b)^p = κ^p · b^p for κ > 0) makes the chain fusable; a wrong rule is caught
    by the numerical check."""
    from tensorfuse.algebra.transfer import is_positive, linear
    from tensorfuse.dsl.expr import Scalar, binary

    def k(x: X, p: T.f64):
        i, j = T.axes("i j")
        s = T.sum(T.abs(x[i, j]) + 1.0, over=j)
        r = T.sum(((T.abs(x[i, j]) + 1.0) / s) ** p, over=j)
        return r

    with pytest.raises(RollingUpdateError, match="constant exponent"):
        chain_of(k, ["s", "r"])

    def scalar_power(e, ctx):
        if not isinstance(e.b, Scalar):
            return None
        single = linear(e.a, ctx).only()
        if single is None or not is_positive(single[1], ctx):
            return None
        b, c = single
        return Terms.single(binary("pow", b, e.b), binary("pow", c, e.b))

    def wrong_power(e, ctx):
        if not isinstance(e.b, Scalar):
            return None
        b, c = linear(e.a, ctx).only()
        return Terms.single(binary("pow", b, e.b), c)  # forgets to raise the scale to p

    register_rule("pow", scalar_power)
    try:
        assert chain_of(k, ["s", "r"]).schemes["r"].kind == "linear"
    finally:
        USER_RULES.pop("pow")
    register_rule("pow", wrong_power)
    try:
        with pytest.raises(RollingUpdateError, match="numerical check"):
            chain_of(k, ["s", "r"])
    finally:
        USER_RULES.pop("pow")
