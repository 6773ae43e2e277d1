"""Every library kernel matches its float64 NumPy reference on the CPU target, on fresh random
inputs, with outputs poisoned (NaN) before the run."""
import numpy as np
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.dsl import dtypes as dt
from tensorfuse.kernels.reference import TOLERANCE, random_inputs, reference, relative_error

SIZES = {
    "attention": dict(B=2, H=4, M=29, N=29, D=16),
    "rows": dict(M=5, N=333, V=333),
    "ffn": dict(M=9, K=24, N=40, O=20),
}


def sizes_for(name, table=SIZES):
    """Sizes for a library kernel from a table of attention/rows/ffn sizes (GQA: 2 heads a group)."""
    if name in K.ATTENTION_VARIANTS:
        s = dict(table["attention"])
        if name.startswith("gqa"):
            s.update(HKV=s["H"] // 2)
        return s
    return dict(table["rows" if name in K.ROW_KERNELS else "ffn"])


def poisoned_outputs(kernel, sizes):
    outs = []
    for c in kernel.program.outputs:
        shape = tuple(a.extent if isinstance(a.extent, int) else sizes[a.extent] for a in c.axes)
        fill = np.nan if dt.is_float(c.dtypes[0]) else -12345
        outs.append(np.full(shape, fill).astype(dt.to_numpy(c.dtypes[0])))
    return outs


@pytest.mark.parametrize("name", sorted(K.ALL))
def test_library_kernel_matches_reference(name, rng):
    kernel = K.ALL[name]
    sizes = sizes_for(name)
    tensors, scalars = random_inputs(kernel, sizes, rng)
    (out,) = poisoned_outputs(kernel, sizes)
    tf.compile(kernel, target="llvm")(**tensors, **scalars, out=out)
    err = relative_error(out, reference(kernel, tensors, scalars))
    assert err <= TOLERANCE[kernel.program.outputs[0].dtypes[0]], f"{name}: error {err:.3e}"


def test_decode_shape_uses_bottom_right_alignment(rng):
    sizes = dict(B=2, H=2, M=1, N=40, D=8)
    tensors, scalars = random_inputs(K.causal_attention, sizes, rng)
    out = tf.compile(K.causal_attention, "llvm")(**tensors, **scalars)
    full = reference(K.attention, tensors, scalars)  # one query at the end sees every key
    assert relative_error(out, full) <= TOLERANCE["bf16"]
