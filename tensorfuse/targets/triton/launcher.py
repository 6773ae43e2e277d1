"""Launch compiled Triton kernels at the cost of the launch itself.

Triton's ``fn[grid](*args)`` binds and specialises its arguments and looks the kernel up on every
call — tens of microseconds, more than a small kernel's GPU time. A :class:`Launches` is made once
per shape signature: the first call goes through Triton's JIT (which compiles, specialises and
returns the compiled kernel), later ones hand the compiled kernel's C launcher the grid, the
current stream and the arguments as raw device pointers and scalars. The signature that reaches
a :class:`Launches` fixes everything the JIT specialises on — dtypes, 16-byte-aligned pointers
(the caller guarantees them), integer scalars' divisibility (``binding.signature_key``) — so the
compiled kernel stays the right one.
"""
from __future__ import annotations

from ..signature_call import SignatureCall, call_layout, fast_call_applies
from .launch import interpreting
from .size_builds import size_values

META = ("BLOCK_M", "BLOCK_N", "BLOCK_K")   # the generated kernels' constexpr parameters, in order


class Step:
    """One kernel launch of a call: the jitted function, its grid, its arguments' names and which
    of them are tensors (handed to the launcher as addresses)."""

    def __init__(self, fn, grid: tuple, names: list[str], tensors: set):
        self.fn, self.names = fn, names
        self.kinds = [(n, n in tensors) for n in names]
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.compiled = None
        self.raw = None   # the C launch function and its fixed flags, where Triton allows it

    def compiled_from(self, kernel) -> None:
        """Keep the kernel Triton's JIT compiled, and its C launch function when the kernel
        needs no scratch memory of Triton's (then Triton's Python wrapper has nothing to do)."""
        self.compiled = kernel
        launcher = kernel.run
        if getattr(launcher, "global_scratch_size", 1) == 0 and \
                getattr(launcher, "profile_scratch_size", 1) == 0 and hasattr(launcher, "launch"):
            self.raw = (launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl)


def _first_launch(step, values: dict, meta: dict, options: dict):
    """:func:`compiled_or_jit` of a step, Triton's out-of-resources said as tensorfuse's error
    with what to change (the tiles' knobs), not left as Triton's exception mid-call."""
    from triton.runtime.errors import OutOfResources

    try:
        return compiled_or_jit(step.fn, step.grid, [values[n] for n in step.names], meta, options)
    except OutOfResources as exc:
        from ...errors import TargetError

        raise TargetError(f"{step.fn.__name__}: {exc} (block_m={meta.get('BLOCK_M')}, "
                          f"block_n={meta.get('BLOCK_N')}, {options['num_stages']} stage(s), "
                          f"{options['num_warps']} warps): use smaller tiles or fewer "
                          "stages") from None


class Launches:
    """The launches of one shape signature, in order (one kernel: the split update's parts merge
    in the same launch), with their constexprs and launch options."""

    def __init__(self, steps: list[Step], meta: dict, num_warps: int, num_stages: int):
        self.steps = steps
        self.meta = meta
        self.constexprs = [meta[k] for k in META]
        self.options = dict(num_warps=num_warps, num_stages=num_stages)
        self.interpreted = interpreting()   # the interpreter always goes through the JIT
        self.direct = 0   # launches that bypassed Triton's JIT (tests read it)

    def __call__(self, values: dict) -> None:
        """Launch every step with ``values`` (tensors and scalars by argument name). A step's
        first launch takes the kernel another launches compiled for the same specialisation
        (a new size of a kernel that reads its sizes as arguments), else goes through the JIT."""
        for step in self.steps:
            if self.interpreted:
                step.fn[step.grid](*[values[n] for n in step.names], **self.meta, **self.options)
                continue
            if step.compiled is None:
                kernel, launched = _first_launch(step, values, self.meta, self.options)
                step.compiled_from(kernel)
                if launched:
                    continue
            self._launch(step, values)

    def warm(self, values: dict) -> None:
        """Compile the steps not compiled yet for ``values`` without launching them (Triton's
        ``warmup``: the same specialisation as the launch; under ``compile_pool.compiled_ahead``
        the compiles run in its helper processes)."""
        if self.interpreted:
            return
        for step in self.steps:
            if step.compiled is None:
                step.fn.warmup(*[values[n] for n in step.names], grid=step.grid, **self.meta,
                               **self.options)

    def _launch(self, step: Step, values: dict) -> None:
        args = [values[n].data_ptr() if tensor else values[n] for n, tensor in step.kinds]
        _, active = _triton()
        launch_compiled(step, active.get_current_stream(active.get_current_device()),
                        args + self.constexprs)
        self.direct += 1


def launch_compiled(step: Step, stream: int, args: list) -> None:
    """One launch of a step's compiled kernel on ``stream`` with ``args`` (addresses, scalars,
    then the constexprs): through its C launch function where Triton allows it, else through the
    compiled kernel's ``run``; Triton's launch hooks where a profiler set them."""
    runtime, _ = _triton()
    kernel = step.compiled
    enter, leave = hook(runtime.launch_enter_hook), hook(runtime.launch_exit_hook)
    if step.raw is not None:
        launch_raw(step.raw, kernel, step.grid, stream, args, enter, leave)
        return
    meta = kernel.launch_metadata(step.grid, stream, *args) if enter is not None else None
    kernel.run(*step.grid, stream, kernel.function, kernel.packed_metadata, meta, enter, leave,
               *args)


