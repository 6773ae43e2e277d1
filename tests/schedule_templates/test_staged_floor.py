"""The floor under the templates: a program no template takes whole runs as stage kernels, each
with a template where one takes it (``schedule_templates/stages.py``, ``tensorfuse/staged.py``),
checked against float64 on the CPU target, under Triton's interpreter and on the GPU."""
import warnings

import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.api import AutoKernel, _staged
from tensorfuse.errors import CallError, NoTemplateWarning
from tensorfuse.flat_kernel import FlatSweepKernel
from tensorfuse.schedule_templates.auto import choose, takes_stage
from tensorfuse.schedule_templates.stages import NotStageable, plan_stages
from tensorfuse.staged import StagedKernel
from tensorfuse.targets import get_target
from benchmarks.unlisted_kernels import latent_attention_decode
from benchmarks.unlisted_kernels import mean_nearest_distance
from benchmarks.user_kernels import group_norm, max_pool_l2, paged_decode
from tests.helpers import fresh_seed, gpu_case, relative_error, run_interpreted
from tests.schedule_templates.staged_floor import (CASES, INTERPRETED, STAGED, WIDE,
                                                   group_norm_nested, latent_attention,
                                                   max_pool_l2_case)

HOPPER = get_target("cuda:sm_90a")


def stages_of(kernel):
    return plan_stages(kernel.program, lambda sub: takes_stage(sub, HOPPER))


def test_a_pooled_norm_is_cut_after_the_pool_and_each_half_gets_the_row_template():
    """max over tokens, then an L2 norm of the pooled features: the norm needs the whole max."""
    stages = stages_of(max_pool_l2)
    assert [s.produces[-1] for s in stages] == ["pooled", "out"], [s.describe() for s in stages]
    assert [choose(s.program, HOPPER)[0] for s in stages] == ["row_reduction"] * 2
    assert all(s.templated for s in stages)
    # the pooled features are stored between them, as the reduction's own dtype
    assert [p.name for p in stages[1].program.tensor_params] == ["pooled"]


def test_nested_sums_are_cut_where_one_reads_anothers_final_value():
    stages = stages_of(group_norm_nested)
    assert len(stages) == 5, [s.describe() for s in stages]
    assert stages[-1].produces == ("out",)
    # the sums on the row template, the normalising pass on the elementwise template
    assert [choose(s.program, HOPPER) is not None for s in stages] == [True] * 4 + [False]
    assert [s.templated for s in stages] == [True] * 5


def test_a_chain_over_three_axes_is_cut_after_the_longest_part_a_template_takes():
    """Distances over c, their minimum over j, its mean over i: the contraction template takes
    the distances with their minimum in one pass, so the first stage stores only the minima —
    cut by groups of one axis, it stored every pair's distance (512 MiB at B8 4096 × 4096)."""
    stages = stages_of(mean_nearest_distance)
    assert [s.produces for s in stages] == [("out_min",), ("out",)], \
        [s.describe() for s in stages]
    assert all(s.templated for s in stages) and \
        [c.name for c in stages[0].program.computes] == ["d2", "out_min"]
    assert [p.name for p in stages[1].program.tensor_params] == ["out_min"]


def test_programs_a_template_takes_whole_or_whose_stages_none_takes_are_not_staged():
    for whole in (K.softmax, K.attention):
        with pytest.raises(NotStageable):
            stages_of(whole)
    # sums over two axes at once: swept as one axis by the row template, not staged
    made = tf.compile(group_norm, target="cuda:sm_90a")
    assert isinstance(made, FlatSweepKernel)


def test_tf_compile_says_once_that_it_runs_stages_and_schedule_origin_says_which():
    with pytest.warns(NoTemplateWarning, match="runs as 2 kernels"):
        made = tf.compile(max_pool_l2, target="cuda:sm_90a")
    assert isinstance(made, StagedKernel)
    origin = made.schedule_origin(B=4, S=512, D=1024)
    assert origin.startswith("staged: 2 kernels") and "no template takes max_pool_l2 whole" in \
        origin and origin.count("template defaults") == 2, origin


