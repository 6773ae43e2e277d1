"""Every kernel configuration the tests and the benchmarks generate, and a hash of its source.

The emitters in ``tensorfuse/targets/`` are restructured often (parts by role, shared device
functions); a restructuring that claims to change no kernel must leave every generated source
byte-identical. :func:`cases` lists the configurations — attention variants × head dims ×
dtypes × classes of ``N mod block_n`` × knobs on the Hopper template, the tiled (map) and
block-sparse masks, GEMM, FFN and cluster kernels, cluster decode, row tiles at several widths,
the Triton attention forward (sm_80), decode's split update and backward, the Hopper backward
(by variant, head dim and layout), and the ROCm sources —
with everything that could move them pinned: no tuning database, 132 SMs.

    python -m tests.targets.golden_sources            # print "name sha" lines (on all cores)
    python -m tests.targets.golden_sources --write    # regenerate golden_sources.txt
    python -m tests.targets.golden_sources --dump DIR # every source into DIR (to diff two trees)

``test_golden_sources.py`` compares them with ``golden_sources.txt``. Where a change is deliberate,
regenerate the file in the same commit and show in the commit message that the SASS of the
affected kernels (``cuobjdump``: instruction counts, spills) is unchanged, or a GPU run that the
speed is kept.
"""
from __future__ import annotations

import hashlib
import os
import sys
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

GOLDEN = os.path.join(os.path.dirname(__file__), "golden_sources.txt")
SMS = 132   # the H100/H200 SM count the persistent schedules and cluster sizes are made for

Case = tuple[str, Callable[[], str]]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextmanager
def pinned() -> Iterator[None]:
    """No tuning records and a fixed SM count, whatever this machine has."""
    import tempfile

    import importlib

    users = [importlib.import_module(f"tensorfuse.{m}") for m in   # where local_gpu is bound
             ("targets.cuda.module", "schedule_templates.cluster",
              "schedule_templates.hopper_gemm")]
    with tempfile.TemporaryDirectory() as cache:
        saved_env = os.environ.get("TENSORFUSE_CACHE")
        saved_gpu = [m.local_gpu for m in users]
        os.environ["TENSORFUSE_CACHE"] = cache
        for m in users:   # None: sized for SMS SMs, the templates' value without a GPU
            m.local_gpu = lambda: None
        try:
            yield
        finally:
            for m, saved in zip(users, saved_gpu):
                m.local_gpu = saved
            if saved_env is None:
                os.environ.pop("TENSORFUSE_CACHE", None)
            else:
                os.environ["TENSORFUSE_CACHE"] = saved_env


_COMPILED: dict = {}


def compiled(kernel, target: str, dynamic: bool = False):
    """``tf.compile(kernel, target, dynamic=dynamic)``, made once per (kernel, target, dynamic):
    each size exactly unless asked (the sources must not depend on the order of the cases)."""
    import tensorfuse as tf

    if (kernel, target, dynamic) not in _COMPILED:
        _COMPILED[kernel, target, dynamic] = tf.compile(kernel, target, dynamic=dynamic)
    return _COMPILED[kernel, target, dynamic]


def _sizes(kernel, every: dict) -> dict:
    return {d: every[d] for d in kernel.program.dim_names() if d in every}


PREFILL = dict(B=2, H=16, HKV=4, M=4096, N=4096, D=128)
MAPS = {"neighborhood_attention": dict(radius=64),
        "neighborhood_attention_2d": dict(width=64, radius=3, dilation=1),
        "neighborhood_attention_3d": dict(height=16, width=16, radius=2, causal=1, M=2048,
                                          N=2048),
        "sliding_window_attention": dict(window=256), "prefix_lm_attention": dict(prefix=512)}


def _map(name: str) -> dict:
    """A variant's scalars (a map's shape, a window), without its sizes."""
    return {k: v for k, v in MAPS.get(name, {}).items() if k not in ("M", "N")}


