"""Masked key loops cut at the mask's edges on the CPU (schedule_templates/mask_bounds.py): each
row of a causal, windowed, prefix-LM or neighbourhood chain loops over the keys its mask can keep,
results unchanged (float64 references, ragged sizes, masks off the diagonal); masks the bounds
cannot be read from, and programs that keep key-indexed results, are left whole. The unfused
rows are built with ``tf.compile(..., template=None)`` (by default ``tf.compile`` runs attention
chains fused on the CPU: test_rolling_update_cpu.py)."""
import re

import numpy as np
import pytest

import tensorfuse as tf
import tensorfuse.compiled
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.kernels.layers import attention_kernel
from tensorfuse.kernels.reference import TOLERANCE, random_inputs, relative_error
from tests.helpers import float64_reference
from tensorfuse.schedule_templates import lower_program
from tensorfuse.schedule_templates.mask_bounds import bound_masked_loops, key_mask



def unfused(kernel):
    """The kernel on the CPU template's row schedule (no fusion)."""
    return tf.compile(kernel, target="llvm", template=None)


def unbounded_and_bounded(f, dims):
    """The kernel's scheduled module before the pass, and after it."""
    raw = f._build(dict(dims), "int32")
    raw = raw[0] if isinstance(raw, tuple) else raw
    return raw, bound_masked_loops(raw, f.program)


def cut_loops(script: str) -> list[str]:
    """The headers of loops whose range depends on an outer loop (the cut ones)."""
    return [h for h in re.findall(r"for [^\n]*in (?:range|T\.grid)\(([^\n]*)\):", script)
            if "i" in re.sub(r"T\.\w+", "", h).replace("min", "").replace("max", "")]


@pytest.mark.parametrize("name, scalars, lower_cut", [
    ("causal_attention", {}, False),
    ("gqa_causal_attention", {}, False),
    ("softcap_attention", {}, False),
    ("sliding_window_attention", {"window": 9}, True),
    ("prefix_lm_attention", {"prefix": 5}, False),
    ("neighborhood_attention", {"radius": 6}, True),
])
@pytest.mark.parametrize("m, n", [(45, 77), (70, 70), (64, 48)])
def test_masked_rows_loop_over_the_keys_their_mask_keeps_and_agree_with_float64(
        rng, name, scalars, lower_cut, m, n):
    kernel = K.ALL[name]
    f = unfused(kernel)
    dims = {d: v for d, v in dict(B=2, H=2, HKV=1, M=m, N=n, D=16).items()
            if d in kernel.program.dim_names()}
    tensors, given = random_inputs(kernel, dims, rng)
    given.update(scalars)
    raw, bounded = unbounded_and_bounded(f, dims)
    assert bounded is not raw
    script = f.module(**dims).script()     # what the kernel compiles
    assert cut_loops(script), "no loop over the keys depends on the row"
    assert ("T.max(0," in script) == lower_cut     # a lower edge only where the mask has one
    out = np.full((2, 2, m, 16), np.nan, np.float32).astype(tensors["q"].dtype)
    f(**tensors, **given, out=out)
    want = float64_reference(kernel, tensors, given)
    finite = np.isfinite(want)     # rows with no key (prefix-LM's first rows when m > n) are NaN
    assert np.array_equal(np.isfinite(out.astype(np.float32)), finite)
    assert relative_error(out[finite], want[finite]) <= TOLERANCE["bf16"]