def test_a_row_output_over_an_axis_no_tile_holds_is_refused_by_the_row_template():
    """The last stage of the nested group norm sums over c and writes out over c and p: the
    row-tile plan must refuse it (it used to accept it and fail generating the store)."""
    last = stages_of(group_norm_nested)[-1]
    assert choose(last.program, HOPPER) is None


@pytest.mark.parametrize("name", list(CASES))
def test_staged_kernels_match_float64_on_the_cpu_target(name):
    """Each stage compiled for the CPU, cut as for sm_90a: the cuts themselves are checked (the
    segment mean, which a template takes whole, through tf.compile's CPU kernel)."""
    kernel, case = CASES[name]
    seed = fresh_seed()
    args, want = case(torch.Generator().manual_seed(seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = _staged(kernel, get_target("cpu"), "checked", planned_for=HOPPER)
    assert isinstance(made, StagedKernel) == (name in STAGED), (name, made)
    made = made or tf.compile(kernel, target="cpu")
    assert relative_error(made(**args), want) < 2e-2, seed   # bf16 outputs


def test_a_staged_kernel_fills_out_and_checks_the_whole_call():
    args, want = max_pool_l2_case(torch.Generator().manual_seed(fresh_seed()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = _staged(max_pool_l2, get_target("cpu"), "checked", planned_for=HOPPER)
    out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16)
    last, given = made.kernels[-1], []
    real = last.invoke

    def invoke(key, args_, kwargs):   # what the output's stage is handed
        given.append(kwargs.get("out"))
        return real(key, args_, kwargs)
    last.invoke = invoke
    assert made(**args, out=out) is out
    assert relative_error(out, want) < 2e-2
    # the stage that makes the output alone writes the caller's array itself, not a copy of
    # its own result afterwards
    assert given == [out]
    with pytest.raises(CallError, match="x"):
        made(args["x"][0])


def test_a_staged_fast_call_hands_the_callers_out_to_the_stage_that_writes_it():
    """A wrapper that gives its inner kernel out= arrays (a memory-order route: the outputs laid
    out as the input) keeps the stages' fast calls: the output's stage gets the caller's array,
    the others their own results; a stage that leaves its call to the checked path leaves the
    whole call to it."""
    from tensorfuse.staged import StagedFastCall

    args, want = max_pool_l2_case(torch.Generator().manual_seed(fresh_seed()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = _staged(max_pool_l2, get_target("cpu"), "checked", planned_for=HOPPER)
    given = []

    def stage_call(k, declines=False):
        def call(args_, kwargs):
            given.append((k, kwargs.get("out")))
            if declines:
                return None
            if "out" in kwargs:
                return kwargs["out"]
            made_ = tuple(torch.zeros(1) for _ in made.stages[k].produces)
            return made_[0] if len(made_) == 1 else made_
        return call
    last = len(made.stages) - 1
    fast = StagedFastCall(made, [stage_call(k) for k in range(len(made.stages))])
    out = torch.empty(want.shape, dtype=torch.bfloat16)
    assert fast((), {**args, "out": out}) is out
    assert given[-1] == (last, out) and all(o is None for _, o in given[:-1]), given
    given.clear()
    fast((), dict(args))   # without out=: every stage makes its own results
    assert [k for k, _ in given] == list(range(len(made.stages))) and \
        all(o is None for _, o in given), given
    declined = StagedFastCall(made, [stage_call(k, declines=k == last)
                                     for k in range(len(made.stages))])
    assert declined((), {**args, "out": out}) is None


def test_an_output_over_the_swept_axis_and_a_feature_is_refused_by_the_row_tiles():
    """Attention pooling's gradient of the tokens, ``d_x[b, t, e]`` beside the sums over ``t``:
    the tiles store along the sweep or across the features, not both. The attention template
    planned it as a feature output and failed building the source (a KeyError on ``t``); it
    refuses it now with the reason, and the floor cuts it apart."""
    from tests.schedule_templates.user_written_extra_check import attention_pool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = tf.compile(tf.grad(attention_pool), "cuda:sm_90a")
        origin = made.schedule_origin(B=4, T=300, D=64)   # builds the sources: the KeyError
    assert origin.startswith("staged"), origin


def test_outputs_over_different_axes_are_a_stage_each_on_the_elementwise_template():
    """The gradient of a dot of x's rows with y's columns: d_x over (i, j), d_y over (j, i) —
    no template writes both in one pass, and they ran on TVM's default schedule; now a stage
    each, each the elementwise template's (their numbers: ``user_gradients_check``)."""
    from tests.schedule_templates.user_written_extra_check import transposed_dot

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        origin = tf.compile(tf.grad(transposed_dot), "cuda:sm_90a").schedule_origin(M=300, N=200)
    assert "[1] d_x from y, d_out: elementwise template" in origin, origin
    assert "[2] d_y from x, d_out: elementwise template" in origin, origin


def test_stage_templates_match_float64_in_the_interpreter():
    seed = fresh_seed()
    errors = run_interpreted("tests.schedule_templates.staged_floor", seed)
    assert set(errors) == set(INTERPRETED), errors
    assert max(errors.values()) < 2e-2, (errors, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_staged_and_gathering_kernels_match_float64_on_the_gpu(name):
    kernel, case = CASES[name]
    args, want, seed = gpu_case(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        # the paged decode staged, as the floor runs it (tf.compile sweeps its pages as one axis)
        made = _staged(kernel, get_target("cuda"), "checked") if name in STAGED else \
            tf.compile(kernel)
    assert isinstance(made, StagedKernel if name in STAGED else AutoKernel), made
    assert relative_error(made(**args), want) < 2e-2, seed


@pytest.mark.gpu
def test_a_staged_memory_order_route_repeats_on_the_fast_path():
    """A group norm passed channels last runs the program in that order, whose kernel is two
    stages: the route gives them its outputs, and repeated calls take the fast path (the
    checked path cost 57 µs of host time a call against a 101 µs kernel on the H100:
    ``probe`` of ``benchmarks.layout_kernels``' group_norm_passed_channels_last)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    B, G, C, P = 2, 4, 8, 1000
    gen = torch.Generator(device="cuda").manual_seed(fresh_seed())
    x = (torch.randn(B, P, G, C, device="cuda", generator=gen) * 3 + 1).to(torch.bfloat16)
    w = (torch.rand(G, C, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
    bias = torch.randn(G, C, device="cuda", generator=gen).to(torch.bfloat16)
    view = x.permute(0, 2, 3, 1)                     # [B, G, C, P], channels last in memory
    xd = view.double()
    mean = xd.mean(dim=(2, 3), keepdim=True)
    var = ((xd - mean) ** 2).mean(dim=(2, 3), keepdim=True)
    want = (xd - mean) / torch.sqrt(var + 1e-5) * w.double()[..., None] + bias.double()[..., None]
    made = tf.compile(group_norm)
    for _ in range(4):
        assert relative_error(made(view, w, bias, 1e-5), want) < 2e-2
    routed = next(iter(made.routes._kernels.values()))
    assert isinstance(routed.inner, StagedKernel), routed.inner
    assert sum(f.calls for f in routed._fast.values()) >= 2, routed._fast


@pytest.mark.gpu
def test_a_latent_decode_whose_stages_run_on_the_hopper_gemm_matches_float64_on_the_gpu():
    """Heads as the GEMMs' rows (q[b, h, d]): both products run on the Hopper GEMM, the second
    with its division in the epilogue and the cast to bf16 left to the store (a cast there
    rounds; converted to an integer, every output would be 0 or ±1)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    B, H, N, DQ, DV = 2, 128, 600, 1152, 1024   # past the row tile's chunks
    gen = torch.Generator(device="cuda").manual_seed(fresh_seed())
    q, k, v = (torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16) * scale
               for shape, scale in (((B, H, DQ), 1), ((B, N, DQ), 1), ((B, N, DV), 4)))
    s = torch.einsum("bhd,bnd->bhn", q.double(), k.double()) * DQ ** -0.5
    want = torch.einsum("bhn,bne->bhe", torch.softmax(s, -1), v.double())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = tf.compile(latent_attention_decode)
        plan = made.describe_plan(scale=0.1, B=B, H=H, N=N, DQ=DQ, DV=DV)
        assert plan.count("hopper GEMM plan") == 2, plan
        out = torch.full((B, H, DV), float("nan"), device="cuda", dtype=torch.bfloat16)
        made(q, k, v, DQ ** -0.5, out=out)
        first = made(q, k, v, DQ ** -0.5)
        again = made(q, k, v, DQ ** -0.5)   # the stages' fast calls, in turn
    assert relative_error(out, want) < 2e-2
    assert made._fast and torch.equal(first, again) and torch.equal(first, out)


def test_a_row_kernel_with_more_batch_entries_than_a_grid_row_puts_them_first():
    """The paged decode's score stage, staged (it runs swept as one axis otherwise), has
    B·H·pages = 131,072 batch entries: past CUDA's 65,535 on a grid's second dimension (the
    launch failed with 'invalid argument'), so they go first."""
    from tensorfuse.targets.triton.row_grid import MAX_GRID_YZ, launch_grid

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = _staged(paged_decode, HOPPER, "checked")
    scores = made.kernels[0].template
    sizes = dict(B=8, H=32, HKV=8, D=128, PAGES=4096, PAGE=64, NP=512)
    own = {n: v for n, v in sizes.items() if n in made.stages[0].program.dim_names()}
    lines = scores.source(**own).splitlines()
    assert "    pid_b = tl.program_id(0)" in lines and "    pid_m = tl.program_id(1)" in lines
    plan, knobs, *_ = scores.build(**own)
    assert launch_grid(plan, knobs)[0] == 8 * 32 * 512 > MAX_GRID_YZ


def test_sizes_a_template_does_not_fit_run_as_templated_stages_said_once():
    """Head dims of 1152 / 1024 are past the row-tile template's chunks: those sizes run as
    the floor's stages cut at them — the scores and p·v on the contraction template, the
    softmax's statistics on the row template, none on TVM's default schedule —, which
    ``schedule_origin()`` names, and a NoTemplateWarning says so once per kernel, with the
    template's reason; sizes the template fits keep it, unwarned."""
    made = tf.compile(latent_attention, target="cuda:sm_90a")
    wide = dict(B=2, H=16, M=1, N=4096, DQ=1152, DV=1024)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        origin = made.schedule_origin(**wide)
        assert made.schedule_origin(**{**wide, "N": 2048}).startswith("staged: 3 kernels")
        assert made.schedule_origin(**{**wide, "DQ": 128, "DV": 128}) == "template defaults"
    assert origin.startswith("staged: 3 kernels") and "TVM" not in origin, origin
    plan = made.describe_plan(scale=0.04, **wide)
    assert "\nstored between the stages: 512.2 KiB (s_sum f32 [2, 16, 1, 4096], m f32 [2, 16, 1]" \
        in plan, plan
    staged = made.for_sizes(**wide)
    assert sum(b for *_, b in staged.stored(**wide)) == 4 * (2 * 16 * 4096 + 2 * 2 * 16)
    assert [ln.split(": ", 1)[1].split(" (")[0] for ln in plan.splitlines()
            if ln.startswith("latent_attention_")] == \
        ["contraction template", "row-reduction template", "contraction template"], plan
    said = [w for w in caught if issubclass(w.category, NoTemplateWarning)]
    assert len(said) == 1 and "1152" in str(said[0].message), [str(w.message) for w in said]


def test_chains_past_the_row_tile_are_cut_at_the_calls_sizes_and_match_float64_on_the_cpu():
    """The floor cut at sizes where the row tile does not hold the feature axis: every stage on
    a template of sm_90a (the chain whole at small sizes, so not cut without the sizes), each
    stage compiled for the CPU against float64."""
    seed = fresh_seed()
    for name, (kernel, case, sizes) in WIDE.items():
        args, want = case(torch.Generator().manual_seed(seed))
        with pytest.raises(NotStageable):
            stages_of(kernel)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NoTemplateWarning)
            made = _staged(kernel, get_target("cpu"), "checked", planned_for=HOPPER,
                           sizes=sizes)
        assert isinstance(made, StagedKernel) and all(s.templated for s in made.stages), made
        assert relative_error(made(**args), want) < 2e-2, (name, seed)



def test_a_group_norms_backward_runs_its_main_pass_swept_over_two_axes_as_one():
    """tf.grad of the group norm: its statistics and input gradient sum over (c, p) together, its
    weight and bias gradients over (b, p). No template takes it whole; its two stages are the
    row template's, each swept over two axes as one: the statistics stored as the mean and the
    variance the user wrote (a float a group), the rest fused once they are stored — where it
    used to run whole on TVM's untiled default, then in three stages, one of them untiled."""
    from tensorfuse.schedule_templates.auto import templated_stages

    backward = tf.grad(group_norm)
    stages = templated_stages(backward.program, HOPPER)
    assert [(s.describe(), s.templated) for s in stages] == [
        ("mean, var, d_x from x, w, eps, d_out", True),
        ("d_w, d_bias from x, eps, d_out, mean, var", True)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = tf.compile(backward, target="cuda:sm_90a")
    assert isinstance(made, StagedKernel)
    assert isinstance(made.kernels[0], FlatSweepKernel)


@tf.kernel
def group_means(x: T.Tensor["B", "G", "C", "P", "bf16"]):
    """Each group's mean, the kernel's only output: a sum over (c, p), which it does not hold."""
    b, g, c, p = T.axes("b g c p")
    return T.sum(x[b, g, c, p], over=(c, p)) / (T.size("C") * T.size("P"))


def test_an_output_summed_over_the_axes_swept_together_is_swept_as_one():
    """Only an output that holds those axes must hold them side by side (its flat result is then
    a view of it); one summed over them holds none."""
    from tensorfuse.schedule_templates.auto import flat_templated
    from tensorfuse.schedule_templates.flat_sweeps import swept_together

    assert [a.name for a in swept_together(group_means.program)] == ["c", "p"]
    assert flat_templated(group_means.program, dict(B=2, G=4, C=8, P=64), HOPPER) is not None


def test_a_gemm_between_two_norms_is_cut_last_and_reads_each_rows_scale_once():
    """Cosine similarities: the norms first (a stage stores what it does not finish, and a norm
    per row is small where the GEMM's products are not), each storing its reciprocal square
    root (and only that: the sums themselves are read by nothing else), so the GEMM's epilogue
    multiplies by stored scales rather than computing two square roots an element."""
    from benchmarks.unlisted_kernels import cosine_similarity
    from tensorfuse.schedule_templates.auto import templated_stages

    stages = templated_stages(cosine_similarity.program, HOPPER)
    assert [s.describe() for s in stages] == [
        "out_sum_0 from x", "out_sum_2_1 from y",
        "out from x, y, out_sum_0, out_sum_2_1"]
    last = stages[-1].program
    assert "rsqrt" not in repr(last) and "out_sum_0[i]" in repr(last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = tf.compile(cosine_similarity, target="cuda:sm_90a")
    assert "hopper_gemm" in made.schedule_origin(M=8192, N=8192, D=1024)
    assert "rsqrtf" not in made.kernels[-1].source(M=8192, N=8192, D=1024)


def test_a_staged_call_lets_go_of_what_no_later_stage_reads_and_says_which_stage_ran_out():
    """The nested group norm's five stages on the CPU target: each stored value is dropped once
    its last reader has run (a floor's attention scores are B·H·M·N floats), the results still
    float64's; a stage that runs out of device memory is named in the error."""
    import gc
    import weakref

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = _staged(group_norm_nested, get_target("cpu"), "checked", planned_for=HOPPER)
    produced, alive_at = {}, []
    last_read = {n: k for k, s in enumerate(made.stages) for n in s.inputs}

    class Spy:
        def __init__(self, k, kernel):
            self.k, self.kernel = k, kernel

        def invoke(self, key, args, kwargs):
            gc.collect()
            alive_at.append({n for n, ref in produced.items() if ref() is not None})
            out = self.kernel.invoke(key, args, kwargs)
            for name, x in zip(made.stages[self.k].produces,
                               out if isinstance(out, tuple) else (out,)):
                produced[name] = weakref.ref(x)
            return out

    kernels = made.kernels
    made.kernels = tuple(Spy(k, kernel) for k, kernel in enumerate(kernels))
    args, want = CASES["group_norm_nested"][1](torch.Generator().manual_seed(fresh_seed()))
    assert relative_error(made(**args), want) < 2e-2
    for k, alive in enumerate(alive_at):
        assert not {n for n in alive if last_read.get(n, len(made.stages)) < k}, (k, alive)
    assert any(alive_at), "some value is passed on"

    class OutOfMemoryError(RuntimeError):
        pass

    class Short:
        def invoke(self, key, args, kwargs):
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 34.00 GiB")

    made.kernels = (*kernels[:2], Short(), *kernels[3:])
    with pytest.raises(OutOfMemoryError, match=r"stage 3 of 5 .* ran out of memory.*34\.00 GiB"):
        made(**args)


def test_every_stage_kernel_takes_the_scalars_by_name_in_describe_plan():
    """The attention's gradient program at a head dim of 576: a stage cut again by its own floor
    (a stage kernel on the Hopper GEMM among them) — ``describe_plan(scale=…)`` hands each stage
    its scalars apart from its sizes (a stage kernel refused ``scale`` as a size named so)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = tf.compile(tf.grad(K.attention), target="cuda:sm_90a")
        plan = made.describe_plan(B=1, H=4, M=1024, N=1024, D=576, scale=0.05)
    assert plan.count("\n[1] ") >= 1 and "hopper GEMM plan" in plan, plan


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("sinks", [None, "f32"])
def test_the_backward_of_grouped_heads_is_staged_and_matches_float64(sinks, device):
    """``tf.grad`` of causal attention over grouped heads (and with gpt-oss's sinks): a stage
    that reads neither k nor v still computes the kv-head ``h // (H // HKV)``; k comes along
    for its shape (such a stage was refused, and the whole backward ran on TVM's default
    schedule, unfused; tf.compile now runs the attention backward template for it, and these
    stages where the template refuses the sizes). Each stage compiled for the CPU, cut as for
    sm_90a, or for the GPU (TF32 products: 1e-2); every gradient against float64 autograd."""
    from tensorfuse.kernels.layers import attention_kernel
    from tests.kernels.test_attention_sinks import sink_attention64

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    B, H, HKV, M, N, D = 2, 4, 2, 37, 53, 16
    grad = tf.grad(attention_kernel("f32", True, False, False, sinks))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        if device == "cpu":
            made = _staged(grad, get_target("cpu"), "checked", planned_for=HOPPER)
            assert isinstance(made, StagedKernel), made
            assert any("k" in stage.inputs and not any(
                n.param.name == "k" for c in stage.program.computes for b in c.bodies
                for n in _loads(b)) for stage in made.stages)   # given k for its shape alone
        else:
            made = _staged(grad, get_target("cuda"), "checked")
            assert isinstance(made, StagedKernel), made
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    q, d_out = torch.randn(B, H, M, D, generator=g), torch.randn(B, H, M, D, generator=g)
    k, v = torch.randn(B, HKV, N, D, generator=g), torch.randn(B, HKV, N, D, generator=g)
    args = dict(q=q, k=k, v=v, scale=D ** -0.5, d_out=d_out)
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    keep = torch.ones(M, N, dtype=torch.bool).tril(N - M)
    if sinks:
        args["sinks"] = torch.randn(H, generator=g) * 4
        exact.append(args["sinks"].double().requires_grad_())
        out = sink_attention64(*exact, keep, D ** -0.5)
    else:
        s = exact[0] @ exact[1].repeat_interleave(H // HKV, 1).transpose(-1, -2) * D ** -0.5
        out = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ \
            exact[2].repeat_interleave(H // HKV, 1)
    want = torch.autograd.grad(out, exact, d_out.double())
    on = {n: x.to(device) if isinstance(x, torch.Tensor) else x for n, x in args.items()}
    for got, expected in zip(made(**on), want):
        assert relative_error(got.cpu(), expected) < (1e-4 if device == "cpu" else 1e-2), seed


def _loads(expr):
    from tensorfuse.algebra.exprs import nodes
    from tensorfuse.dsl.expr import Load

    return [n for n in nodes(expr) if isinstance(n, Load)]


def test_a_staged_kernels_repeated_call_is_its_stages_fast_calls():
    """Where every stage keeps a fast call for its signature (the GPU kernels do; counted CPU
    stand-ins here), the staged kernel keeps one for the call's: a repeated call runs the
    stages' in turn, with the same result; a signature with ``out=`` keeps its own, which writes
    the caller's array; a stage's fast call that leaves its call to the checked path leaves the
    whole call to it."""
    from tensorfuse.binding import signature_key

    class Counted:   # a stage kernel keeping a fast call per signature, counting its calls
        def __init__(self, kernel):
            self.kernel, self._fast, self.fast_calls, self.declines = kernel, {}, 0, False

        def invoke(self, key, args, kwargs):
            self._fast[signature_key(args, kwargs)] = self.fast
            return self.kernel.invoke(key, args, kwargs)

        def fast(self, args, kwargs):
            self.fast_calls += 1
            return None if self.declines else self.kernel.invoke(False, args, kwargs)

    args, want = max_pool_l2_case(torch.Generator().manual_seed(fresh_seed()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = _staged(max_pool_l2, get_target("cpu"), "checked", planned_for=HOPPER)
    made.kernels = tuple(Counted(k) for k in made.kernels)
    key = signature_key((), args)
    first = made(**args)   # no key given, as a memory-order route calls its inner kernel
    fast = made._fast[key]
    again = fast((), args)
    assert [k.fast_calls for k in made.kernels] == [1] * len(made.kernels)
    assert relative_error(torch.as_tensor(again), want) < 2e-2
    assert (torch.as_tensor(again) == torch.as_tensor(first)).all()
    out = torch.full_like(torch.as_tensor(first), float("nan"))
    out_key = signature_key((), {**args, "out": out})
    assert made.invoke(out_key, (), {**args, "out": out}) is out
    out.fill_(float("nan"))
    assert made._fast[out_key]((), {**args, "out": out}) is out
    assert (out == torch.as_tensor(first)).all()
    made.kernels[-1].declines = True
    assert fast((), args) is None


def test_few_row_tiles_over_a_long_sweep_are_staged_by_tf_compile_not_by_hand():
    """A log-softmax down the 32000 rows of [32000, 64]: two row tiles of columns, each a long
    sweep with outputs along it. tf.compile runs the statistics (split over the GPU) and the
    outputs as two stages, saying why the row template did not take it whole; the row template
    applied by hand still runs it as one kernel; at a short sweep tf.compile keeps the one
    kernel."""
    from benchmarks.unlisted_kernels import log_softmax_vocab_major

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        f = tf.compile(log_softmax_vocab_major, "cuda:sm_90a")
        plan = f.describe_plan(V=32000, B=64)
    assert plan.splitlines()[0].endswith("2 stage kernels (no template takes "
                                         "log_softmax_vocab_major whole): mx, out_sum_0 from x; "
                                         "out from x, mx, out_sum_0"), plan
    assert "outputs along the sweep, which one kernel cannot split over the GPU" in plan
    assert "splits=" in plan and "splits=1" not in plan   # the statistics' stage in parts
    assert "row-reduction template" in f.describe_plan(V=64, B=64).splitlines()[0]
    sch = tf.schedule(log_softmax_vocab_major, "cuda:sm_90a").rolling_update("mx", "out_sum",
                                                                             axis="v")
    sch.apply_template("row_reduction")
    assert "splits=1" in sch.plan(V=32000, B=64)
