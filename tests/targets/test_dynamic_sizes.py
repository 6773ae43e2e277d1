"""Sizes as kernel arguments (``tf.compile(..., dynamic=)``): symbolic sizes and their guards,
one Triton source for the sizes of a bucket (counted), the boundaries of a bucket, the automatic
default, the code for sm_90a and gfx942, and the numbers through Triton's interpreter."""
import math
import re

import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.dsl.symbolic_sizes import size_arguments, symbolic
from tensorfuse.errors import ScheduleError
from tests.helpers import fresh_seed, run_interpreted

triton = pytest.importorskip("triton", reason="the row template generates Triton kernels")


# -- symbolic sizes ----------------------------------------------------------------------------
def test_a_symbolic_size_computes_text_and_value_and_records_each_decision():
    with symbolic(dict(M=4096, N=5000), {"N"}) as (sizes, guards):
        M, N = sizes["M"], sizes["N"]
        assert M == 4096 and isinstance(M, int)          # not asked to vary: an int
        blocks = math.ceil(N / 1024)
        assert str(blocks) == "((size_N + 1023) // 1024)" and blocks.value == 5
        assert str(N * 1 + 0) == "size_N"                 # identities add no text
        assert f"{2 * N}" == "(2 * size_N)"
        assert N > 4096 and not N % 16 == 0
    said = guards.describe()
    assert said == ["size_N > 4096", "size_N % 16 != 0"]
    assert guards.check(dict(M=1, N=4100)) and not guards.check(dict(M=1, N=4096))
    assert not guards.check(dict(M=1, N=4112))           # a multiple of 16: another class
    assert guards.specialised() == []


def test_leaving_the_symbolic_world_fixes_the_size():
    with symbolic(dict(N=300)) as (sizes, guards):
        assert list(range(sizes["N"]))[-1] == 299         # range() reads the value ...
        assert "%d" % sizes["N"] == "300"
    assert guards.specialised() == ["size_N == 300"]      # ... and fixes it
    assert guards.check(dict(N=300)) and not guards.check(dict(N=301))


def test_a_symbolic_size_used_after_its_build_is_an_error_not_a_wrong_kernel():
    with symbolic(dict(N=300)) as (sizes, _):
        pass
    with pytest.raises(TypeError, match="outlived its build"):
        bool(sizes["N"] > 5)
    with pytest.raises(TypeError):
        sizes["N"] / 2.5   # noqa: B018 - only a rounded division by an int has a meaning


def test_alignment_classes_and_power_of_two_buckets():
    with symbolic(dict(N=5000)) as (sizes, guards):
        assert sizes["N"] % 16 != 0 and sizes["N"] % 8 == 0
        assert sizes["N"].bit_length() == 13
    assert guards.check(dict(N=4104)) and not guards.check(dict(N=4112))   # 8 mod 16
    assert not guards.check(dict(N=8200))                                 # the next bucket
    assert size_arguments(sizes) == ["size_N"]


# -- one source for many sizes ------------------------------------------------------------------
def _sources(kernel, sizes_list) -> set:
    return {kernel.source(**sizes) for sizes in sizes_list}


def test_one_source_serves_every_row_count_and_the_widths_of_a_bucket():
    made = tf.compile(K.softmax, "cuda:sm_90a", dynamic=True)
    rows = [dict(M=m, N=4096) for m in (100, 1000, 7777, 100000)]
    widths = [dict(M=4096, N=n) for n in (2064, 3008, 4000)]   # (2048, 4096], multiples of 16
    assert len(_sources(made, rows)) == 1
    assert len(_sources(made, widths)) == 1
    builds = made.cache_info()
    assert len(builds) == 2, [b.describe() for b in builds]
    assert [len(b.sizes) for b in builds] == [4, 3]
    source = made.source(M=123, N=2500)
    assert "size_N" in source and "2500" not in source and "4096" not in source
    assert re.search(r"def softmax_fused\(x, out_out, size_M, size_N,", source)


@pytest.mark.parametrize("sizes, why", [
    (dict(M=4096, N=4097), "a width past the bucket's block"),
    (dict(M=4096, N=4104), "another alignment class (8 mod 16)"),
    (dict(M=4096, N=2048), "an exact number of blocks (no mask)"),
    (dict(M=1, N=4000), "one row"),
])
def test_a_size_outside_the_bucket_gets_its_own_build(sizes, why):
    made = tf.compile(K.softmax, "cuda:sm_90a", dynamic=True)
    made.source(M=4096, N=4000)
    made.source(**sizes)
    assert len(made.cache_info()) == 2, why
    made.source(M=2000, N=3008)
    first, second = made.cache_info()
    assert first.sizes == [dict(M=4096, N=4000), dict(M=2000, N=3008)]   # still served
    assert second.sizes == [sizes]