@pytest.mark.parametrize("m, n", [(33, 70), (128, 128), (17, 17)])
def test_causal_f32_gives_the_uncut_kernels_bits_with_large_values(rng, monkeypatch, m, n):
    """A skipped key adds exactly the identity (-inf to the max, 0 to the sums), so the cut
    kernel's result is bit for bit the uncut one's; both within f32's tolerance of float64."""
    kernel = attention_kernel("f32", True, False, False)
    dims = dict(B=1, H=3, HKV=3, M=m, N=n, D=32)
    tensors, scalars = random_inputs(kernel, dims, rng)
    tensors = {k: (v * 8).astype(np.float32) for k, v in tensors.items()}   # wide scores
    outs = []
    for cut in (True, False):
        if not cut:
            monkeypatch.setattr(tensorfuse.compiled, "bound_masked_loops", lambda mod, p: mod)
        f = unfused(kernel)
        assert bool(cut_loops(f.module(**dims).script())) == cut
        outs.append(np.full((1, 3, m, 32), np.nan, np.float32))
        f(**tensors, **scalars, out=outs[-1])
    assert np.array_equal(outs[0], outs[1])
    want = float64_reference(kernel, tensors, scalars)
    # a score of magnitude |s| enters exp with an absolute error of about |s|·2⁻²³, which is the
    # weights' relative error: these wide scores (|s| up to ~380) need more than f32's usual.
    # Measured at M = N = 128: at most 0.54 of that over 40 seeds, 0.73 on the worst seen
    scores = np.einsum("bhid,bhjd->bhij", tensors["q"].astype(np.float64),
                       tensors["k"].astype(np.float64)) * scalars["scale"]
    bound = max(TOLERANCE["f32"], 2 * 2.0**-23 * float(np.abs(scores).max()))
    assert relative_error(outs[0], want) <= bound


def test_masks_without_linear_key_bounds_and_unmasked_chains_are_left_whole(rng):
    for kernel, scalars in ((K.document_attention, {}), (K.attention, {}),
                            (K.alibi_attention, {})):
        f = unfused(kernel)
        dims = {d: v for d, v in dict(B=1, H=2, HKV=2, M=20, N=20, D=16).items()
                if d in kernel.program.dim_names()}
        raw, bounded = unbounded_and_bounded(f, dims)
        assert bounded is raw, kernel.name
    assert key_mask(K.attention.program) is None
    assert key_mask(K.document_attention.program) is not None   # a mask, but no linear edge


@tf.kernel
def causal_probabilities(q: T.Tensor["M", "D", "f32"], k: T.Tensor["N", "D", "f32"]):
    """Returns the masked probabilities themselves: an output indexed by the keys."""
    i, j, d = T.axes("i j d")
    s = T.where(i >= j, T.sum(q[i, d] * k[j, d], over=d), -T.inf)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return p / T.sum(p, over=j)


@tf.kernel
def zero_masked_max(q: T.Tensor["M", "D", "f32"], k: T.Tensor["N", "D", "f32"]):
    """Masked scores set to 0, not -inf: a masked element can raise the max, so none is
    skipped."""
    i, j, d = T.axes("i j d")
    s = T.where(i >= j, T.sum(q[i, d] * k[j, d], over=d), 0.0)
    return T.max(s, over=j)


def test_key_indexed_outputs_and_non_identity_masks_keep_every_key(rng):
    assert key_mask(causal_probabilities.program) is None
    assert key_mask(zero_masked_max.program) is None
    f = tf.compile(zero_masked_max, target="llvm")
    tensors, scalars = random_inputs(zero_masked_max, dict(M=40, N=40, D=8), rng)
    q, k = (tensors[n].astype(np.float64) for n in ("q", "k"))
    want = np.where(np.tri(40, dtype=bool), q @ k.T, 0.0).max(1)     # float64, as written
    assert relative_error(f(**tensors), want) <= TOLERANCE["f32"]


def test_reductions_initialised_inside_their_key_loops_keep_them_whole():
    """The naive lowering: each reduction's ``T.init`` runs at its key loop's first iteration,
    which a cut would skip for rows whose mask starts later."""
    kernel = attention_kernel("f32", True, False, False)
    mod = lower_program(kernel.program, (), dict(B=1, H=1, HKV=1, M=32, N=32, D=8))
    assert bound_masked_loops(mod, kernel.program) is mod
