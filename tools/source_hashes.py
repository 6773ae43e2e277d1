"""Hash the generated source of every library kernel and every cluster kernel (no GPU needed).

    python tools/source_hashes.py > before.txt     # ... change the code generators ...
    python tools/source_hashes.py | diff before.txt -

One line per kernel: its name, the sizes, and the SHA-256 of the Triton source (library kernels
through ``tf.compile`` defaults for a CUDA sm_90a target, attention variants also through the
split update used for decode) or of the CUDA C++ (cluster kernels, a grid of knobs). A refactor of
the pipeline that claims to change nothing must print the same lines.
"""
from __future__ import annotations

import hashlib
import sys
import warnings

import tensorfuse as tf
import tensorfuse.kernels as K

PREFILL = dict(B=2, H=16, HKV=4, M=4096, N=4096, D=128)
DECODE = dict(B=4, H=32, HKV=8, M=1, N=4096, D=128)
ROWS = dict(M=4096, N=4096, V=32000, K=4096, O=4096)   # K, O: GEMM-shaped library kernels
FFN = [dict(M=m, K=4096, N=14336, O=4096) for m in (128, 1024, 8192)]
FFN_KNOBS = [{}, dict(exchange="gather"), dict(exchange="gather", cluster=2), dict(copy="tma"),
             dict(copy="tma", exchange="peer"), dict(copy="producer"), dict(mma="mma_sync")]
CLUSTER_DECODE = [dict(B=b, H=32, HKV=8, M=1, N=32768, D=128) for b in (1, 2, 4, 8)]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sizes_for(kernel, every: dict) -> dict:
    return {d: every[d] for d in kernel.program.dim_names() if d in every}


def lines():
    target = "cuda:sm_90a"
    for name in sorted(K.ALL):
        kernel = K.ALL[name]
        if name in ("ffn_gelu", "ffn_swiglu"):
            continue
        every = PREFILL if name in K.ATTENTION_VARIANTS else ROWS
        sizes = sizes_for(kernel, every)
        yield name, sizes, tf.compile(kernel, target).for_sizes(**sizes).source(**sizes)
        if name in K.ATTENTION_VARIANTS:
            sizes = sizes_for(kernel, DECODE)
            yield f"decode:{name}", sizes, tf.compile(kernel, target).for_sizes(**sizes).source(
                **sizes)
    for kernel in (K.ffn_gelu, K.ffn_swiglu):
        for knobs in FFN_KNOBS:
            sch = tf.schedule(kernel, target=target)
            sch.cluster_distribute("n", **knobs)
            f = sch.compile()
            for sizes in FFN:
                yield f"{kernel.program.name}{knobs}", sizes, f.source(**sizes)
    sch = tf.schedule(K.gqa_attention, target=target)
    sch.rolling_update("m", "l", "o", axis="j")
    sch.cluster_distribute("j")
    f = sch.compile()
    for sizes in CLUSTER_DECODE:
        yield "cluster_decode:gqa_attention", sizes, f.source(**sizes)


def main() -> None:
    warnings.simplefilter("ignore")
    for name, sizes, text in lines():
        size_text = ",".join(f"{k}={v}" for k, v in sizes.items())
        print(f"{name} {size_text} {digest(text)}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
