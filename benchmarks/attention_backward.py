"""Attention backward passes (issue 22): tensorfuse's backward — what autograd runs for a
``tf.compile``'d library kernel (the attention backward template on a GPU), and with ``--generic``
also the backward program ``tf.grad`` compiles (TVM's default schedule) — against FlexAttention's
backward (torch.compile) and SDPA's (cuDNN and FlashAttention backends): one process, the same
GPU, bf16.

    python -m benchmarks.attention_backward --sizes 1024,4096 [--csv PATH]
    python -m benchmarks.attention_backward --kernels --variants full,causal --head-dim 64
    python -m benchmarks.attention_backward --layouts --sizes 4096,16384

Every implementation's gradients are first checked against float64 autograd of the variant's
reference at a ragged size (poisoned outputs: NaN-filled ``out=`` where the kernel takes one),
then timed with ``do_bench`` (backward only: the forward runs once outside the timing). Rows
``attention_bwd/<variant>``; TFLOP/s count the backward's 2.5 × the forward's FLOPs (the five
GEMM-shaped products, times the mask's density).
"""
from __future__ import annotations

import argparse

import torch

import tensorfuse as tf
from benchmarks.attention import compiled_flex, density, mask_block, variants, with_documents
from benchmarks.common import Row, bench, write_csv

VARIANTS = ("full", "causal", "alibi", "softcap", "gqa_causal", "sliding_window", "prefix_lm",
            "neighborhood", "document")


