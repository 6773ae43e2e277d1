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


def test_the_training_mode_finds_the_forward_saving_its_log_sum_exp_and_the_backward():
    """Grouped causal attention on ``[B, S, H, D]`` tensors: the forward autograd records (the
    Hopper template writing each row's log-sum-exp) and the sm_90a backward — the source the
    backward template autograd picks at these sizes makes."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.hopper_attention_backward import backward_template
    from tensorfuse.targets import get_target
    from benchmarks.user_kernels import bshd_gqa_causal

    tool = _tool()
    sizes = dict(B=2, M=333, N=333, H=8, HKV=2, D=128)
    found = tool.precompile_training(os.path.join(ROOT, "benchmarks", "user_kernels.py") +
                                     ":bshd_gqa_causal", [f"{n}={v}" for n, v in sizes.items()])
    target = get_target("cuda:sm_90a")
    made = backward_template(bshd_gqa_causal.program, choose(bshd_gqa_causal.program,
                                                             target)[1], sizes, target)
    assert [source for source, _ in found[1:]] == [made.source]
    assert "tf_hopper_attention_backward" in made.source
    forward = found[0][0]
    assert "tf_hopper_attention(" in forward and forward != made.source
    assert forward != tool.precompile_kernel(os.path.join(ROOT, "benchmarks", "user_kernels.py") +
                                             ":bshd_gqa_causal",
                                             [f"{n}={v}" for n, v in sizes.items()])[0][0]
