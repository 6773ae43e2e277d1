"""Launches reuse compiled Triton kernels by specialisation (``targets/triton/launcher.py``),
checked on the CPU with a stand-in for Triton's JIT and driver: a new signature whose arguments
specialise alike takes the kernel another compiled and launches it directly with its own grid and
arguments; one that specialises otherwise (an address off 16 bytes, a size not divisible by 16)
goes through the JIT; ``JitOnce`` (the attention backward's launches) does the same per call."""
from __future__ import annotations

import pytest
import torch

from tensorfuse.targets.triton import launcher


class _Compiled:
    """A compiled kernel as the JIT returns it: its C launch function records each launch."""

    def __init__(self, log: list):
        self.function, self.packed_metadata = object(), object()

        def launch(g0, g1, g2, stream, function, cooperative, pdl, a, b, packed, meta, enter,
                   leave, *args):
            log.append(("direct", (g0, g1, g2), stream, args))

        self.run = type("Run", (), dict(global_scratch_size=0, profile_scratch_size=0,
                                        launch=staticmethod(launch),
                                        launch_cooperative_grid=False, launch_pdl=False))()


class _Jit:
    """A jitted function: ``fn[grid](*args, **kwargs)`` compiles (a new kernel every time it is
    asked, as the JIT would for a new specialisation) and launches."""

    def __init__(self):
        self.log: list = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("jit", tuple(grid), None, args))
            return _Compiled(self.log)
        return run


@pytest.fixture
def fake_triton(monkeypatch):
    runtime = type("Runtime", (), dict(launch_enter_hook=None, launch_exit_hook=None))()
    driver = type("Driver", (), dict(get_current_device=lambda self: 0,
                                     get_current_stream=lambda self, device: 77))()
    monkeypatch.setattr(launcher, "_TRITON", [runtime, driver])
    monkeypatch.setattr(launcher, "_COMPILED", {})
    monkeypatch.setattr(launcher, "interpreting", lambda: False)


def _launches(fn, grid, names):
    step = launcher.Step(fn, grid, names, {"x"})
    return launcher.Launches([step], dict(BLOCK_M=1, BLOCK_N=1024, BLOCK_K=16), 4, 1)


def test_a_new_signature_specialised_alike_launches_the_compiled_kernel(fake_triton):
    fn = _Jit()
    x, y = torch.zeros(4096), torch.zeros(8192)
    _launches(fn, (64,), ["x", "n"])({"x": x, "n": 4096})
    _launches(fn, (128,), ["x", "n"])({"x": y, "n": 8192})   # aligned, 16 | n: the same kernel
    assert [kind for kind, *_ in fn.log] == ["jit", "direct"]
    _, grid, stream, args = fn.log[1]
    assert grid == (128, 1, 1) and stream == 77
    assert args == (y.data_ptr(), 8192, 1, 1024, 16)   # addresses, scalars, then constexprs
    _launches(fn, (64,), ["x", "n"])({"x": y, "n": 8200})    # 16 ∤ 8200: another kernel
    _launches(fn, (64,), ["x", "n"])({"x": y[1:], "n": 8192})   # off 16 bytes: another
    assert [kind for kind, *_ in fn.log] == ["jit", "direct", "jit", "jit"]


def test_jit_once_compiles_per_specialisation_and_launches_directly_after(fake_triton):
    fn = _Jit()
    once = launcher.JitOnce(fn, dict(num_warps=4, num_stages=1))
    x = torch.zeros(64)
    for n in (32, 48, 33):
        once((2, 3), [x, n], {"BM": 64, "RANGES": 0})
    assert [kind for kind, *_ in fn.log] == ["jit", "direct", "jit"] and once.direct == 1
    assert fn.log[1][1] == (2, 3, 1) and fn.log[1][3] == (x.data_ptr(), 48, 64, 0)