def _reference_grads(q, k, v, dout, scale, score_mod, mask_mod):
    """float64 autograd of the variant written in torch (scores, mask, softmax, values)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.einsum("bhid,bhjd->bhij", q, kk) * scale
    M, N = s.shape[-2:]
    qi = torch.arange(M, device=s.device).view(-1, 1) + (N - M)
    kv = torch.arange(N, device=s.device).view(1, -1)
    h = torch.arange(s.shape[1], device=s.device).view(1, -1, 1, 1)
    if score_mod is not None:
        s = score_mod(s, None, h, qi, kv)
    if mask_mod is not None and getattr(mask_mod, "per_batch", False):
        keep = torch.stack([mask_mod(b, None, qi, kv) for b in range(s.shape[0])])[:, None]
        s = s.masked_fill(~keep, float("-inf"))
    elif mask_mod is not None:
        s = s.masked_fill(~mask_mod(None, None, qi, kv), float("-inf"))
    out = torch.einsum("bhij,bhjd->bhid", torch.softmax(s, -1), vv)
    return torch.autograd.grad(out, (q, k, v), dout.double())


def tail(kernel, scale: float, extra: dict) -> list:
    """The kernel's arguments after q, k and v, in its parameters' order (the variant's scalars
    and tensors, such as documents' ids, beside ``scale``)."""
    given = {"scale": scale, **extra}
    return [given[p.name] for p in kernel.program.params[3:]]


def _by_kind(q, k, v, scale: float, extra: dict) -> tuple[dict, dict]:
    """The template kernels' ``(tensors, scalars)`` by name: q, k, v and the variant's tensors
    (documents' ids); ``scale`` and the variant's scalars."""
    tensors = {"q": q, "k": k, "v": v}
    scalars = {"scale": scale}
    for name, value in extra.items():
        (tensors if isinstance(value, torch.Tensor) else scalars)[name] = value
    return tensors, scalars


def _errors(got, want) -> list[float]:
    return [float((g.double() - w).norm() / w.norm()) for g, w in zip(got, want)]


def _error(got, want) -> float:
    return max(_errors(got, want))


def check(name: str, generic: bool, log=print) -> float:
    """Worst relative error of tensorfuse's gradients (autograd through the compiled kernel, and
    ``tf.grad``'s program with ``generic``) at a ragged size (M=N=200, D=64)."""
    kernel, extra, score_mod, mask_mod, _, hq, hkv = variants(200, B=1, H=16, window=48)[name]
    extra, mask_mod = with_documents(extra, mask_mod, 1, 200, torch.Generator().manual_seed(0))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, dout = (torch.randn(1, hq, 200, 64, device="cuda", generator=gen).bfloat16()
               for _ in range(2))
    k, v = (torch.randn(1, hkv, 200, 64, device="cuda", generator=gen).bfloat16()
            for _ in range(2))
    scale = 64 ** -0.5
    want = _reference_grads(q, k, v, dout, scale, score_mod, mask_mod)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = tf.compile(kernel)(*leaves, *tail(kernel, scale, extra))
    errors = _errors(torch.autograd.grad(out, leaves, dout), want)
    err = max(errors)
    log(f"  {name}: dq / dk / dv errors {' / '.join(f'{e:.1e}' for e in errors)}")
    if generic:
        err = max(err, _error(tf.grad(kernel)(q, k, v, *tail(kernel, scale, extra), dout), want))
    log(f"  {name}: tensorfuse gradient error {err:.1e}{'' if err < 2e-2 else '  WRONG'}")
    return err


def run(sizes, B: int = 2, H: int = 16, D: int = 128, generic: bool = False,
        names=VARIANTS, log=print) -> list[Row]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    flex = compiled_flex()
    rows = []
    for name in names:
        err = check(name, generic, log)
        for S in sizes:
            kernel, extra, score_mod, mask_mod, sdpa, hq, hkv = variants(S, B=B, H=H)[name]
            extra, mask_mod = with_documents(extra, mask_mod, B, S,
                                             torch.Generator().manual_seed(S))
            q, dout = (torch.randn(B, hq, S, D, device="cuda").bfloat16() for _ in range(2))
            k, v = (torch.randn(B, hkv, S, D, device="cuda").bfloat16() for _ in range(2))
            scale = D ** -0.5
            flops = 2.5 * 4 * B * hq * S * S * D * density(mask_mod, B, hq, S)
            shape = f"B{B} H{hq}/{hkv} S{S} D{D} bf16"
            impls = {}
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]

            def timed_backward(out):
                return bench(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))

            note = f"gradient error {err:.1e} at S=200"
            try:
                f = tf.compile(kernel)
                out = f(*leaves, *tail(kernel, scale, extra))
                impls["tensorfuse (autograd)"] = (timed_backward(out), note)
                # the forward as autograd records it (it also writes the log-sum-exp) and plain,
                # alternated over three rounds (best of each)
                forward_flops = flops / 2.5
                times: dict = {}
                for _ in range(3):
                    for label, args in (("tensorfuse forward", (q, k, v)),
                                        ("tensorfuse forward (recorded, saves LSE)", leaves)):
                        ms = bench(lambda: f(*args, *tail(kernel, scale, extra)))
                        times[label] = min(times.get(label, ms), ms)
                for label, ms in times.items():
                    log(f"{name:9} S={S:6} {label:40} {ms:9.3f} ms "
                        f"{forward_flops / ms / 1e9:7.1f} TFLOP/s")
                    rows.append(Row(f"attention_fwd/{name}", shape, label, ms,
                                    forward_flops / ms / 1e9, 0.0, 0.0, "best of 3 rounds"))
            except Exception as exc:  # noqa: BLE001 - report and go on
                log(f"  tensorfuse {name} S={S}: {type(exc).__name__}: {exc}"[:300])
            if generic:
                backward = tf.compile(tf.grad(kernel))
                args = (q, k, v, *tail(kernel, scale, extra), dout)
                impls["tensorfuse (tf.grad program)"] = (bench(lambda: backward(*args)), note)
            try:
                impls["flex_attention"] = (flex_backward_ms(flex, leaves, dout, score_mod,
                                                            mask_mod, S, scale), "")
            except Exception as exc:  # noqa: BLE001
                log(f"  flex {name} S={S}: {type(exc).__name__}: {exc}"[:300])
            if sdpa is not None:
                for label, backend in (("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
                                       ("sdpa flash", SDPBackend.FLASH_ATTENTION)):
                    try:
                        with sdpa_kernel([backend]):
                            out = torch.nn.functional.scaled_dot_product_attention(
                                *leaves, scale=scale, **sdpa)
                            impls[label] = (timed_backward(out), "")
                    except Exception as exc:  # noqa: BLE001
                        log(f"  {label} {name} S={S}: {type(exc).__name__}: {exc}"[:200])
            flex_ms = impls.get("flex_attention", (None,))[0]
            for label, (ms, note) in impls.items():
                ratio = flex_ms / ms if flex_ms else 0.0
                log(f"{name:9} S={S:6} {label:26} {ms:9.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s "
                    f"{ratio:6.3f}x flex")
                rows.append(Row(f"attention_bwd/{name}", shape, label, ms, flops / ms / 1e9,
                                0.0, ratio, note))
    return rows


def flex_backward_ms(flex, leaves, dout, score_mod, mask_mod, S: int, scale: float) -> float:
    """FlexAttention's backward alone (the forward run once outside the timing) on ``leaves``
    (q, k, v that require gradients), its block mask made from ``mask_mod``."""
    bm = mask_block(mask_mod, leaves[0].shape[0], S)
    out = flex(*leaves, score_mod=score_mod, block_mask=bm, scale=scale,
               enable_gqa=leaves[0].shape[1] != leaves[1].shape[1])
    return bench(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))