def launch_raw(raw, kernel, grid, stream, args, enter, leave) -> None:
    """One launch through the compiled kernel's C launch function ``raw`` (with Triton's launch
    hooks ``enter``/``leave`` where a profiler set them, and the metadata they read)."""
    launch, cooperative, pdl = raw
    meta = kernel.launch_metadata(grid, stream, *args) if enter is not None else None
    launch(grid[0], grid[1], grid[2], stream, kernel.function, cooperative, pdl, None, None,
           kernel.packed_metadata, meta, enter, leave, *args)


_TRITON: list = []
# compiled kernels by (jitted function, device, specialisation, constexprs, options): the
# launches of a new size find the kernel the JIT compiled for another, without the JIT's binding
# and specialising of every argument again
_COMPILED: dict = {}


def _triton():
    """Triton's runtime settings (its launch hooks) and the active driver, looked up once."""
    if not _TRITON:
        from triton import knobs
        from triton.runtime.driver import driver

        _TRITON.extend((knobs.runtime, driver.active))
    return _TRITON[0], _TRITON[1]


def hook(chain):
    """A launch hook to hand the launcher, or None: Triton's hooks are chains, empty unless a
    profiler added to them, and an empty chain needs neither the launch's metadata nor a call."""
    calls = getattr(chain, "calls", None)
    return None if calls is not None and not calls else chain


class PartCounters:
    """The split update's arrival counters: an int32 per row tile of a launch, zero between
    calls (the tile's last part sets it back after merging). Kept per device and stream, so
    calls on two streams never share them; made zero once, on the stream of their first call
    (in a CUDA graph's capture that fill is captured too, and repeated by every replay)."""

    def __init__(self, tiles: int):
        self.tiles = tiles
        self.by_stream: dict = {}

    def on(self, device, stream: int):
        """The counters for launches on ``stream`` of ``device`` (a torch tensor)."""
        key = (device, stream)
        made = self.by_stream.get(key)
        if made is None:
            import torch

            made = self.by_stream[key] = torch.zeros(self.tiles, dtype=torch.int32,
                                                     device=device)
        return made


def current_stream(device) -> int:
    """The stream Triton's launches on ``device`` go to (0 for the interpreter's CPU tensors)."""
    if device.type != "cuda":
        return 0
    _, active = _triton()
    return active.get_current_stream(device.index if device.index is not None
                                     else active.get_current_device())


class FastCall(SignatureCall):
    """One signature's whole call in a few list operations, once its kernels are compiled.

    Made after a first call with this signature went through the checked path: the signature
    fixes where each parameter sits among the call's arguments, the shapes and dtypes (so the
    outputs' too), the launches and the scratch layout. A call then only reads the tensors'
    addresses (:class:`~tensorfuse.targets.signature_call.SignatureCall`: None where the call needs
    the checked path after all), allocates the outputs and the scratch, and hands the C launch
    functions their arguments (and Triton's launch hooks, where a profiler set them, what the JIT
    would)."""

    def __init__(self, params: list, outputs: list, scratch, launches: Launches, device,
                 likes: list | None = None, guards: list | None = None,
                 counters: PartCounters | None = None, constants: dict | None = None,
                 views: dict | None = None):
        import torch

        super().__init__(params, outputs, device, likes, guards, views=views)
        places, total = scratch if scratch is not None else ([], 0)
        self.scratch_offsets = [4 * offset for _, _, offset in places]
        self.scratch_total = total
        self.counters = counters
        # values the signature fixes (its sizes, for a kernel that reads them as arguments)
        self.constants = list((constants or {}).values())
        order = [n for n, _, _ in params] + [n for n, _, _ in outputs] + \
            [n for n, _, _ in places] + (["part_count"] if counters is not None else []) + \
            list(constants or {})
        slot_of = {name: k for k, name in enumerate(order)}
        self.steps = [(step.raw, step.compiled, step.grid, [slot_of[n] for n in step.names])
                      for step in launches.steps]
        self.constexprs = launches.constexprs
        self.f32 = torch.float32
        # the current device, as torch.cuda.current_device() reads it once CUDA is initialised
        # (which the first call did), without its Python wrapper
        self.current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)

    def __call__(self, args: tuple, kwargs: dict):
        read = self.arguments(args, kwargs)
        if read is None:
            return None
        slots, tensors = read
        outs = self.outputs_for(tensors, kwargs)
        runtime, active = _triton()
        slots += [o.data_ptr() for o in outs]
        keep = None
        if self.scratch_total:
            keep = self.empty(self.scratch_total, dtype=self.f32, device=self.device)
            base = keep.data_ptr()
            slots += [base + offset for offset in self.scratch_offsets]
        stream = active.get_current_stream(self.current_device())   # as Triton's JIT
        if self.counters is not None:
            slots.append(self.counters.on(self.device, stream).data_ptr())
        slots += self.constants
        enter, leave = hook(runtime.launch_enter_hook), hook(runtime.launch_exit_hook)
        for raw, kernel, grid, index in self.steps:
            launch_raw(raw, kernel, grid, stream, [slots[k] for k in index] + self.constexprs,
                       enter, leave)
        del keep   # freed after the launches are queued: the caching allocator orders its reuse
        return outs[0] if len(outs) == 1 else tuple(outs)


