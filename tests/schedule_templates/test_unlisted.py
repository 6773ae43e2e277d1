"""Kernels no issue lists (``benchmarks.unlisted_kernels``): their numbers against float64 in
Triton's interpreter, as ``tf.compile`` makes them for sm_90a (the checks and cases:
:mod:`tests.schedule_templates.unlisted_check`)."""
import pytest

from tests.helpers import needs_nvcc

from tests.schedule_templates.unlisted_check import CASES


def test_unlisted_kernels_match_float64_in_the_triton_interpreter():
    from tests.helpers import check_interpreted

    check_interpreted("tests.schedule_templates.unlisted_check", CASES)


def test_a_mean_over_compiled_in_sizes_compiles_for_sm90a():
    """``T.mean``'s count is sizes the Triton kernel has compiled in (Python ints): folded to one
    literal (16 · 45) and cast to float32 as a scalar of that type, not ``int.to`` (which Triton
    cannot compile)."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    import tensorfuse as tf
    from tests.schedule_templates.unlisted_check import layernorm_with_mean, mean_over_two_axes

    kernel = tf.compile(layernorm_with_mean, target="cuda:sm_90a").for_sizes(R=333, D=300)
    assert "tl.full((), 300, tl.float32)" in kernel.source(R=333, D=300)
    assert "ld.global" in kernel.ptx(R=333, D=300)
    kernel = tf.compile(mean_over_two_axes, target="cuda:sm_90a").for_sizes(B=5, P=45)
    assert "tl.full((), 720, tl.float32)" in kernel.source(B=5, P=45)
    assert "ld.global" in kernel.ptx(B=5, P=45)


def test_a_count_under_a_mask_compiles_for_sm90a():
    """A count of the tokens a mask keeps (a cross-entropy's mean over the tokens not ignored):
    in the blocks the mask keeps whole it is the block's columns, not a ``tl.sum`` of a scalar
    (which Triton refused to compile)."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    import tensorfuse as tf
    from tests.schedule_templates.unlisted_check import cross_entropy_ignored

    made = tf.compile(cross_entropy_ignored, target="cuda:sm_90a")
    for sizes in (dict(M=333, V=300), dict(M=8192, V=32000)):
        assert "ld.global" in made.ptx(**sizes)


def test_pipeline_kernels_match_float64_in_the_triton_interpreter():
    """``benchmarks.pipeline_kernels`` (:mod:`tests.schedule_templates.pipeline_check`): chains
    of dependent reductions over a vocabulary, sigmoid attention, group scaling and pools."""
    from tests.helpers import check_interpreted
    from tests.schedule_templates.pipeline_check import CASES as PIPELINE

    check_interpreted("tests.schedule_templates.pipeline_check", PIPELINE)


def test_sigmoid_attention_is_planned_as_attention_with_its_values_features_held_whole():
    """One member, ``Σ_j sigmoid(s) · v[j, e]``: every axis of it is common to the chain, yet
    ``e`` is the values' feature (read beside the swept axis, not by the score), so the plan
    tiles the query rows and computes ``p·v`` on the tensor cores — as softmax attention's —
    rather than a program per query row and ``e`` block (38.9 ms against torch.compile's 1.14
    on the H200 at B2 H16 S4096 D128)."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    import tensorfuse as tf
    from benchmarks.pipeline_kernels import sigmoid_attention

    made = tf.compile(sigmoid_attention, target="cuda:sm_90a")
    plan = made.describe_plan(B=2, H=16, S=4096, D=128)
    assert "grid: b=2, h=16 × rows i (4096)" in plan and "feature held whole: 128" in plan, plan
    assert "v[b, h, j, e] on tensor cores" in plan, plan
    source = made.source(B=2, H=16, S=4096, D=128)
    assert source.count("tl.dot(") == 2, source


def test_a_mask_around_the_whole_weighted_product_is_attention_on_the_tensor_cores():
    """RetNet's retention, ``Σ_j where(j <= i, s · γ^(i−j) · v[j, e], 0)``: the mask written
    around the product splits with its weights (``where(j <= i, s · γ^(i−j), 0) · v``), so the
    plan is attention's — one kernel, both products on the tensor cores (``wgmma`` for sm_90a)
    — not the scores stored (2 GiB at B2 H16 S4096) and ``p·v`` a pair at a time on the CUDA
    cores."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    import tensorfuse as tf
    from benchmarks.pipeline_kernels import retention

    dims = dict(B=2, H=16, S=4096, D=128)
    made = tf.compile(retention, target="cuda:sm_90a")
    plan = made.describe_plan(**dims)
    assert plan.startswith("retention at B=2, H=16, S=4096, D=128: attention template"), plan
    assert "as where(j <= i, s * gamma[h] ** (i - j).astype('f32'), 0.0) · v[b, h, j, e] on " \
        "tensor cores" in plan, plan
    # q·k and p·v in each of the two sweeps: the blocks the mask cuts, then the whole ones
    assert made.source(**dims).count("tl.dot(") == 4
    assert "wgmma.mma_async" in made.for_sizes(**dims).ptx(**dims)


def test_weights_gathered_by_each_tokens_expert_are_gemm_tiles_grouped_by_expert():
    """A mixture of experts' layer written per token, ``Σ_k x[t, k] · w[expert[t], n, k]`` in
    f32: the weights read the rows through the gather, so it was no GEMM and ran as a row
    kernel a token and output at a time, every weight row read again for each token (T·N·K·2
    bytes: 128 GiB at T8192 K2048 N4096). Planned as GEMM tiles whose rows are taken one expert
    at a time, the widening casts dropped (bf16 products are exact in f32), ``wgmma`` for
    sm_90a."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    import tensorfuse as tf
    from benchmarks.pipeline_kernels import expert_linear

    dims = dict(T=8192, K=2048, N=4096, E=8)
    made = tf.compile(expert_linear, target="cuda:sm_90a")
    plan = made.describe_plan(**dims)
    assert "contraction template (GEMM tiles: rows t, columns n, contracted k)" in plan, plan
    assert "out_sum = Σ_k (x[t, k]) · (w[group, n, k])  [tensor cores in bf16" in plan, plan
    assert "rows grouped by expert[t] (read as group)" in plan, plan
    source = made.source(**dims)
    assert "while _group < 8:" in source and \
        "tl.where(_rows_in_group, _part_0, acc_0)" in source
    assert "wgmma.mma_async" in made.for_sizes(**dims).ptx(**dims)


@needs_nvcc
def test_cosine_attention_stores_its_norms_not_its_scores_and_runs_attention_on_wgmma():
    """``q·k / (|q| |k|)``: the norms over the head dim cannot stay in attention's pass, so the
    floor stores them (the user's ``sqrt``s, a float a row) and the rest is one attention kernel
    — not the q·k products as a stage of their own, which stored every score (2 GiB at B2 H16
    S4096)."""
    import tensorfuse as tf
    from benchmarks.pipeline_kernels import cosine_attention

    dims = dict(B=2, H=16, S=4096, D=128)
    made = tf.compile(cosine_attention, target="cuda:sm_90a")
    plan = made.describe_plan(**dims)
    assert plan.splitlines()[0] == "stored between the stages: 1.0 MiB " \
        "(nq f32 [2, 16, 4096], nk f32 [2, 16, 4096])", plan
    assert "[3] out from q, k, v, tau, nq, nk" in plan, plan
    assert "cosine_attention_out at B=2, H=16, S=4096, D=128: hopper_attention" in plan, plan
    assert "sqrt" not in plan.split("[3]")[1], plan   # each score reads the norms stored
    assert "wgmma.mma_async" in made.kernels[2].ptx(**dims, tau=10.0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["retention", "expert_linear_sorted",
                                  "expert_linear_unsorted", "soft_argmax"])
def test_pipeline_kernels_match_float64_on_the_gpu(name):
    """RetNet's retention (the mask around the product), the mixture of experts' layer (rows
    grouped by expert, sorted and not) and the soft-argmax (nested sums merged) through
    ``tf.compile`` on the GPU, outputs poisoned (bf16: 2e-2; f32: 1e-5)."""
    import torch

    from tests.helpers import gpu_error
    from tests.schedule_templates.pipeline_check import CASES as PIPELINE

    error, dtype, seed = gpu_error(*PIPELINE[name])
    assert error < (2e-2 if dtype == torch.bfloat16 else 1e-5), f"{name} (seed {seed})"


@pytest.mark.gpu
def test_weighted_sums_without_a_softmax_on_the_gpu_against_float64():
    """Sigmoid attention and causal squared-ReLU attention through ``tf.compile`` on the GPU (the
    attention plan: query rows in tiles, the values' feature held whole), ragged sequence
    lengths, large score ranges, outputs poisoned, against float64 (bf16: 2e-2)."""
    import torch

    import tensorfuse as tf
    from benchmarks.pipeline_kernels import relu2_causal_attention, sigmoid_attention
    from tests.helpers import fresh_seed, relative_error

    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    B, H, S, D = 2, 3, 777, 128
    q, k, v = ((torch.randn(B, H, S, D, generator=g) * 2).bfloat16().cuda() for _ in range(3))
    s = q.double() @ k.double().transpose(-1, -2) * 0.125
    r = torch.relu(s)
    causal = torch.ones(S, S, dtype=torch.bool, device="cuda").tril()
    for kernel, args, want in (
            (sigmoid_attention, (0.125, -3.0), torch.sigmoid(s - 3.0) @ v.double()),
            (relu2_causal_attention, (0.125,), torch.where(causal, r * r, 0.0) @ v.double())):
        out = torch.full((B, H, S, D), float("nan"), dtype=torch.bfloat16, device="cuda")
        tf.compile(kernel)(q, k, v, *args, out=out)
        assert relative_error(out, want) < 2e-2, (kernel.program.name, seed)
