"""Tensors passed in another axis order than their programs declare, read in their memory order
(:mod:`tensorfuse.memory_order`): which views route, the program rewritten (the plan of a
program written in that order), when a route is declined (a lesser schedule than the program as
written gets), the sm_90a code of a routed row, the numbers against float64 in Triton's
interpreter with the copies counted, and on a GPU the calls as a user makes them."""
import re
import warnings

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.algebra.exprs import nodes
from tensorfuse.dsl.expr import Load
from tensorfuse.algebra.axis_orders import with_axis_orders
from tensorfuse.memory_order import Orders, memory_order, output_orders
from benchmarks.gemm import matmul_nk
from benchmarks.user_kernels import (bshd_causal, group_norm, layernorm_channels,
                                     log_softmax_channels)
from tests.helpers import fresh_seed, run_interpreted

triton = pytest.importorskip("triton", reason="the templates generate Triton kernels")

# bf16 outputs: 2e-2 of the largest value; the f32 cases of the interpreter check: 1e-5
TOLERANCE = 2e-2
F32 = ("gated, both transposed (elementwise)", "cumulative sum down a transposed view (scan)")
# per case: the copies torch makes of the arguments, the route taken (None: copied) into
# contiguous outputs, and the layout of an output made by the call (where it follows the input's)
LOG_SOFTMAX = "x as [B, P, C]"
LAYER_NORM = "x as [B, S, D]"
EXPECTED = {"log-softmax over channels, channels last":
            (0, LOG_SOFTMAX, f"{LOG_SOFTMAX}; out written as [B, P, C]", (0, 2, 1)),
            "layer norm over channels, channels last":
            (0, LAYER_NORM, f"{LAYER_NORM}; out written as [B, S, D]", (0, 2, 1)),
            # two axes swept as one: in memory order, the statistics a stage (a value per
            # group), swept with the channels fastest, then the output written channels last
            "group norm, channels last": (0, "x as [B, P, G, C]",
                                          "x as [B, P, G, C]; out written as [B, P, G, C]",
                                          (0, 3, 1, 2)),
            "project, weight transposed": (0, "w as [K, N]", "w as [K, N]", (0, 1)),
            "attention, keys transposed":
            (0, "kt as [B, H, S, D]", "kt as [B, H, S, D]", (0, 1, 2, 3)),
            "gated, both transposed (elementwise)":
            (0, "x as [N, M]; gate as [N, M]",
             "x as [N, M]; gate as [N, M]; out written as [N, M]", (1, 0)),
            "cumulative sum down a transposed view (scan)": (0, "x as [B, T]", "x as [B, T]",
                                                             (0, 1))}


def _compiled(kernel):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tf.compile(kernel, target="cuda:sm_90a")


def test_which_views_have_another_memory_order():
    x = torch.zeros(2, 300, 150)
    assert memory_order(x.permute(0, 2, 1)) == (0, 2, 1)       # channels last seen as [B, C, P]
    assert memory_order(x.permute(2, 0, 1)) == (1, 2, 0)
    assert memory_order(x[0].t()) == (1, 0)
    assert memory_order(x) is None                               # in order already
    assert memory_order(x[:, :, ::2]) is None                    # no axis contiguous: copied
    assert memory_order(x[:, :1].expand(2, 7, 150).transpose(1, 2)) is None   # a broadcast axis
    # axes of one element keep their places, whatever their strides
    assert memory_order(torch.zeros(4, 1, 6).permute(2, 1, 0)) == (2, 1, 0)
    assert memory_order(torch.zeros(6, 4)[:, None].permute(2, 1, 0)) == (2, 1, 0)
    assert memory_order(torch.zeros(5)) is None


@tf.kernel
def log_softmax_channels_last(x: T.Tensor["B", "P", "C", "bf16"]):
    """The log-softmax of :func:`log_softmax_channels` written for [B, P, C] tensors."""
    b, p, c = T.axes("b p c")
    m = T.max(x[b, p, c], over=c)
    return x[b, p, c] - m - T.log(T.sum(T.exp(x[b, p, c] - m), over=c))


