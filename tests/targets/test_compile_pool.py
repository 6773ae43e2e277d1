"""Compiling a batch of Triton kernels in helper processes (``targets.triton.compile_pool``), on
the CPU: Triton's JIT runs against a stand-in driver that names an sm_90 GPU, so ``warmup``
compiles exactly as it would on the H100 (nothing is launched)."""
import glob
import os

import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import MockTensor  # noqa: E402

from tensorfuse.targets.triton.compile_pool import (CompilePool,  # noqa: E402
                                                    compiled_as_ready, jit_request)
from tensorfuse.targets.triton.launch import load_kernel  # noqa: E402

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def scale_rows_{tag}(x, out, n, s, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    v = tl.load(x + i * n + c, mask=c < n)
    tl.store(out + i * n + c, v * s{extra}, mask=c < n)
'''


class _Hopper:
    """A driver that is an sm_90 GPU as far as compiling goes."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def is_active(self):
        return True


@pytest.fixture
def hopper(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path / "tensorfuse"))
    saved = driver._active
    driver.set_active(_Hopper())
    yield tmp_path / "triton"
    driver._active = saved


def _warm(fn, block):
    fn.warmup(MockTensor(torch.float32), MockTensor(torch.float32), 1000, 0.5, BLOCK=block,
              grid=(1,), num_warps=4, num_stages=2)
    return block


def _compile(pool, fn, blocks):
    """The blocks in the order their kernels came back compiled."""
    return [made for _, made in compiled_as_ready(pool, blocks, lambda b: _warm(fn, b))]


def test_helpers_compile_a_batch_and_the_jit_finds_it_in_the_cache(hopper):
    fn = load_kernel(SOURCE.format(tag=os.getpid(), extra=""), f"scale_rows_{os.getpid()}")
    pool = CompilePool(2)
    try:
        assert sorted(_compile(pool, fn, (64, 128, 256, 512))) == [64, 128, 256, 512]
        assert (pool.sent, pool.here) == (4, 0)
    finally:
        pool.close()
    assert len(fn.device_caches[0][0]) == 4            # all four in the JIT's cache
    # one cubin per kernel: the JIT's own compile here found the helpers' (same cache key)
    assert len(glob.glob(str(hopper / "*" / "*.cubin"))) == 4


def test_a_kernel_that_does_not_compile_fails_at_its_own_compile(hopper):
    tag = f"{os.getpid()}_bad"
    fn = load_kernel(SOURCE.format(tag=tag, extra=" + undefined_name"), f"scale_rows_{tag}")
    pool = CompilePool(1)
    try:
        assert _compile(pool, fn, (64,)) == [64]   # the error is kept for its own compile
        assert pool.here == 1 and len(fn.device_caches[0][0]) == 0
    finally:
        pool.close()
    with pytest.raises(Exception, match="undefined_name"):
        _warm(fn, 64)


def test_a_compile_it_cannot_describe_runs_here():
    pool = CompilePool(1)
    assert jit_request(lambda: 42) is None
    assert pool.submit(lambda: 42).result() == 42 and pool.here == 1 and not pool.helpers
    pool.close()


def test_a_helper_that_dies_is_replaced(hopper):
    tag = f"{os.getpid()}_dies"
    fn = load_kernel(SOURCE.format(tag=tag, extra=""), f"scale_rows_{tag}")
    pool = CompilePool(1)
    try:
        pool._start()
        pool.helpers[0].kill()
        pool.helpers[0].wait()
        _compile(pool, fn, (64,))   # its compile runs here, and a new helper takes its place
        assert (pool.sent, pool.here) == (0, 1) and pool.helpers[0].poll() is None
        _compile(pool, fn, (128,))
        assert (pool.sent, pool.here) == (1, 1) and len(fn.device_caches[0][0]) == 2
    finally:
        pool.close()


def test_each_kernel_is_handed_on_once_compiled_while_the_rest_compile(hopper):
    """The GPU can measure the first candidate while the helpers compile the others: each comes
    back with its kernel in the JIT's cache (and no other not yet handed back), and a warm that
    raises comes back with nothing made."""
    tag = f"{os.getpid()}_ready"
    fn = load_kernel(SOURCE.format(tag=tag, extra=""), f"scale_rows_{tag}")
    cache = fn.device_caches[0][0]
    pool = CompilePool(1)

    def warm(block):
        if block == 0:
            raise ValueError("a candidate that cannot be made")
        return _warm(fn, block)

    seen = []
    try:
        for block, made in compiled_as_ready(pool, (64, 0, 128, 256), warm):
            seen.append(block)
            assert made == (None if block == 0 else block)
            assert len(cache) == len([b for b in seen if b])   # its own compile, no later one
    finally:
        pool.close()
    assert sorted(seen) == [0, 64, 128, 256] and pool.sent == 3


def test_builds_that_are_not_triton_s_run_ahead_and_hold_their_item_back():
    """A CUDA C++ candidate's ``nvcc`` builds go to the pool's threads from its ``warm`` (all
    the batch's at once, not one after another), and the item comes back only once its own
    builds are done; a build that fails still gives its item back (to fail again, reported,
    where it is measured)."""
    import threading
    import time

    pool = CompilePool(4)
    started, release = [], {n: threading.Event() for n in "abc"}
    finished = []

    def build(name):
        started.append(name)
        release[name].wait(10)
        finished.append(name)
        if name == "b":
            raise RuntimeError("nvcc failed")

    def warm(name):
        pool.build(lambda: build(name))
        return name

    seen, under_way = [], []

    def release_in_turn():
        time.sleep(0.2)
        under_way.extend(sorted(started))   # every build under way before any is done
        for name in "cab":
            release[name].set()
            time.sleep(0.1)

    thread = threading.Thread(target=release_in_turn)
    thread.start()
    try:
        for name, made in compiled_as_ready(pool, "abc", warm):
            assert name in finished and made == name
            seen.append(name)
    finally:
        thread.join()
        pool.close()
    assert under_way == ["a", "b", "c"] and seen == ["c", "a", "b"]


def test_batches_fed_from_two_threads_each_wait_for_their_own_builds():
    """A job feeds each kernel's batch from its own thread through one pool: a batch's item
    comes back only once its own build is done, even when another thread's batch came and went
    while its warm ran."""
    import threading

    pool = CompilePool(2)
    in_warm, other_done, release = threading.Event(), threading.Event(), threading.Event()
    finished, handed = [], []

    def slow_build():
        release.wait(10)
        finished.append("a")

    def warm_a(name):
        in_warm.set()
        other_done.wait(10)        # the other thread's whole batch runs meanwhile
        pool.build(slow_build)
        return name

    def feed_a():
        for name, _ in compiled_as_ready(pool, ["a"], warm_a):
            handed.append((name, list(finished)))

    def feed_b():
        in_warm.wait(10)
        list(compiled_as_ready(pool, ["b"], lambda name: pool.build(lambda: None) and name))
        other_done.set()
        threading.Timer(0.3, release.set).start()

    threads = [threading.Thread(target=feed_a), threading.Thread(target=feed_b)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
    finally:
        release.set()
        pool.close()
    assert handed == [("a", ["a"])]   # handed on after its build, not before