def sweep(knob_sets, sizes=(4096,), B: int = 2, H: int = 16, D: int = 128,
          names=("full", "causal"), log=print) -> list[Row]:
    """The backward template's kernels at other knob settings (``BackwardKnobs`` fields as
    ``m1,n1,m2,n2,warps,stages[,merged[,saved]]``; ``saved``: from the log-sum-exp the forward
    saves, else recomputed), timed on the same inputs: which defaults to keep."""
    from tensorfuse.schedule_templates.attention_backward import (BackwardKnobs,
                                                                  plan_attention_backward)
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton.attention_backward import AttentionBackwardKernels

    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.attention_chain import with_logsumexp

    rows = []
    for name, S in ((n, S) for n in names for S in sizes):
        kernel, extra, _, mask_mod, _, hq, hkv = variants(S, B=B, H=H)[name]
        extra, mask_mod = with_documents(extra, mask_mod, B, S, torch.Generator().manual_seed(S))
        q, dout = (torch.randn(B, hq, S, D, device="cuda").bfloat16() for _ in range(2))
        k, v = (torch.randn(B, hkv, S, D, device="cuda").bfloat16() for _ in range(2))
        scale = D ** -0.5
        _, fusion = choose(kernel.program, get_target("cuda"))
        saving = tf.compile(ProgramKernel(with_logsumexp(kernel.program, fusion.names)))
        out, lse = saving(q, k, v, *tail(kernel, scale, extra))
        dims = {"B": B, "H": hq, "M": S, "N": S, "D": D}
        if hkv != hq:
            dims["HKV"] = hkv
        plan = plan_attention_backward(kernel.program, fusion, dims)
        flops = 2.5 * 4 * B * hq * S * S * D * density(mask_mod, B, hq, S)
        tensors, scalars = _by_kind(q, k, v, scale, extra)
        reference = None
        for text in knob_sets:
            fields = [int(x) for x in text.split(",")]
            saved = lse if len(fields) > 7 and fields[7] else None
            knobs = BackwardKnobs(*fields[:6], *[bool(x) for x in fields[6:7]])
            try:
                made = AttentionBackwardKernels(plan, knobs)
                got = made(tensors, scalars, out, dout, saved)
                reference = got if reference is None else reference
                diff = max(float((a.float() - b.float()).norm() / b.float().norm())
                           for a, b in zip(got, reference))
                ms = bench(lambda: made(tensors, scalars, out, dout, saved))
            except Exception as exc:  # noqa: BLE001 - a setting that does not fit
                log(f"  sweep {name} {text}: {type(exc).__name__}: {exc}"[:200])
                continue
            log(f"sweep {name:7} S={S} knobs {text:22} {ms:8.3f} ms "
                f"{flops / ms / 1e9:7.1f} TFLOP/s  (vs first setting {diff:.1e})")
            rows.append(Row(f"attention_bwd_knobs/{name}", f"B{B} H{hq} S{S} D{D} bf16",
                            f"knobs {text}", ms, flops / ms / 1e9, 0.0, 0.0, ""))
    return rows