def test_the_program_in_memory_order_gets_the_plan_of_one_written_so():
    made = _compiled(log_softmax_channels)
    orders = made.routes.orders((torch.zeros(2, 300, 150).permute(0, 2, 1),), {})
    # the output over the input's axes laid out as the input is
    assert orders == Orders((("x", (0, 2, 1)),), (("out", (0, 2, 1)),))
    routed = made.routes.kernel_for(orders)
    sizes = dict(B=8, C=150, P=65536)
    plan = routed.describe_plan(**sizes).splitlines()
    assert plan[0] == "read in memory order: x as [B, P, C]; out written as [B, P, C]"
    written = _compiled(log_softmax_channels_last).describe_plan(**sizes).splitlines()
    assert [line.replace("log_softmax_channels_last", "log_softmax_channels")
            for line in written] == plan[1:]
    # the program as written sweeps the strided axis: another plan
    assert made.describe_plan(**sizes).splitlines() != plan[1:]


def _reads(program) -> list:
    """Every read of a tensor in ``program``'s bodies: (tensor, its index axes' names)."""
    return sorted((n.param.name, tuple(i.name for i in n.indices))
                  for c in program.computes for body in c.bodies for n in nodes(body)
                  if isinstance(n, Load))


def test_the_rewrite_permutes_the_declaration_and_every_read_alike():
    program = with_axis_orders(log_softmax_channels.program, {"x": (0, 2, 1)})
    assert program.tensor_params[0].dims == ("B", "P", "C")
    assert _reads(log_softmax_channels.program) == [("x", ("b", "c", "p"))] * 3
    assert _reads(program) == _reads(log_softmax_channels_last.program) == \
        [("x", ("b", "p", "c"))] * 3


@tf.kernel
def channel_sums(x: T.Tensor["B", "C", "P", "bf16"]):
    """A sum over the channels: its output is over (b, p), not the input's axes."""
    b, c, p = T.axes("b c p")
    return T.sum(x[b, c, p], over=c)


def test_an_output_follows_the_layout_of_the_input_over_the_same_axes():
    assert output_orders(log_softmax_channels.program, {"x": (0, 2, 1)}) == {"out": (0, 2, 1)}
    assert output_orders(log_softmax_channels.program, {"x": (2, 1, 0)}) == {"out": (2, 1, 0)}
    assert output_orders(channel_sums.program, {"x": (0, 2, 1)}) == {}
    # the projection's output is over (i, j), its transposed weight over (j, k)
    assert output_orders(matmul_nk.program, {"w": (1, 0)}) == {}


class _Routed:
    """A route's kernel as :meth:`GraphCallable._route_call` sees it: it runs the call and keeps
    a fast call for the signature."""

    def __init__(self):
        self._fast = {}

    def invoke(self, key, args, kwargs):
        self._fast[key] = f"fast call of {key}"
        return "outputs"


def test_a_fast_call_made_inside_an_operator_is_not_kept_for_eager_calls():
    """Eager calls of a signature lay outputs out as their inputs; the operator's calls (row-major
    outputs, as its fake says) run through the route without replacing the eager fast call."""
    from tensorfuse.torch_graph import IN_OPERATOR, GraphCallable

    kernel, routed = GraphCallable(), _Routed()
    kernel._fast = {}
    kernel.routes = type("Routes", (), {"route": lambda self, args, kwargs, key: routed})()
    assert kernel._route_call("eager", (), {}) == (True, "outputs")
    assert kernel._fast == {"eager": "fast call of eager"}
    token = IN_OPERATOR.set(True)
    try:
        assert kernel._route_call("operator", (), {}) == (True, "outputs")
    finally:
        IN_OPERATOR.reset(token)
    assert kernel._fast == {"eager": "fast call of eager"}
    kernel.routes = type("Routes", (), {"route": lambda self, args, kwargs, key: None})()
    assert kernel._route_call("plain", (), {}) == (False, None)


def test_a_signature_routed_before_is_not_bound_again(monkeypatch):
    """The route's decision for a signature key and set of orders is kept: a kernel without fast
    calls (the scan template's) asks on every call."""
    import tensorfuse.memory_order as memory_order_module

    monkeypatch.setenv("TRITON_INTERPRET", "1")   # CPU tensors bound as the interpreter's
    made = _compiled(log_softmax_channels)
    bound = []
    binding = memory_order_module.bind_call
    monkeypatch.setattr(memory_order_module, "bind_call",
                        lambda *a: bound.append(a) or binding(*a))
    view = torch.zeros(2, 300, 150, dtype=torch.bfloat16).permute(0, 2, 1)
    first = made.routes.route((view,), {}, "signature")
    assert first is made.routes.route((view,), {}, "signature") and len(bound) == 1
    assert made.routes.route((view,), {}, "another") is first and len(bound) == 2
    assert made.routes.route((view.contiguous(),), {}, "signature") is None   # in order