def _hopper_cases() -> Iterator[Case]:
    """The Hopper attention template (CUDA C++) by schedule, and as ``tf.compile`` picks it."""
    import tensorfuse.kernels as K
    from benchmarks.attention_unlisted import UNLISTED
    from benchmarks.hopper_attention import causal_attention_f16
    from tests.schedule_templates.test_hopper_attention import hopper as hopper_by_hand

    made: dict = {}

    def hopper(kernel, **knobs):
        key = (kernel, tuple(sorted(knobs.items())))
        if key not in made:
            made[key] = hopper_by_hand(kernel, **knobs)
        return made[key]

    def source(kernel, knobs: dict, sizes: dict) -> Callable[[], str]:
        return lambda: hopper(kernel, **knobs).source(**sizes)

    for name in sorted(K.ATTENTION_VARIANTS):
        kernel = K.ALL[name]
        for D in (64, 128, 256):
            for N in (4096, 1000, 4096 + 32, 176 * 20):
                # the map variants' plans are costly to make (their patches): fewer of them
                if (D != 128 or "neighborhood" in name) and N != 4096 or \
                        name.startswith("neighborhood_attention_") and D != 128:
                    continue
                sizes = _sizes(kernel, dict(PREFILL, D=D, N=N, M=N))
                sizes.update(MAPS.get(name, {}))
                yield f"hopper:{name}:D={D}:N={N}", source(kernel, {}, sizes)
    knob_sets = [dict(block_n=128), dict(block_n=176), dict(stages=3), dict(consumers=1),
                 dict(overlap=False), dict(pingpong=False),
                 dict(consumers=1, block_n=64, ctas_per_sm=2)] + \
        [dict(schedule=s) for s in ("grid", "dynamic", "snake", "split")]
    for name in ("attention", "causal_attention", "gqa_causal_attention"):
        kernel = K.ALL[name]
        for knobs in knob_sets:
            if knobs.get("schedule") == "split" and name != "attention":
                continue   # unmasked plans only
            label = ",".join(f"{k}={v}" for k, v in knobs.items())
            yield f"hopper:{name}:{label}", source(kernel, knobs, _sizes(kernel, PREFILL))
    f16 = dict(B=2, H=16, M=4096, N=4096, D=128)
    yield "hopper:causal_attention_f16", source(causal_attention_f16, {}, f16)
    yield "hopper:causal_attention_f16:D=64", source(causal_attention_f16, {}, dict(f16, D=64))
    for name, (kernel, _, heads) in sorted(UNLISTED.items()):
        sizes = dict(B=2, H=heads[0], HKV=heads[1], M=1024, N=1024, D=128, R=2047)
        yield f"hopper:unlisted:{name}", source(kernel, {}, _sizes(kernel, sizes))
    from benchmarks.user_kernels import two_head_dims_causal   # p·v over another head dim
    for dqk, dv in ((192, 128), (256, 128), (128, 256)):
        sizes = dict(B=2, H=16, M=4096, N=4096, DQK=dqk, DV=dv)
        yield f"hopper:two_head_dims:{dqk}/{dv}", source(two_head_dims_causal, {}, sizes)
    from tests.schedule_templates import test_score_tiles as tiles   # scores' tensors as tiles
    for kernel, sizes in ((tiles.bias_per_head, dict(B=2, H=16, M=2048, N=2048, D=128)),
                          (tiles.float_mask, dict(B=2, H=16, M=2048, N=2048, D=64)),
                          (tiles.causal_bias_gqa, dict(B=2, H=32, G=8, M=4096, N=4096, D=128))):
        yield f"hopper:score_tile:{kernel.name}", \
            lambda k=kernel, s=sizes: compiled(k, "cuda:sm_90a").source(**s)
    yield from _lse_and_sparse_cases()
    for name in sorted(K.ATTENTION_VARIANTS):   # as tf.compile picks: prefill, decode, few rows
        kernel = K.ALL[name]
        for label, M, N in (("prefill", 2048, 2048), ("decode", 1, 32768), ("few", 16, 4096)):
            if label == "prefill" and "neighborhood" in name:
                continue   # the Hopper template's source, as above (their patches are costly)
            sizes = {**_sizes(kernel, dict(PREFILL, M=M, N=N)), **_map(name)}
            yield f"compile:sm_90a:{name}:{label}", \
                lambda k=kernel, s=sizes: compiled(k, "cuda:sm_90a").source(**s)


