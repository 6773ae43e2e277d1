"""Programs no template takes whole, as users write them, and their float64 references (torch,
never the project's lowering): shared by the staged floor's tests and their check under
Triton's interpreter (``python -m tests.schedule_templates.staged_floor SEED`` with
``TRITON_INTERPRET=1``)."""
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.torch_graph import GraphCallable
from benchmarks.unlisted_kernels import (head_logsumexp, log_softmax_vocab_major,
                                        mean_nearest_distance)
from benchmarks.user_kernels import group_norm, max_pool_l2, paged_decode, segment_mean
from tests.helpers import poisoned_main


@tf.kernel
def group_norm_nested(x: T.Tensor["B", "G", "C", "P", "bf16"], eps: T.f32):
    """Group norm with its two-axis sums written as nested sums: the variance's inner sum reads
    the mean's outer one, which no single pass has."""
    b, g, c, p = T.axes("b g c p")
    n = T.size("C") * T.size("P")
    mean = T.sum(T.sum(x[b, g, c, p], over=p), over=c) / n
    var = T.sum(T.sum((x[b, g, c, p] - mean) * (x[b, g, c, p] - mean), over=p), over=c) / n
    return (x[b, g, c, p] - mean) * T.rsqrt(var + eps)


def mean_nearest_case(generator, B=2, N=45, M=300, C=3, width=4.0):
    x = torch.randn(B, N, C, generator=generator) * width
    y = torch.randn(B, M, C, generator=generator) * width + 1.0
    d2 = ((x.double()[:, :, None, :] - y.double()[:, None, :, :]) ** 2).sum(-1)
    return {"x": x, "y": y}, d2.amin(2).mean(1)


def max_pool_l2_case(generator, B=3, S=37, D=77, width=4.0):
    x = (torch.randn(B, S, D, generator=generator) * width).to(torch.bfloat16)
    pooled = x.double().amax(1)
    return {"x": x}, pooled * torch.rsqrt((pooled * pooled).sum(-1, keepdim=True) + 1e-12)


def group_norm_case(generator, B=2, G=3, C=5, P=67, width=3.0):
    x = (torch.randn(B, G, C, P, generator=generator) * width + width).to(torch.bfloat16)
    xd = x.double()
    mean = xd.mean((2, 3), keepdim=True)
    var = ((xd - mean) ** 2).mean((2, 3), keepdim=True)
    return {"x": x, "eps": 1e-5}, (xd - mean) / torch.sqrt(var + 1e-5)


