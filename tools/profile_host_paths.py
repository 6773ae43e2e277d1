"""The Python of ``tf.compile``'s call paths on a machine without a GPU: first calls at new sizes
(a causal prompt length on the Hopper attention, a row width on the row template, a decode's cache
length), a small decode's steady call (the cluster decode's fast path) and the attention backward
through autograd, with the GPU's parts stubbed out — module
loads and launches, kept device memory, tensor maps, streams, Triton's launches — and CPU tensors
standing in for CUDA ones. What is left is tensorfuse's own host work: binding, choosing the
kernel, planning, the block lists, the launches' arguments.

    PYTHONPATH=. python tools/profile_host_paths.py [--only causal,rows] [--profile] [--top 30]

Its milliseconds are this CPU's, without the driver's and Triton's launch costs: compare runs of
it with each other, and a GPU's first calls with ``tools/profile_new_sizes.py``.
"""
import argparse
import cProfile
import dataclasses
import importlib
import pstats
import time

import torch


def stub_the_gpu() -> None:
    """Replace what needs a GPU with stand-ins that do nothing (or hand back CPU memory)."""
    from tensorfuse import binding, interop
    from tensorfuse.schedule_templates import block_bounds
    from tensorfuse.targets import TargetSpec, signature_call
    from tensorfuse.targets.cuda import cluster_decode, kernel as cuda_kernel, tma
    from tensorfuse.targets.cuda import module as cuda_module
    from tensorfuse.targets.triton import attention_backward, kernel as triton_kernel, launcher

    attention = importlib.import_module("tensorfuse.schedule_templates.hopper_attention")

    class Module:   # a built module whose kernels launch nothing
        def __getitem__(self, name):
            return lambda *args: None

    class Jitted:   # a jitted Triton function whose launches do nothing
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    def kept(shape, dtype, device):
        return torch.empty(shape, dtype=dtype if isinstance(dtype, torch.dtype)
                           else interop.torch_dtype(dtype))

    def describe(x):   # CPU tensors pass for CUDA ones
        info = real_describe(x)
        return dataclasses.replace(info, device="cuda") if info.framework == "torch" else info

    real_describe = interop.describe
    cuda_kernel.Launches.build = lambda self, target, built=None: setattr(self, "module",
                                                                          Module())
    cuda_kernel.on_torch_stream = lambda index, launch, *args: launch(*args)
    for module in (interop, attention, block_bounds, tma):
        if hasattr(module, "kept_empty"):
            module.kept_empty = kept
    tma.DeviceMaps.get = lambda self, key, make, device: torch.empty(384, dtype=torch.uint8)
    tma._encoded = lambda *args: bytes(128)   # maps encoded outside DeviceMaps (the backward's)
    cluster = importlib.import_module("tensorfuse.schedule_templates.cluster")
    for module in (cluster_decode, cluster):
        module.decode_tensor_maps = lambda *args, **kwargs: (bytes(128), bytes(128))
    TargetSpec.device = lambda self: None
    for module in (interop, cuda_kernel, signature_call):
        if hasattr(module, "device_index"):
            module.device_index = lambda device: 0
        if hasattr(module, "raw_stream"):
            module.raw_stream = lambda index: 0
    for module in (interop, binding):
        if hasattr(module, "describe"):
            module.describe = describe
    class Driver:   # the CUDA driver's launches, launching nothing
        def cuLaunchKernelEx(self, *args):
            return 0

    cuda_module.libcuda = lambda: Driver()
    cuda_module._load_function = lambda cubin, name, shared_bytes, cluster: (None, None)
    cuda_module.cubin_for = lambda source, target: b""
    torch.cuda.current_device = lambda: 0
    launcher.Launches.__call__ = lambda self, values: None
    launcher.JitOnce.__call__ = lambda self, grid, args, constexprs: None
    triton_kernel.launch_device = lambda kernel, bound: torch.device("cpu")
    attention_backward.load_kernel = lambda source, entry: Jitted()