def test_a_permuted_call_reports_a_missing_gpu_first():
    """A channels-last CPU tensor to a kernel compiled for sm_90a: without a GPU the missing GPU
    is what the user hears (as for any call), with one that the tensor is on the CPU."""
    from tensorfuse.errors import CallError, TargetError

    made = _compiled(log_softmax_channels)
    view = torch.zeros(2, 300, 150, dtype=torch.bfloat16).permute(0, 2, 1)
    error, words = (CallError, "on the cpu") if torch.cuda.is_available() else \
        (TargetError, "needs an NVIDIA GPU")
    with pytest.raises(error, match=words):
        made(view)


def test_describe_call_says_how_a_call_runs_on_its_tensors_as_they_lie():
    """The plan of the route where a tensor in another order takes one; else the kernel's plan
    and each tensor copied before the launch, with why — nothing runs, no GPU needed."""
    made = _compiled(log_softmax_channels)
    x = torch.zeros(2, 300, 150, dtype=torch.bfloat16)
    routed = made.describe_call(x.permute(0, 2, 1)).splitlines()
    assert routed[0] == "read in memory order: x as [B, P, C]; out written as [B, P, C]"
    assert "  swept: c (150), feature held whole: 1" in routed
    plain = made.describe_call(x.permute(0, 2, 1).contiguous())
    assert plain == made.describe_plan(B=2, C=150, P=300)
    skewed = torch.zeros(2 * 150 * 300 + 2, dtype=torch.bfloat16)[2:].view(2, 150, 300)
    assert made.describe_call(skewed).endswith(
        "  x copied before each launch: it starts 4 bytes past a 16-byte boundary")
    attention = _compiled(bshd_causal)
    q = torch.zeros(2, 256, 64, 16, dtype=torch.bfloat16).transpose(2, 3)   # head dim strided
    k = torch.zeros(2, 256, 16, 64, dtype=torch.bfloat16)
    described = attention.describe_call(q, k, k, 0.1).splitlines()
    assert described[0] == "read in memory order: q as [B, M, D, H]"
    assert described[1].startswith("bshd_causal at B=2, M=256, H=16, D=64, N=256: head dims "
                                   "innermost for the Hopper attention's copies: q copied as "
                                   "[B, M, H, D]; hopper_attention")


def test_a_routed_row_writing_down_its_rows_takes_tiles_of_16_rows():
    """Layer norm over the channels of a channels-last [B, S, D] read in memory order writes
    out[b, d, s]: its stores run down a tile's rows, so the tile takes 16 rows (the row-major
    default's 2 stored 4 bytes apiece)."""
    made = _compiled(layernorm_channels)
    routed = made.routes.kernel_for(Orders((("x", (0, 2, 1)),)))
    knobs = next(line for line in routed.describe_plan(B=8, D=1024, S=4096).splitlines()
                 if "knobs:" in line)
    assert "block_m=16, block_n=1024" in knobs


def test_routes_to_native_templates_are_taken_whatever_they_copy():
    """Queries whose head dim is strided (stored [B, S, D, H]) make the attention's q operand
    MN-major, which the Hopper attention does not read: the program in that order copies q back
    into rows of the head dim (the elementwise template's transpose, faster than the copy of
    the view it saves) before its Hopper kernel. A GEMM is routed with its
    operands in either order: the weight kept [K, N] to the Hopper GEMM, the rows operand kept
    [K, M] to the Triton contraction (whose tiles rank with the Hopper GEMM's)."""
    attention = _compiled(bshd_causal)
    sizes = dict(B=2, M=4096, N=4096, H=16, D=128)
    in_order = Orders((("q", (0, 1, 3, 2)),))
    assert attention.routes.taken(in_order, sizes)
    assert "q copied as [B, M, H, D]" in attention.routes.kernel_for(in_order).describe_plan(
        **sizes)
    made = _compiled(matmul_nk)
    sizes = dict(M=4096, K=4096, N=4096)
    for orders, runs in (((("w", (1, 0)),), "hopper_gemm"), ((("x", (1, 0)),), "contraction"),
                         ((("x", (1, 0)), ("w", (1, 0))), "contraction")):
        assert made.routes.taken(Orders(orders), sizes), orders
        assert runs in made.routes.kernel_for(Orders(orders)).describe_plan(
            **sizes).splitlines()[1]