def _lse_and_sparse_cases() -> Iterator[Case]:
    """The forward that saves the log-sum-exp (autograd's), a block-sparse lookup mask, a strided
    neighbourhood (the map tiles with a stride)."""
    import tensorfuse.kernels as K
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.attention_chain import with_logsumexp
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target
    from tests.schedule_templates.test_block_sparse import block_sparse_attention
    from tests.schedule_templates.test_strided_neighborhood import strided_neighborhood_2d

    for name in ("causal_attention", "gqa_attention"):
        program = K.ALL[name].program
        _, fusion = choose(program, get_target("cuda:sm_90a"))
        saving = ProgramKernel(with_logsumexp(program, fusion.names))
        sizes = _sizes(K.ALL[name], dict(PREFILL, M=2048, N=2048))
        yield f"compile:sm_90a:lse:{name}", \
            lambda k=saving, s=sizes: compiled(k, "cuda:sm_90a").source(**s)
    sparse = dict(B=1, H=2, M=1024, N=1024, D=128, MB=8, NB=8)
    yield "compile:sm_90a:block_sparse", \
        lambda: compiled(block_sparse_attention, "cuda:sm_90a").source(**sparse)
    strided = dict(B=1, H=2, M=4096, N=4096, D=128, width=64, radius=3, stride=2)
    yield "compile:sm_90a:strided_neighborhood_2d", \
        lambda: compiled(strided_neighborhood_2d, "cuda:sm_90a").source(**strided)