def specialisation(args) -> tuple:
    """What Triton's JIT specialises a kernel on among ``args`` (tensors, ints, floats): each
    tensor's dtype and whether its address is 16-byte aligned, each int's type width, whether it
    is 1 and whether 16 divides it. Launches with the same specialisation run one compiled
    kernel."""
    key = []
    for a in args:
        if hasattr(a, "data_ptr"):
            key.append((a.dtype, a.data_ptr() % 16 == 0))
        elif isinstance(a, bool) or not hasattr(a, "__index__"):   # floats, bools, None
            key.append(type(a))
        else:   # Python's or NumPy's ints; Triton's widths: i32, i64, u64
            a = a.__index__()
            key.append((-2 ** 31 <= a < 2 ** 31, a >= 2 ** 63, a == 1, a % 16 == 0))
    return tuple(key)


def compiled_or_jit(fn, grid: tuple, args: list, constexprs: dict, options: dict):
    """``(kernel, launched)``: the kernel compiled for this specialisation of ``args``
    (:func:`specialisation`), ``constexprs`` and ``options`` on the current device — kept in
    :data:`_COMPILED` from an earlier launch, ``launched`` False: the caller launches it —, or,
    the first time, the one Triton's JIT compiled as it launched it (``launched`` True)."""
    key = (fn, _triton()[1].get_current_device(), specialisation(args),
           tuple(constexprs.items()), tuple(options.items()))
    found = _COMPILED.get(key)
    if found is not None:
        return found, False
    found = _COMPILED[key] = fn[grid](*args, **constexprs, **options)
    return found, True


class JitOnce:
    """A jitted function launched through Triton's JIT the first time per specialisation of its
    arguments, constexprs and options (:func:`compiled_or_jit`) — which compiles it — and
    through the compiled kernel's launcher after that: launches whose arguments are not bound
    once per signature (a backward's, from autograd) without the JIT's binding, specialising and
    lookup on every call (tens of µs each)."""

    def __init__(self, fn, options: dict):
        self.fn, self.options = fn, options
        self.steps: dict = {}   # (grid, compiled kernel) -> its Step
        self.direct = 0   # launches that bypassed Triton's JIT (tests read it)

    def __call__(self, grid: tuple, args: list, constexprs: dict) -> None:
        if interpreting():
            self.fn[grid](*args, **constexprs, **self.options)
            return
        kernel, launched = compiled_or_jit(self.fn, grid, args, constexprs, self.options)
        if launched:
            return
        step = self.steps.get((grid, id(kernel)))   # kept in _COMPILED: its id is not reused
        if step is None:
            step = self.steps[(grid, id(kernel))] = Step(self.fn, grid, [], set())
            step.compiled_from(kernel)
        values = [a.data_ptr() if hasattr(a, "data_ptr") else a for a in args]
        _, active = _triton()
        launch_compiled(step, active.get_current_stream(active.get_current_device()),
                        values + list(constexprs.values()))
        self.direct += 1


def output_specs(computes, dims: dict) -> list:
    """``(argument name, shape, DSL dtype)`` of each output a kernel writes, at ``dims``."""
    from ...binding import output_shape

    return [(f"out_{c.name}", tuple(output_shape(c, dims)), c.dtypes[0]) for c in computes]


def remember_fast_call(calls: dict, key, program, args: tuple, bound, binder, outputs: list,
                       launches: Launches, scratch=None, counters: "PartCounters | None" = None,
                       guarded: tuple = (), views: tuple = ()) -> None:
    """Keep in ``calls`` a :class:`FastCall` for this signature where one applies — torch
    tensors on the GPU, kernels Triton lets us launch directly — read off its first call
    (``bound`` by ``binder``; ``outputs``: ``(argument name, shape, DSL dtype)``); the sizes the
    kernels read as arguments are fixed by the key; ``guarded``: the scalars the launches were
    made for (other values take the checked path); ``views``: the views they were written for
    (:func:`~.view_strides.call_views`: a call passing other strides takes the checked path)."""
    if not fast_call_applies(bound, binder.target_device) or \
            any(step.raw is None for step in launches.steps):
        return
    params, likes, guards = call_layout(program, args, bound, binder.scalar_kinds, outputs,
                                        guarded)
    sizes = {n: v for n, v in size_values(bound.dims).items()
             if n not in bound.arrays and n not in bound.scalars}
    calls[key] = FastCall(params, outputs, scratch, launches, bound.torch_device, likes, guards,
                          counters, sizes, dict(views))