def cases(calls: int):
    """(name, warm-up sizes, new sizes, inputs(size), call(inputs)) of each case."""
    import tensorfuse as tf
    import tensorfuse.kernels as K

    bf16 = dict(dtype=torch.bfloat16)
    causal = tf.compile(K.causal_attention, "cuda:sm_90a")
    yield ("causal", "causal prompt lengths, B1 H16 D128", [5000, 5100],
           [5200 + 100 * k for k in range(2 * calls)],
           lambda n: tuple(torch.randn(1, 16, n, 128, **bf16) for _ in range(3)),
           lambda q, k, v: causal(q, k, v, 0.088))
    softmax = tf.compile(K.softmax, "cuda:sm_90a")
    yield ("rows", "softmax widths, 4096 rows", [3008, 3024],
           [3040 + 16 * k for k in range(2 * calls)],
           lambda n: (torch.randn(4096, n, **bf16),), softmax)
    decode = tf.compile(K.gqa_attention, "cuda:sm_90a")
    yield ("decode", "decode cache lengths, B8 32/8 heads", [4096, 4097],
           [4098 + k for k in range(2 * calls)],
           lambda n: (torch.randn(8, 32, 1, 128, **bf16),
                      *(torch.randn(8, 8, n, 128, **bf16) for _ in range(2))),
           lambda q, k, v: decode(q, k, v, 0.088))
    small = (torch.randn(4, 8, 1, 128, **bf16), *(torch.randn(4, 1, 1024, 128, **bf16)
                                                  for _ in range(2)))
    yield ("steady", "a small decode's steady call, B4 8/1 heads, 1024 keys (the same call)",
           [0, 0], [0] * (2 * calls), lambda n: (), lambda: decode(*small, 0.088))
    from benchmarks.unlisted_kernels import latent_attention_decode
    latent = tf.compile(latent_attention_decode, "cuda:sm_90a")
    mla = (torch.randn(8, 128, 576, **bf16), torch.randn(8, 4096, 576, **bf16),
           torch.randn(8, 4096, 512, **bf16))
    yield ("staged", "the floor's stages: a latent decode, B8 H128 4096 keys (the same call)",
           [0, 0], [0] * (2 * calls), lambda n: (), lambda: latent(*mla, 0.04))
    from benchmarks.unlisted_kernels import paged_latent_decode
    paged = tf.compile(paged_latent_decode, "cuda:sm_90a")
    pages = torch.randn(1024, 64, 576, **bf16)
    table = torch.randperm(1024)[:512].reshape(8, 64).int()
    yield ("paged", "the floor's stages over a paged cache: a latent decode, B8 H128 4096 keys in "
           "pages of 64, the values a view (the same call)", [0, 0], [0] * (2 * calls),
           lambda n: (), lambda: paged(mla[0], pages, pages[..., :512], table, 0.04))
    window = tf.compile(K.sliding_window_attention, "cuda:sm_90a")
    leaves = [torch.randn(2, 16, 4096, 128, **bf16).requires_grad_() for _ in range(3)]
    grad = torch.randn(2, 16, 4096, 128, **bf16)
    out = window(*leaves, 0.088, 256)
    yield ("backward", "sliding-window attention backward, B2 H16 S4096 (the same call)", [0, 0],
           [0] * (2 * calls), lambda n: (), lambda: torch.autograd.grad(out, leaves, grad,
                                                                       retain_graph=True))
    from tensorfuse.kernels.layers import attention_kernel
    sinks = tf.compile(attention_kernel("bf16", False, True, False, "bf16"), "cuda:sm_90a")
    S = 1024   # the mask's blocks are counted on this CPU: host work is what is compared
    window = torch.ones(S, S, dtype=torch.bool).tril().triu(-127).expand(1, 1, S, S)
    q, (k, v) = torch.randn(1, 64, S, 64, **bf16), (torch.randn(1, 8, S, 64, **bf16)
                                                     for _ in range(2))
    leaves = [t.requires_grad_() for t in (q, k, v, torch.randn(64, **bf16))]
    grad = torch.randn(1, 64, S, 64, **bf16)
    yield ("sink_step", f"gpt-oss's sliding layer under a mask tensor: forward and backward, "
           f"B1 H64/8 S{S} (the same call)", [0, 0], [0] * (2 * calls), lambda n: (),
           lambda: torch.autograd.grad(sinks(*leaves[:3], window, leaves[3], 0.125), leaves,
                                       grad))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--only", default="", help="cases by name: causal, rows, decode, "
                        "steady, staged, paged, backward, sink_step")
    parser.add_argument("--profile", action="store_true", help="cProfile's top functions too")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    stub_the_gpu()
    only = set(filter(None, args.only.split(",")))
    for name, title, warm, new, inputs, call in cases(args.calls):
        if only and name not in only:
            continue
        for n in warm:
            call(*inputs(n))
        made = [inputs(n) for n in new]   # made before anything is timed
        timed, profiled = made[:args.calls], made[args.calls:]
        walls = []
        for arguments in timed:
            pair = []
            for _ in range(2):
                start = time.perf_counter()
                call(*arguments)
                pair.append((time.perf_counter() - start) * 1e3)
            walls.append(pair)
        print(f"== {title}: first/second call ms "
              + " ".join(f"{first:.3f}/{second:.3f}" for first, second in walls))
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            for arguments in profiled:
                call(*arguments)
            profile.disable()
            pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
