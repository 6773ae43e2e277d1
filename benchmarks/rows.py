"""Row reductions over [16384, 8192] bf16: tensorfuse against torch eager and torch.compile.
GB/s counts one read and one write of the matrix (the memory-bound floor)."""
from __future__ import annotations

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import Row, bench, relative_error

M, N = 16384, 8192


def cases():
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    eps = 1e-5
    return {
        "softmax": (K.softmax, {}, lambda x: torch.softmax(x, dim=-1)),
        "layernorm": (K.layernorm, dict(weight=w, bias=b, eps=eps),
                      lambda x: torch.nn.functional.layer_norm(x, (N,), w, b, eps)),
        "rmsnorm": (K.rmsnorm, dict(weight=w, eps=eps),
                    lambda x: torch.nn.functional.rms_norm(x, (N,), w, eps)),
    }


CHAINS = {"softmax": ("m", "l"), "layernorm": ("mean_sum", "var_sum"), "rmsnorm": ("ms_sum",)}
SWEEP = [dict(rows=r, num_warps=w) for r in (1, 2, 4) for w in (4, 8, 16)]


def tuned(name, kernel, x, extra, expected, log):
    """The row-reduction template over a small knob sweep: (ms, note) of the fastest correct."""
    best = None
    for knobs in SWEEP:
        try:
            sch = tf.schedule(kernel, "cuda")
            sch.rolling_update(*CHAINS[name], axis="j")
            sch.apply_template("row_reduction", **knobs)
            f = sch.compile()
            err = relative_error(f(x, **extra), expected)
            if err > 2e-2:
                log(f"  tensorfuse {name} {knobs}: WRONG ({err:.1e})")
                continue
            ms = bench(lambda: f(x, **extra))
            if best is None or ms < best[0]:
                best = (ms, f"err {err:.1e}; {knobs}")
        except Exception as exc:  # noqa: BLE001
            log(f"  tensorfuse {name} {knobs}: {type(exc).__name__}: {exc}"[:300])
    return best


def run(ceilings=None, log=print) -> list[Row]:
    copy = (ceilings or {}).get("copy_tbps", 3.0)
    rows = []
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    nbytes = 2 * M * N * 2
    for name, (kernel, extra, torch_fn) in cases().items():
        impls = {}
        expected = torch_fn(x.float()) if name == "softmax" else torch_fn(x)
        best = tuned(name, kernel, x, extra, expected, log)
        if best is not None:
            impls["tensorfuse"] = best
        impls["torch_eager"] = (bench(lambda: torch_fn(x)), "")
        compiled = torch.compile(torch_fn)
        compiled(x)
        impls["torch_compile"] = (bench(lambda: compiled(x)), "")
        for impl, (ms, note) in impls.items():
            gbps = nbytes / ms / 1e6
            rows.append(Row(f"rows/{name}", f"{M}x{N} bf16", impl, ms, 0.0, gbps,
                            gbps / 1e3 / copy, note))
        log(f"{name:10s} " + "  ".join(f"{i}={nbytes / ms / 1e6:7.1f}GB/s"
                                       for i, (ms, _) in impls.items()))
    return rows