def test_a_group_norm_called_channels_last_is_routed_to_stages_that_store_its_statistics():
    """The group norm written over [B, G, C, P], called with channels-last activations: in
    memory order its output holds the pixels and channels apart, so its statistics are a stage
    (a value per group: little beside the activations, ranked with the template; stages that
    store as much as they read keep the copy) swept with the channels fastest, then the output."""
    import tensorfuse.memory_order as mo

    made = _compiled(group_norm)
    x = torch.zeros(16, 4096, 32, 16, dtype=torch.bfloat16).permute(0, 2, 3, 1)   # [B, G, C, P]
    w = torch.zeros(32, 16, dtype=torch.bfloat16)
    orders = made.routes.orders((x, w, w, 1e-5), {})   # the output laid out as x
    sizes = dict(B=16, G=32, C=16, P=4096)
    assert made.routes.taken(orders, sizes)
    plan = made.routes.kernel_for(orders).describe_plan(**sizes)
    assert "stored between the stages: 4.0 KiB" in plan and "p, c swept as one axis" in plan, plan
    assert mo._rank(made.routes.kernel_for(orders).inner, sizes) == 1
    # its output row-major (inside a custom operator): the statistics still swept in memory
    # order, the output written apart (not a flat sweep reading x a strided element at a time)
    row_major = made.routes.kernel_for(Orders((("x", (0, 3, 1, 2)),))).describe_plan(**sizes)
    assert "p, c swept as one axis" in row_major and "[2] out from" in row_major, row_major
    mo.LITTLE_STORED, kept = 0.0, mo.LITTLE_STORED
    try:   # stages ranked below the template: the route declined, the view copied
        assert mo._rank(made.routes.kernel_for(orders).inner, sizes) == 2
        fresh = _compiled(group_norm)
        assert not fresh.routes.taken(fresh.routes.orders((x, w, w, 1e-5), {}), sizes)
        assert fresh.describe_call(x, w, w, 1e-5).endswith(
            "  x copied before each launch: its innermost dimension is strided (its program in "
            "memory order would run on a lesser schedule)")
    finally:
        mo.LITTLE_STORED = kept


def test_sm90a_code_of_the_routes():
    """The log-softmax over 256 channels of a channels-last tensor reads each pixel's channels as
    16-byte vectors; the GEMM with its weight kept [K, N] is the Hopper GEMM's wgmma kernel,
    reading the weight through a tensor map of that layout (nvcc builds it in its tests)."""
    made = _compiled(log_softmax_channels)
    routed = made.routes.kernel_for(Orders((("x", (0, 2, 1)),)))
    ptx = routed.ptx(B=8, C=256, P=4096)
    assert re.search(r"ld\.global[\w:.]*\.v4\.b32", ptx)
    gemm = _compiled(matmul_nk).routes.kernel_for(Orders((("w", (1, 0)),)))
    source = gemm.source(M=4096, K=4096, N=4096)
    assert "wgmma.mma_async" in source


def test_views_in_another_order_match_float64_in_the_interpreter_without_copies():
    """Into contiguous outputs (written in the program's layout), into outputs the call makes
    (laid out as the input they follow, as torch keeps a memory format), into outputs the
    caller laid out so (written in place) and through the kernel's custom operator (row-major
    outputs, as its fake implementation gives torch.compile): each against float64."""
    seed = fresh_seed()
    found = run_interpreted("tests.schedule_templates.memory_order_check", seed)
    assert set(found) == set(EXPECTED)

    def said(route):
        return route and f"read in memory order: {route}"
    for name, got in found.items():
        copies, route, kept_route, layout = EXPECTED[name]
        tolerance = 1e-5 if name in F32 else TOLERANCE
        assert got["error"] <= tolerance, (name, got, seed)
        assert got["copies"] == copies, (name, got, seed)
        assert got["route"] == said(route), (name, got)
        assert got["kept"]["error"] <= tolerance, (name, got, seed)
        assert got["kept"]["route"] == said(kept_route), (name, got)
        assert [tuple(t) for t in got["kept"]["layouts"]] == [layout], (name, got)
        assert got["in_place"]["error"] <= tolerance and got["in_place"]["same"], (name, got)
        if route is None:   # a kernel without routes: run as the interpreter's stand-in
            continue
        assert got["operator"]["error"] <= tolerance, (name, got, seed)
        assert got["operator"]["contiguous"], (name, got)   # as the fake implementation says