def paged_decode_case(generator, B=2, H=4, HKV=2, D=16, PAGE=8, NP=3, spare=3, width=3.0):
    """Pages of each sequence drawn at random from a pool with ``spare`` pages no sequence uses."""
    pool = B * NP + spare
    q = (torch.randn(B, H, D, generator=generator) * width).to(torch.bfloat16)
    k_pages, v_pages = ((torch.randn(pool, PAGE, HKV, D, generator=generator) * width)
                        .to(torch.bfloat16) for _ in range(2))
    table = torch.randperm(pool, generator=generator)[:B * NP].reshape(B, NP).to(torch.int32)
    keys, values = (t.double()[table.long()].reshape(B, NP * PAGE, HKV, D)
                    .repeat_interleave(H // HKV, 2) for t in (k_pages, v_pages))
    scale = 0.25
    s = torch.einsum("bhd,bjhd->bhj", q.double(), keys) * scale
    want = torch.einsum("bhj,bjhd->bhd", torch.softmax(s, -1), values)
    return {"q": q, "k_pages": k_pages, "v_pages": v_pages, "table": table,
            "scale": scale}, want


def segment_mean_case(generator, G=20, D=40, width=4.0):
    """Segments of 1 to 128 rows (the kernel's most), packed without gaps: the last ones'
    masked rows would run past the tensor's end."""
    lengths = torch.randint(1, 129, (G,), generator=generator)
    starts = lengths.cumsum(0) - lengths
    x = (torch.randn(int(lengths.sum()), D, generator=generator) * width).to(torch.bfloat16)
    want = torch.stack([x[s:s + n].double().mean(0) for s, n in zip(starts, lengths)])
    return {"x": x, "starts": starts.to(torch.int32), "lengths": lengths.to(torch.int32)}, want


def layernorm_backward_case(generator, M=7, N=77, width=3.0):
    """tf.grad of the library's layer norm: a row chain (mean, variance and the gradient's two
    row sums) and, after it, column sums for the weight and bias gradients; the reference is
    torch's autograd in float64."""
    x = (torch.randn(M, N, generator=generator) * width + width).to(torch.bfloat16)
    weight, bias = ((torch.rand(N, generator=generator) + 0.5).to(torch.bfloat16),
                    torch.randn(N, generator=generator).to(torch.bfloat16))
    d_out = torch.randn(M, N, generator=generator).to(torch.bfloat16)
    leaves = [t.double().requires_grad_() for t in (x, weight, bias)]
    out = torch.nn.functional.layer_norm(leaves[0], (N,), leaves[1], leaves[2], 1e-5)
    want = torch.autograd.grad(out, leaves, d_out.double())
    return {"x": x, "weight": weight, "bias": bias, "eps": 1e-5, "d_out": d_out}, want


def group_norm_backward_case(generator, B=2, G=3, C=5, P=67, width=3.0):
    """tf.grad of the suite's group norm: its statistics and input gradient sum over two axes
    (c, p) together, its weight and bias gradients over two others (b, p); the reference is
    torch's group_norm autograd in float64."""
    x = (torch.randn(B, G, C, P, generator=generator) * width + width).to(torch.bfloat16)
    w = (torch.rand(G, C, generator=generator) + 0.5).to(torch.bfloat16)
    bias = torch.randn(G, C, generator=generator).to(torch.bfloat16)
    d_out = torch.randn(B, G, C, P, generator=generator).to(torch.bfloat16)
    leaves = [t.double().requires_grad_() for t in (x, w, bias)]
    out = torch.nn.functional.group_norm(leaves[0].reshape(B, G * C, P), G,
                                         leaves[1].reshape(-1), leaves[2].reshape(-1), 1e-5)
    want = torch.autograd.grad(out.reshape(B, G, C, P), leaves, d_out.double())
    return {"x": x, "w": w, "bias": bias, "eps": 1e-5, "d_out": d_out}, want


@tf.kernel
def latent_attention(q: T.Tensor["B", "H", "M", "DQ", "bf16"], k: T.Tensor["B", "N", "DQ", "bf16"],
                     v: T.Tensor["B", "N", "DV", "bf16"], scale: T.f32):
    """Every head over one latent cache, q·k over DQ and p·v over DV."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, j, d], over=d) * scale
    return K.softmax_attend(s, v[b, j, e], j)


def latent_attention_case(generator, B=1, H=2, M=3, N=37, DQ=1152, DV=1024):
    """Past the head dims a row tile holds in chunks: the floor cuts it at these sizes (scores
    stored)."""
    q = (torch.randn(B, H, M, DQ, generator=generator) * 0.2).to(torch.bfloat16)
    k = (torch.randn(B, N, DQ, generator=generator) * 0.2).to(torch.bfloat16)
    v = (torch.randn(B, N, DV, generator=generator) * 3).to(torch.bfloat16)
    s = torch.einsum("bhid,bjd->bhij", q.double(), k.double()) * 0.05
    return ({"q": q, "k": k, "v": v, "scale": 0.05},
            torch.einsum("bhij,bje->bhie", torch.softmax(s, -1), v.double()))


def head_logsumexp_case(generator, M=5, K=300, V=70):
    """Logits over 300 features: past the row tile's (the contraction template keeps the
    normaliser over them)."""
    x, w = ((torch.randn(n, K, generator=generator) * 0.3).to(torch.bfloat16) for n in (M, V))
    return {"x": x, "w": w}, torch.logsumexp(x.double() @ w.double().T, -1)


def vocab_major_case(generator, V=9000, B=5, width=6.0):
    """Few columns each swept down 9000 rows (over 16 blocks) with outputs along the sweep: the
    row template's defaults refuse them (the statistics would not split over the GPU), so the
    floor runs the statistics and the outputs as two stages."""
    x = torch.randn(V, B, generator=generator) * width + width
    return {"x": x}, torch.log_softmax(x.double(), 0)


# chains a template takes whole at small sizes, cut by the floor at these cases' (a feature axis
# past a row tile; few row tiles, each a long sweep with outputs along it)
WIDE = {"latent_attention": (latent_attention, latent_attention_case,
                             dict(B=1, H=2, M=3, N=37, DQ=1152, DV=1024)),
        "log_softmax_vocab_major": (log_softmax_vocab_major, vocab_major_case,
                                    dict(V=9000, B=5))}

CASES = {"max_pool_l2": (max_pool_l2, max_pool_l2_case),
         "group_norm_nested": (group_norm_nested, group_norm_case),
         "paged_decode": (paged_decode, paged_decode_case),
         "segment_mean": (segment_mean, segment_mean_case),
         "mean_nearest_distance": (mean_nearest_distance, mean_nearest_case),
         "layernorm_backward": (tf.grad(K.layernorm), layernorm_backward_case),
         "group_norm_backward": (tf.grad(group_norm), group_norm_backward_case),
         # a softmax normaliser over 300 features of a GEMM's: once cut by the floor, now one
         # pass of the contraction template (its normaliser over the columns)
         "head_logsumexp": (head_logsumexp, head_logsumexp_case),
         **{name: (kernel, case) for name, (kernel, case, _) in WIDE.items()}}
# the rest a template takes whole
STAGED = {"max_pool_l2", "group_norm_nested", "paged_decode", "layernorm_backward",
          "group_norm_backward", "mean_nearest_distance"}
# checked in the interpreter (a stage no template takes runs on the CPU target there; the
# nested group norm's sums are merged by tf.compile, one flat sweep)
INTERPRETED = ("max_pool_l2", "group_norm_nested", "segment_mean", "layernorm_backward",
               "group_norm_backward",
               "head_logsumexp", "mean_nearest_distance", *WIDE)


def interpreted(kernel, dynamic=None):
    """``kernel`` as ``tf.compile`` makes it for sm_90a (with ``dynamic``), each kernel run by
    the interpreter: the one it picks at a call's sizes where that is a Triton kernel (a route
    ahead of the template: reductions written out), else its Triton template; each stage's
    likewise (what picks between a template and TVM's CUDA otherwise needs a GPU)."""
    import warnings

    from tensorfuse.errors import NoTemplateWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = tf.compile(kernel, target="cuda:sm_90a", dynamic=dynamic)
    return _interpreted_whole(made)


def _interpreted_whole(made):
    """:func:`interpreted` of what ``tf.compile`` made: an equivalent program's kernel kept
    behind its rewrite (outputs over no axis given back with shape []), the floor's stages
    each interpreted."""
    from tensorfuse.widened_kernel import RewrittenKernel

    if isinstance(made, RewrittenKernel):   # an equivalent program's kernel runs the calls
        return RewrittenKernel(made.program, _interpreted_whole(made.inner), made.note)
    if not hasattr(made, "stages"):   # one kernel that the interpreter runs as it is
        return _interpreted_stage(None, made)
    made.kernels = tuple(_interpreted_stage(stage, k)
                         for stage, k in zip(made.stages, made.kernels))
    return made


class _PickedPerCall(GraphCallable):
    """An :class:`~tensorfuse.api.AutoKernel` choosing at each call's sizes as it does on a GPU,
    among the kernels Triton's interpreter runs: its pick where that is a Triton kernel (the
    elementwise template's, through a route ahead of the template; the contraction template's),
    else its Triton template."""

    def __init__(self, made):
        self.made, self.program, self.target = made, made.program, made.target
        self.description = made.description

    def __getattr__(self, name):   # what it would pick, its plans: the AutoKernel's
        if name == "made":
            raise AttributeError(name)
        return getattr(self.made, name)

    def invoke(self, key, args: tuple, kwargs: dict):
        from tensorfuse.binding import bind_call
        from tensorfuse.staged import StagedKernel
        from tensorfuse.targets.triton.contraction_kernel import ContractionKernel
        from tensorfuse.targets.triton.kernel import TritonKernel
        from tensorfuse.targets.triton.scatter_kernel import ScatterKernel

        shaped = {n: v for n, v in kwargs.items() if n != "out"}
        chosen = self.made.for_sizes(**bind_call(self.program, args, shaped, "cpu").dims)
        if isinstance(chosen, StagedKernel):   # the floor, cut at these sizes: its stages'
            if not getattr(chosen, "interpreted", False):
                chosen.kernels = tuple(_interpreted_stage(stage, k)
                                       for stage, k in zip(chosen.stages, chosen.kernels))
                chosen.interpreted = True
        elif not isinstance(chosen, (TritonKernel, ScatterKernel, ContractionKernel)):
            chosen = self.made.template
        return chosen.invoke(False, args, kwargs)


def _interpreted_stage(stage, kernel):
    """A stage's Triton template (each flat sweep's, for a stage swept over several axes as
    one), or, for a stage no template takes, its program compiled for the CPU."""
    from tensorfuse.dsl.program import ProgramKernel

    from tensorfuse.api import AutoKernel
    from tensorfuse.flat_kernel import FlatSweepKernel
    from tensorfuse.targets.triton.plan_kernel import PlanKernel
    from tensorfuse.widened_kernel import RewrittenKernel

    if isinstance(kernel, RewrittenKernel):   # a value over no axis as one row: its shape []
        return RewrittenKernel(kernel.program, _interpreted_stage(None, kernel.inner),
                               kernel.note)
    if isinstance(kernel, FlatSweepKernel):
        return FlatSweepKernel(kernel.program, kernel.target, kernel.group,
                               lambda sizes: _interpreted_stage(None, kernel.for_sizes(**sizes)))
    if isinstance(kernel, AutoKernel):
        return _PickedPerCall(kernel)
    if isinstance(kernel, PlanKernel):   # an elementwise pass, a scatter-add, a scan: as it is
        return kernel
    if stage is None:   # a whole kernel: a flat sweep's or the elementwise template's
        return kernel
    return tf.compile(ProgramKernel(stage.program), target="llvm")


if __name__ == "__main__":
    poisoned_main({name: CASES[name] for name in INTERPRETED},
                  lambda name, kernel: interpreted(kernel))