def _gemm_cases() -> Iterator[Case]:
    """The Hopper GEMM and FFN, the cluster GEMM chain (mma.sync and wgmma bodies) and the
    cluster decode kernel."""
    import tensorfuse as tf
    import tensorfuse.kernels as K
    from benchmarks.gemm import KERNELS
    from tensorfuse.schedule_templates.hopper_ffn import hopper_ffn
    from tensorfuse.targets import get_target
    from tests.schedule_templates.test_cluster import _decode as decode_by_hand
    from tests.schedule_templates.test_cluster import _ffn as ffn_by_hand

    gemm_sizes = [dict(M=1000, K=520, N=776), dict(M=8192, K=8192, N=8192),
                  dict(M=128, K=4096, N=14336)]
    gemm_knobs = [{}, dict(epilogue="staged"), dict(cluster=2), dict(cluster=2, multicast="leader"),
                  dict(consumers=1, block_n=128), dict(split_tail=False), dict(pace=4, cluster=1),
                  dict(weights_l2="evict_first"), dict(stages=3, group_m=4)]
    for name in sorted(KERNELS):
        kernel = KERNELS[name]
        for sizes in gemm_sizes:
            label = ",".join(f"{k}={v}" for k, v in sizes.items())
            yield f"compile:sm_90a:gemm:{name}:{label}", \
                lambda k=kernel, s=sizes: compiled(k, "cuda:sm_90a").source(**s)
    for knobs in gemm_knobs:
        label = ",".join(f"{k}={v}" for k, v in knobs.items())
        yield f"hopper_gemm:matmul:{label}", lambda kn=knobs: tf.schedule(
            K.matmul, "cuda:sm_90a").apply_template("hopper_gemm", **kn).compile().source(
                M=8192, K=8192, N=8192)
    ffn_sizes = [dict(M=m, K=4096, N=14336, O=4096) for m in (16, 128, 1024, 8192)]
    for name in ("ffn_gelu", "ffn_swiglu", "ffn_swiglu_linear"):
        kernel = K.ALL[name]
        for sizes in ffn_sizes:
            yield f"compile:sm_90a:{name}:M={sizes['M']}", \
                lambda k=kernel, s=sizes: compiled(k, "cuda:sm_90a").source(**s)
    for knobs in (dict(dependent=False), dict(up=dict(pace=4, cluster=1), down=dict(cluster=1))):
        label = ",".join(f"{k}={v}" for k, v in knobs.items())
        yield f"hopper_ffn:ffn_swiglu:{label}", lambda kn=knobs: hopper_ffn(
            K.ffn_swiglu, None, get_target("cuda:sm_90a"), **kn).source(**ffn_sizes[2])
    cluster_knobs = [{}, dict(exchange="gather"), dict(exchange="gather", cluster=2),
                     dict(copy="tma"), dict(copy="tma", exchange="peer"), dict(copy="producer"),
                     dict(mma="mma_sync"), dict(mma="mma_sync", exchange="gather")]
    for name in ("ffn_gelu", "ffn_swiglu"):
        for knobs in cluster_knobs:
            for M in (128, 1024):
                label = ",".join(f"{k}={v}" for k, v in knobs.items())
                yield f"cluster:{name}:{label}:M={M}", \
                    lambda k=K.ALL[name], kn=knobs, m=M: ffn_by_hand(k, **kn).source(
                        M=m, K=4096, N=14336, O=4096)
    decode_knobs = [{}, dict(mma="fma", copy="cp.async"), dict(copy="cp.async"),
                    dict(warps=4), dict(stages=3), dict(cluster=4), dict(cluster=16)]
    for knobs in decode_knobs:
        for B, D, H in ((1, 128, 32), (8, 128, 32), (4, 64, 8), (2, 256, 8)):
            if D == 256 and knobs not in decode_knobs[:3]:
                continue   # more warps or stages do not fit at D = 256
            label = ",".join(f"{k}={v}" for k, v in knobs.items())
            sizes = dict(B=B, H=H, HKV=8, M=1, N=32768, D=D)
            yield f"cluster_decode:{label}:B={B},D={D},H={H}", \
                lambda kn=knobs, s=sizes: decode_by_hand(K.gqa_attention, **kn).source(**s)


def _triton_cases() -> Iterator[Case]:
    """Row tiles and the Triton attention forward, decode and backward; sm_80, sm_90a, ROCm."""
    import tensorfuse.kernels as K
    from tensorfuse.schedule_templates.attention_backward import (BackwardKnobs,
                                                                  plan_attention_backward)
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton.attention_backward import backward_source
    from tests.schedule_templates.test_templates import template_kernel as template

    rows = dict(M=4096, N=4096, V=32000)
    for name in sorted(K.ROW_KERNELS):
        kernel = K.ALL[name]
        for N in (1000, 4096, 8192, 16384, 50257, 65536):   # 50257: rows off 16-byte bounds
            sizes = _sizes(kernel, dict(rows, N=N, V=N))
            for target in ("cuda:sm_90a", "rocm:gfx942"):
                yield f"compile:{target}:{name}:N={N}", \
                    lambda k=kernel, t=target, s=sizes: compiled(k, t).source(**s)
        for N in (1000, 4096, 50257, 65536):   # sizes as arguments: the bucket's source
            sizes = _sizes(kernel, dict(rows, N=N, V=N))
            yield f"compile:cuda:sm_90a:{name}:dynamic:N={N}", \
                lambda k=kernel, s=sizes: compiled(k, "cuda:sm_90a", True).source(**s)
        sizes = _sizes(kernel, dict(rows, N=8192, V=8192))
        for knobs in (dict(reload=True, block=8192), dict(reload=False, block=4096),
                      dict(rows=4, num_warps=8), dict(block=1024, num_stages=3)):
            label = ",".join(f"{k}={v}" for k, v in knobs.items())
            yield f"row_reduction:{name}:{label}", \
                lambda n=name, kn=knobs, s=sizes: template(n, "cuda:sm_90a", **kn).source(**s)
    for name in sorted(K.ATTENTION_VARIANTS):
        kernel = K.ALL[name]
        for target in ("cuda:sm_80", "rocm:gfx942", "rocm:gfx90a"):
            for label, M, N in (("prefill", 1024, 1024), ("decode", 1, 4096)):
                sizes = {**_sizes(kernel, dict(PREFILL, M=M, N=N)), **_map(name)}
                yield f"compile:{target}:{name}:{label}", \
                    lambda k=kernel, t=target, s=sizes: compiled(k, t).source(**s)
        sizes = _sizes(kernel, dict(PREFILL, M=1, N=4096))
        yield f"attention:{name}:splits=8", \
            lambda n=name, s=sizes: template(n, "cuda:sm_90a", splits=8).source(**s)
        for D in (64, 128, 256):
            dims = _sizes(kernel, dict(PREFILL, M=1024, N=1024, D=D))
            knobs = BackwardKnobs.for_head_dim(D)   # the source is the same for any
            yield f"backward:{name}:D={D}", \
                lambda k=kernel, d=dims, kn=knobs: backward_source(
                    plan_attention_backward(k.program, choose(
                        k.program, get_target("cuda"))[1], d), kn)