def test_the_default_writes_the_first_sizes_exactly_and_a_changing_size_as_an_argument():
    made = tf.compile(K.rmsnorm, "cuda:sm_90a")
    first = made.source(M=4096, N=4096)
    assert "size_" not in first
    assert made.source(M=512, N=4096) != first
    later = made.source(M=640, N=4096)
    assert "size_M" in later and "size_N" not in later   # only the size that changed
    builds = made.cache_info()
    assert [b.exact for b in builds] == [True, False]
    assert "sizes as arguments" in builds[1].describe() and "M=640" in builds[1].describe()
    plan = made.template.describe_plan(M=640, N=4096)   # the plan says which build serves
    assert "built: sizes as arguments" in plan and "size_M" in plan
    assert "built: exact sizes: M=4096, N=4096" in made.template.describe_plan(M=4096, N=4096)


def test_dynamic_false_builds_each_sizes_exactly():
    made = tf.compile(K.softmax, "cuda:sm_90a", dynamic=False)
    assert len(_sources(made, [dict(M=4096, N=n) for n in (3008, 3024, 3040)])) == 3
    assert len(made.cache_info()) == 3 and all(b.exact for b in made.cache_info())


def test_dynamic_takes_only_none_true_or_false():
    with pytest.raises(ScheduleError, match="dynamic must be None, True or False"):
        tf.compile(K.softmax, "cuda:sm_90a", dynamic="yes")


# -- the code -----------------------------------------------------------------------------------
def _global_accesses(ptx: str) -> set:
    return set(re.findall(r"\b(?:ld|st)\.global[\w:.]*", ptx))


@pytest.mark.parametrize("N, ends", [(4096, None), (5000, None), (5004, ".v2.b32"),
                                     (5001, ".b16")])
def test_a_width_as_an_argument_is_read_in_16_byte_vectors(N, ends):
    """Every width class reads 16-byte vectors: rows off 16-byte boundaries through aligned
    windows (targets.triton.row_realign), whose stores at the rows' ends take the class's own
    width (``ends``: the first and last vectors alone where that is one element) and 16-byte
    vectors inside the rows."""
    made = tf.compile(K.softmax, "cuda:sm_90a", dynamic=True)
    accesses = _global_accesses(made.ptx(M=4096, N=N))
    loads = {a for a in accesses if a.startswith("ld.")}
    stores = {a for a in accesses if a.startswith("st.")}
    assert loads and all(a.endswith(".v4.b32") for a in loads), accesses
    wanted = {".v4.b32"} | ({ends} if ends else set())
    assert {"." + a.split(".", 2)[-1] for a in stores} == wanted, accesses


def test_sizes_as_arguments_compile_for_gfx942():
    """The kernel takes its two sizes as arguments (8 more bytes of kernel arguments than the
    one written for 5000 exactly) and still reads 16-byte vectors (5000: alignment class 8)."""
    def amdgcn(dynamic):
        made = tf.compile(K.layernorm, "rocm:gfx942", dynamic=dynamic)
        return made, made.template.compiled(M=3000, N=5000).asm["amdgcn"]

    def kernargs(text):
        return int(re.search(r"\.kernarg_segment_size:\s*(\d+)", text).group(1))

    made, sized = amdgcn(True)
    _, exact = amdgcn(False)
    assert kernargs(sized) == kernargs(exact) + 8
    assert "global_load_dwordx4" in sized
    assert not made.cache_info()[0].exact


# -- the numbers --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def interpreted():
    seed = fresh_seed()
    return seed, run_interpreted("tests.targets.dynamic_sizes_check", seed)


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "cross_entropy",
                                  "log_softmax", "causal_attention", "gqa_attention"])
def test_one_build_runs_every_size_of_its_bucket_correctly(name, interpreted):
    from tensorfuse.kernels.reference import TOLERANCE

    seed, found = interpreted
    tol = TOLERANCE[K.ALL[name].program.outputs[0].dtypes[0]]
    assert found[name]["error"] <= tol, f"{name}: {found[name]} (TENSORFUSE_SEED={seed})"
    assert found[name]["builds"] == 1 < found[name]["calls"], found[name]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "layernorm", "cross_entropy"])
