"""``tools/precompile_cubins.py kernel``: the CUDA C++ sources a GPU job will load, found on a
machine without a GPU — those ``tf.compile`` launches, every stage of a staged program."""
import importlib.util
import os
import warnings

import tensorfuse as tf
from tensorfuse.errors import NoTemplateWarning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    spec = importlib.util.spec_from_file_location(
        "precompile_cubins", os.path.join(ROOT, "tools", "precompile_cubins.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kernel_mode_finds_the_sources_tf_compile_launches():
    """A GEMM: the Hopper GEMM's one source, as ``tf.compile`` makes it; cosine similarities
    (staged: two row kernels, then a GEMM with an epilogue): only the GEMM stage is CUDA C++ (the
    Triton row kernels build on the GPU)."""
    tool = _tool()
    sizes = dict(M=1024, K=512, N=768)
    found = tool.precompile_kernel("tensorfuse.kernels:matmul",
                                   [f"{n}={v}" for n, v in sizes.items()])
    made = tf.compile(tf.kernels.matmul, target="cuda").for_sizes(**sizes)
    assert [source for source, _ in found] == [made.source(**sizes)]
    assert all(target.arch == "sm_90a" for _, target in found)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        found = tool.precompile_kernel(os.path.join(ROOT, "benchmarks", "unlisted_kernels.py") +
                                       ":cosine_similarity", ["M=256", "N=512", "D=128"])
    assert len(found) == 1 and "tf_hopper_gemm" in found[0][0]


def test_the_kernel_mode_finds_a_packed_decodes_source():
    """A decode of 64 heads on one cache, 16 pairs: ``tf.compile`` runs packed rows (a route made
    at its first call, its inner Hopper attention kernel at the packed sizes) — that source."""
    tool = _tool()
    sizes = dict(B=16, H=64, HKV=1, M=1, N=16384, D=128)
    found = tool.precompile_kernel("tensorfuse.kernels:gqa_attention",
                                   [f"{n}={v}" for n, v in sizes.items()])
    made = tf.compile(tf.kernels.gqa_attention, target="cuda:sm_90a")
    assert made.schedule_origin(**sizes).startswith("packed group rows")
    assert [source for source, _ in found] == [made.source(**sizes)]
    assert "tf_hopper_attention" in found[0][0]