@contextmanager
def _interpreting() -> Iterator[None]:
    """Sources made for Triton's interpreter (block lists walked to their static length)."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _interpreter_cases() -> Iterator[Case]:
    """The Triton sources the tests run in the interpreter: a masked attention's block lists, a
    split update, a row swept in blocks, a backward."""
    import tensorfuse as tf
    import tensorfuse.kernels as K
    from tensorfuse.schedule_templates.attention_backward import (BackwardKnobs,
                                                                  plan_attention_backward)
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton.attention_backward import backward_source

    def made(kernel, sizes):
        with _interpreting():
            return tf.compile(kernel, "cuda:sm_90a").for_sizes(**sizes).source(**sizes)

    for name, sizes in (("causal_attention", dict(B=1, H=2, M=16, N=300, D=64)),
                        ("document_attention", dict(B=1, H=2, M=200, N=200, D=64)),
                        ("gqa_attention", dict(B=1, H=8, HKV=2, M=4, N=5000, D=64)),
                        ("softmax", dict(M=64, N=65536)), ("rmsnorm", dict(M=64, N=20000))):
        yield f"interpreter:{name}", lambda k=K.ALL[name], s=sizes: made(k, s)
    for name in ("causal_attention", "document_attention"):
        kernel = K.ALL[name]
        dims = _sizes(kernel, dict(PREFILL, M=256, N=256, D=64))

        def backward(k=kernel, d=dims):
            with _interpreting():
                return backward_source(plan_attention_backward(
                    k.program, choose(k.program, get_target("cuda"))[1], d),
                    BackwardKnobs.for_head_dim(64))
        yield f"interpreter:backward:{name}", backward


def _hopper_backward_cases() -> Iterator[Case]:
    """The sm_90a attention backward: its variants (a factor, a bias, a pointwise score; masks
    of the block lists, one reading a tensor), head dims 64, 128 and 96 (in tiles of 128),
    grouped heads, a length whose dQ leaves L2 (key blocks side by side), ``[B, S, H, D]``
    tensors (4-D maps)."""
    import tensorfuse.kernels as K
    from benchmarks.user_kernels import bshd_gqa_causal
    from tensorfuse.schedule_templates.attention_backward import plan_attention_backward
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.hopper_attention_backward import plan_hopper_backward
    from tensorfuse.targets import get_target
    from tensorfuse.targets.cuda.hopper_attention_backward import backward_source

    def source(kernel, dims):
        plan = plan_attention_backward(
            kernel.program, choose(kernel.program, get_target("cuda:sm_90a"))[1], dims)
        return backward_source(plan_hopper_backward(plan, "sm_90a"),
                               [(p.name, p.dtype) for p in plan.program.scalar_params])

    every = dict(B=2, H=16, HKV=4, M=1000, N=1000, D=128)
    for name in ("attention", "causal_attention", "gqa_causal_attention",
                 "sliding_window_attention", "alibi_attention", "softcap_attention",
                 "document_attention"):
        for D in (64, 128):
            dims = _sizes(K.ALL[name], dict(every, D=D))
            yield f"hopper_backward:{name}:D={D}", lambda k=K.ALL[name], d=dims: source(k, d)
    yield "hopper_backward:attention:D=96", \
        lambda: source(K.attention, _sizes(K.attention, dict(every, D=96)))
    yield "hopper_backward:causal_attention:M=16384", lambda: source(
        K.causal_attention, _sizes(K.causal_attention, dict(every, M=16384, N=16384)))
    yield "hopper_backward:bshd_gqa_causal:D=128", \
        lambda: source(bshd_gqa_causal, _sizes(bshd_gqa_causal, every))


def cases() -> Iterator[Case]:
    """(name, a function that generates its source), in a fixed order."""
    yield from _hopper_cases()
    yield from _gemm_cases()
    yield from _triton_cases()
    yield from _interpreter_cases()
    yield from _hopper_backward_cases()


def hashes(part: int = 0, parts: int = 1) -> Iterator[tuple[str, str]]:
    """(name, digest of the source) for the cases of every ``parts``-th group from the
    ``part``-th, the inputs pinned. A group is a family's kernel (``hopper:causal_attention``,
    ``compile:rocm:gfx942:softmax``): its schedule is made once, in one process."""
    warnings.simplefilter("ignore")
    groups: dict[str, int] = {}
    with pinned():
        for name, make in cases():
            fields = name.split(":")
            group = ":".join(fields[:4 if fields[0] == "compile" else 2])
            if groups.setdefault(group, len(groups)) % parts == part:
                yield name.replace(" ", ""), digest(make())


def hashes_in_parallel(processes: int) -> dict[str, str]:
    """Every case's digest, the cases dealt to ``processes`` processes of this module."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # one thread each: thread pools of several processes spinning on two cores took 3× longer
    env.update(OMP_NUM_THREADS="1", TVM_NUM_THREADS="1")
    running = [subprocess.Popen([sys.executable, "-m", "tests.targets.golden_sources", "--part",
                                 f"{i}/{processes}"], cwd=root, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for i in range(processes)]
    found: dict[str, str] = {}
    for proc in running:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"generating the golden sources failed:\n{err[-4000:]}")
        found.update(line.split() for line in out.splitlines() if line.strip())
    return found


def read_golden() -> dict[str, str]:
    with open(GOLDEN) as f:
        return dict(line.split() for line in f if line.strip() and not line.startswith("#"))


def main(argv: list[str]) -> None:
    if "--dump" in argv:
        folder = argv[argv.index("--dump") + 1]
        os.makedirs(folder, exist_ok=True)
        warnings.simplefilter("ignore")
        with pinned():
            for name, make in cases():
                with open(os.path.join(folder, name.replace("/", "_")), "w") as f:
                    f.write(make())
        return
    if "--part" in argv:
        part, parts = map(int, argv[argv.index("--part") + 1].split("/"))
        for name, sha in hashes(part, parts):
            print(name, sha, flush=True)
        return
    lines = [f"{name} {sha}" for name, sha in hashes_in_parallel(os.cpu_count() or 1).items()]
    if "--write" in argv:
        with open(GOLDEN, "w") as f:
            f.write("# generated by `python -m tests.targets.golden_sources --write`\n")
            f.write("\n".join(lines) + "\n")
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