def test_sizes_as_arguments_on_the_gpu_match_float64_at_every_size(name):
    """One compiled kernel at ragged widths and row counts of several buckets and alignment
    classes, twice each (the second call takes the fast path with the sizes it fixed), and once
    into a poisoned ``out=``."""
    import numpy as np
    import torch

    from tensorfuse.kernels.reference import TOLERANCE, random_inputs, reference

    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    kernel = K.ALL[name]
    made = tf.compile(kernel, "cuda", dynamic=True)
    rng = np.random.default_rng(fresh_seed())
    tol = TOLERANCE[kernel.program.outputs[0].dtypes[0]]
    sizes_list = ((4096, 5000), (4000, 5016), (1000, 4104), (77, 3001), (4096, 65536), (3, 300),
                  (513, 4096))
    for m, n in sizes_list:
        sizes = {"M": m, "N": n, "V": n}
        tensors, scalars = random_inputs(kernel, sizes, rng)
        on_gpu = {k: torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).cuda()
                  if x.dtype.name == "bfloat16" else torch.from_numpy(x).cuda()
                  for k, x in tensors.items()}
        want = reference(kernel, tensors, scalars)
        for _ in range(2):
            out = made(**on_gpu, **scalars)
            error = float(np.abs(out.float().cpu().numpy() - want).max() / np.abs(want).max())
            assert error <= tol, (name, m, n, error)
        poisoned = torch.full_like(out, float("nan"))
        made(**on_gpu, **scalars, out=poisoned)
        assert torch.equal(poisoned, out), (name, m, n)
    builds = made.cache_info()
    assert not any(b.exact for b in builds)
    assert len(builds) < len(sizes_list) and len(builds[0].sizes) >= 2   # 5000 and 5016 share


def test_a_parameter_named_like_a_size_argument_is_named_otherwise_and_the_size_is_one_too():
    """``size_N`` is the name of N's argument: tf.compile names the scalar otherwise in the
    generated kernel (``renamed_params``), and N is an argument as M is."""
    from tensorfuse import dsl as T

    @tf.kernel
    def scaled(x: T.Tensor["M", "N", "f32"], size_N: T.f32):
        i, j = T.axes("i j")
        return T.sum(x[i, j] * size_N, over=j)

    made = tf.compile(scaled, "cuda:sm_90a", dynamic=True)
    source = made.source(M=64, N=300)
    assert "size_M" in source and "tl.load" in source
    assert re.search(r"def scaled_fused\(x, arg_size_N, out_\w+, size_M, size_N,", source), \
        source[:600]


def test_every_kind_of_compiled_kernel_lists_its_builds():
    """cache_info() on the composed kernels: a staged program lists its stage kernels' builds,
    a program swept over two axes as one its flat kernels', a TVM-built kernel one exact build
    per sizes."""
    import warnings

    import numpy as np

    from benchmarks.user_kernels import group_norm, max_pool_l2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        staged = tf.compile(max_pool_l2, "cuda:sm_90a")
    staged.schedule_origin(B=4, S=512, D=1024)
    assert len(staged.cache_info()) == 2 and all(b.exact for b in staged.cache_info())
    flat = tf.compile(group_norm, "cuda:sm_90a")
    sizes = dict(B=2, G=4, C=8, P=256)
    flat.schedule_origin(**{d: v for d, v in sizes.items() if d in flat.program.dim_names()})
    assert len(flat.cache_info()) == 1
    import torch

    cpu = tf.compile(K.softmax, "llvm", template=None)
    for n in (30, 40):
        cpu(torch.from_numpy(np.random.rand(3, n).astype("float32")).to(torch.bfloat16))
    assert [b.sizes for b in cpu.cache_info()] == [[dict(M=3, N=30)], [dict(M=3, N=40)]]


def test_a_difference_of_sizes_is_divided_only_where_it_is_not_negative():
    """Triton's // truncates where Python's floors: a dividend that may be negative (N - M) is
    guarded to be non-negative, and a build where it is negative is refused (exact sizes)."""
    with symbolic(dict(M=100, N=300)) as (sizes, guards):
        assert str((sizes["N"] - sizes["M"]) // 64) == "((size_N - size_M) // 64)"
        assert str(sizes["N"] // 64) == "(size_N // 64)"
    assert guards.describe() == ["size_N - size_M >= 0"]   # a size alone needs no guard
    assert not guards.check(dict(M=300, N=100))
    with symbolic(dict(M=300, N=100)) as (sizes, _):
        with pytest.raises(TypeError, match="truncates"):
            (sizes["N"] - sizes["M"]) // 64   # noqa: B018