@pytest.mark.gpu
def test_a_channels_last_call_on_the_gpu_reads_in_place_and_repeats_on_the_fast_path():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from tensorfuse.errors import CopiedArgumentWarning

    gen = torch.Generator(device="cuda").manual_seed(fresh_seed())
    made = tf.compile(log_softmax_channels)
    x = (torch.randn(4, 2000, 150, device="cuda", generator=gen) * 20).bfloat16()
    view = x.permute(0, 2, 1)                       # [B, C, P], channels last in memory
    want = torch.log_softmax(view.double(), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CopiedArgumentWarning)   # nothing copied
        for _ in range(3):
            out = torch.full(view.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
            got = made(view, out=out)
            assert got is out
            assert float((got.double() - want).abs().max() / want.abs().max()) <= TOLERANCE
    routed = next(iter(made.routes._kernels.values()))
    assert sum(f.calls for f in routed._fast.values()) >= 2   # the repeats took the fast call
    # without out=: the output laid out channels last, as its input (the repeats fast too)
    for _ in range(3):
        got = made(view)
        assert got.permute(0, 2, 1).is_contiguous()
        assert float((got.double() - want).abs().max() / want.abs().max()) <= TOLERANCE
    kept = [k for k in made.routes._kernels.values() if k.out_orders]
    assert kept and sum(f.calls for f in kept[0]._fast.values()) >= 2
    # the same kernel on a contiguous tensor (the program as written): a contiguous output
    got = made(view.contiguous())
    assert got.is_contiguous()
    assert float((got.double() - want).abs().max() / want.abs().max()) <= TOLERANCE
    # inside torch.compile: the operator's outputs row-major, as its fake implementation says
    # (Inductor indexes the doubled output by the fake's strides)
    doubled = torch.compile(lambda t: made(t) * 2, fullgraph=True)(view)
    assert float((doubled.double() - 2 * want).abs().max() / want.abs().max()) <= TOLERANCE
    # the routed programs' builds are the kernel's too
    built = [b for k in made.routes._kernels.values() for b in k.cache_info()]
    assert built and all(b in made.cache_info() for b in built)


# kernels of the suites whose plans rewrite the program (stages after an attention, latent
# queries, merged heads, packed slices, flat sweeps, the floor's stages), each called below with
# every tensor of three or more axes laid out reversed, its last two axes swapped, and its
# second and third swapped
_PLANNED_IN_ANY_ORDER = [
    "user_kernels.bshd_causal", "user_kernels.gqa_causal_grouped_axes", "user_kernels.mqa_decode",
    "user_kernels.log_softmax_channels", "user_kernels.layernorm_channels",
    "user_kernels.group_norm", "user_kernels.max_pool_l2", "user_kernels.channel_stats",
    "pipeline_kernels.gated_attention", "pipeline_kernels.latent_cross_attention",
    "pipeline_kernels.cosine_attention", "variant_kernels.diff_attention",
    "serving_kernels.packed_qkv_causal", "layout_kernels.group_norm_channels_last"]
_SMALL = dict(B=2, H=4, HKV=2, S=96, M=64, N=96, D=64, C=16, P=256, G=4, L=64, R=2)


@pytest.mark.parametrize("name", _PLANNED_IN_ANY_ORDER)
def test_calls_in_other_memory_orders_are_planned(name):
    """A call's plan (``describe_call``: routes, stages, copies; nothing runs) for tensors lying
    in other orders: planning the rewritten programs once compared DSL axes with ``==`` / ``!=``
    (which build expressions) and raised 'a tensor value was used where Python needs
    True/False' — a gated attention and latent queries over reversed tensors."""
    import importlib

    from tensorfuse.interop import torch_dtype

    module, kernel_name = name.split(".")
    kernel = getattr(importlib.import_module(f"benchmarks.{module}"), kernel_name)
    made = tf.compile(kernel, target="cuda:sm_90a")
    for swap in ("reversed", "last two", "second and third"):
        args = []
        for p in kernel.program.params:
            if not hasattr(p, "dims"):
                args.append(0.5 if p.dtype.startswith("f") else 2)
                continue
            shape = [d if isinstance(d, int) else _SMALL.get(d, 16) for d in p.dims]
            order = list(range(len(shape)))
            if len(shape) >= 3:
                order = order[::-1] if swap == "reversed" else \
                    order[:-2] + order[:-3:-1] if swap == "last two" else \
                    [order[0], order[2], order[1], *order[3:]]
            stored = torch.randn([shape[k] for k in order]).to(torch_dtype(p.dtype))
            args.append(stored.permute([order.index(k) for k in range(len(shape))]))
        assert made.describe_call(*args), (name, swap)