def kernels(sizes, names=("full", "causal", "gqa_causal"), B: int = 2, H: int = 16,
            D: int = 128, log=print) -> list[Row]:
    """The two backward kernels of the template on the same inputs and the forward's saved
    log-sum-exp — the sm_90a kernel (``TENSORFUSE_ATTENTION_BACKWARD=hopper``) and the Triton
    kernels — against SDPA's backward (cuDNN, flash) or, for masks SDPA has no variant of,
    FlexAttention's, each checked against the Triton kernels' gradients first. Rows
    ``attention_bwd_kernels/<variant>`` (no ceiling measured: the report compares each with
    the best alternative)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.hopper_attention_backward import hopper_backward
    from tensorfuse.schedule_templates.attention_backward import (BackwardKnobs,
                                                                  plan_attention_backward)
    from tensorfuse.schedule_templates.attention_chain import with_logsumexp
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton.attention_backward import AttentionBackwardKernels

    rows = []
    target = get_target("cuda")
    for name, S in ((n, S) for n in names for S in sizes):
        kernel, extra, score_mod, mask_mod, sdpa, hq, hkv = variants(S, B=B, H=H)[name]
        extra, mask_mod = with_documents(extra, mask_mod, B, S, torch.Generator().manual_seed(S))
        q, dout = (torch.randn(B, hq, S, D, device="cuda").bfloat16() for _ in range(2))
        k, v = (torch.randn(B, hkv, S, D, device="cuda").bfloat16() for _ in range(2))
        scale = D ** -0.5
        _, fusion = choose(kernel.program, target)
        saving = tf.compile(ProgramKernel(with_logsumexp(kernel.program, fusion.names)))
        out, lse = saving(q, k, v, *tail(kernel, scale, extra))
        dims = {"B": B, "H": hq, "M": S, "N": S, "D": D, **({"HKV": hkv} if hkv != hq else {})}
        plan = plan_attention_backward(kernel.program, fusion, dims)
        flops = 2.5 * 4 * B * hq * S * S * D * density(mask_mod, B, hq, S)
        tensors, scalars = _by_kind(q, k, v, scale, extra)
        triton = AttentionBackwardKernels(plan,
                                          BackwardKnobs.for_head_dim(plan.widest_tile_dim))
        made = {"tensorfuse triton": triton,
                "tensorfuse hopper": hopper_backward(plan, target, triton, chosen=True)}
        want = triton(tensors, scalars, out, dout, lse)
        times, notes = {}, {}
        for label, run_ in made.items():
            if run_ is None:
                continue
            got = run_(tensors, scalars, out, dout, lse)
            notes[label] = "vs triton " + " / ".join(
                f"{float((a.float() - b.float()).norm() / b.float().norm()):.1e}"
                for a, b in zip(got, want))
            times[label] = bench(lambda: run_(tensors, scalars, out, dout, lse))
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        if sdpa is None:   # masks SDPA has no variant of: FlexAttention is the alternative
            times["flex_attention"] = flex_backward_ms(compiled_flex(), leaves, dout, score_mod,
                                                       mask_mod, S, scale)
        for label, backend in (("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
                               ("sdpa flash", SDPBackend.FLASH_ATTENTION)):
            if sdpa is None:
                continue
            with sdpa_kernel([backend]):
                o = torch.nn.functional.scaled_dot_product_attention(*leaves, scale=scale,
                                                                     **sdpa)
                times[label] = bench(lambda: torch.autograd.grad(o, leaves, dout,
                                                                 retain_graph=True))
        cudnn = times.get("sdpa cudnn")
        shape = f"B{B} H{hq}/{hkv} S{S} D{D} bf16"
        for label, ms in times.items():
            ratio = cudnn / ms if cudnn else 0.0
            log(f"{name:10} S={S:6} D={D} {label:18} {ms:8.3f} ms {flops / ms / 1e9:7.1f} "
                f"TFLOP/s {ratio:5.2f}x cudnn {notes.get(label, '')}")
            rows.append(Row(f"attention_bwd_kernels/{name}", shape, label, ms, flops / ms / 1e9,
                            0.0, 0.0, notes.get(label, "")))
    return rows


def _causal(b, h, i, j):
    return i >= j


def _layout_runs(B: int, S: int, H: int, HKV: int, D: int) -> tuple[dict, object]:
    """``{label: (leaves, forward)}`` of :func:`layouts` at ``S`` keys, and the output's
    gradient (``[B, H, S, D]``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tensorfuse.kernels as K
    from benchmarks.user_kernels import bshd_gqa_causal

    scale = D ** -0.5
    fused = 3 * torch.randn(B, S, H + 2 * HKV, D, device="cuda").bfloat16()
    bshd = [fused[:, :, a:b].detach().requires_grad_()
            for a, b in ((0, H), (H, H + HKV), (H + HKV, H + 2 * HKV))]
    bhsd = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in bshd]
    runs = {"tensorfuse [B, S, H, D]": (bshd, lambda ts: tf.compile(bshd_gqa_causal)(
                *ts, scale).transpose(1, 2)),
            "tensorfuse [B, H, S, D]": (bhsd, lambda ts: tf.compile(K.gqa_causal_attention)(
                *ts, scale))}
    for label, backend in (("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
                           ("sdpa flash", SDPBackend.FLASH_ATTENTION)):
        def sdpa(ts, backend=backend):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(
                    *(t.transpose(1, 2) for t in ts), is_causal=True, scale=scale,
                    enable_gqa=True)
        runs[label] = (bshd, sdpa)
    return runs, torch.randn(B, H, S, D, device="cuda").bfloat16()


def _by_role(t, S: int):
    """A ``[B, S, H, D]`` tensor as ``[B, H, S, D]``; a ``[B, H, S, D]`` one as it is."""
    return t.transpose(1, 2) if t.shape[1] == S and t.shape[2] != S else t


def layouts(sizes, B: int = 2, H: int = 32, HKV: int = 8, D: int = 128, log=print) -> list[Row]:
    """GQA-causal attention's backward (autograd through ``tf.compile``) on ``[B, S, H, D]``
    q, k and v sliced out of one fused projection, as transformers keeps them
    (``benchmarks.user_kernels.bshd_gqa_causal``: read in place through their strides), against
    the same attention on contiguous ``[B, H, S, D]`` tensors and SDPA's backward (cuDNN,
    flash) on the transposed views — each checked against float64 at a ragged length first.
    Rows ``attention_bwd_layouts/gqa_causal``."""
    S0 = 333
    runs, dout = _layout_runs(1, S0, H, HKV, D)
    errors = {}
    for label, (leaves, forward) in runs.items():
        grads = torch.autograd.grad(forward(leaves), leaves, dout)
        want = _reference_grads(*(_by_role(t, S0) for t in leaves), dout, D ** -0.5, None,
                                _causal)
        errors[label] = _error([_by_role(g, S0) for g in grads], want)
    rows = []
    for S in sizes:
        runs, dout = _layout_runs(B, S, H, HKV, D)
        flops = 2.5 * 4 * B * H * S * S * D * density(_causal, B, H, S)
        for label, (leaves, forward) in runs.items():
            out = forward(leaves)
            ms = bench(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))
            note = f"gradient error {errors[label]:.1e} at S={S0}" + \
                ("" if errors[label] < 2e-2 else " WRONG")
            log(f"gqa_causal S={S:6} {label:24} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s "
                f"{note}")
            rows.append(Row("attention_bwd_layouts/gqa_causal", f"B{B} H{H}/{HKV} S{S} D{D} bf16",
                            label, ms, flops / ms / 1e9, 0.0, 0.0, note))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--csv", default=None)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--generic", action="store_true",
                        help="also time tf.grad's program (TVM's default schedule: slow)")
    parser.add_argument("--sweep", default="", help="knob settings m1,n1,m2,n2,warps,stages"
                        "[,merged[,saved]] separated by ';' (timed on "
                        "--sweep-variants at --sweep-sizes)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--sweep-sizes", default="4096")
    parser.add_argument("--sweep-variants", default="full,causal")
    parser.add_argument("--kernels", action="store_true",
                        help="only the backward kernels (sm_90a and Triton) against SDPA's, on "
                        "--variants at --sizes and --head-dim")
    parser.add_argument("--layouts", action="store_true",
                        help="only GQA-causal's backward on [B, S, H, D] against [B, H, S, D] "
                        "and SDPA's, at --sizes")
    args = parser.parse_args(argv)
    if args.layouts:
        rows = layouts([int(s) for s in args.sizes.split(",")])
        if args.csv:
            write_csv(rows, args.csv)
        return
    if args.kernels:
        rows = kernels([int(s) for s in args.sizes.split(",")], args.variants.split(","),
                       D=args.head_dim)
        if args.csv:
            write_csv(rows, args.csv)
        return
    rows = sweep(args.sweep.split(";"), [int(s) for s in args.sweep_sizes.split(",")],
                 names=args.sweep_variants.split(",")) if args.sweep else []
    rows += run([int(s) for s in args.sizes.split(",")], D=args.head_dim, generic=args.generic,
                names=args.variants.split(","))
    if args.csv:
        write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
