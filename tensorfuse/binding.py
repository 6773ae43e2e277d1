"""Check a kernel call's arguments against the kernel's signature and bind the named sizes.

Every problem is reported before launch as a :class:`~tensorfuse.errors.CallError` naming the
parameter, what was expected and what came, with the caller's line. A call whose arguments look
like an earlier one's — the same types, shapes, dtypes and devices (:func:`signature_key`) — is
not checked again: :class:`CallBinder` reuses what the first check found, so a repeated call
costs a dictionary lookup, while a wrong shape or dtype still gets the full check and its error.
"""
from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .dsl import dtypes as dt
from .dsl.expr import user_location
from .dsl.program import Program, ScalarParam, TensorParam, torch_symbolic
from .errors import CallError
from .dsl.evaluate import axis_sizes_for
from .dsl.index_bounds import affine_reads, index_scalars, overruns
from .index_checks import IndexOutOfRange, check_gathers, checks_indices, gathers
from .interop import ArrayInfo, describe, is_array, memory_span, torch_output

INT32_LIMIT = 2**31 - 1


@dataclass
class BoundCall:
    """A validated call: arrays and scalars by parameter name, the value of every named size."""

    arrays: dict
    infos: dict[str, ArrayInfo]
    scalars: dict[str, object]
    dims: dict[str, int]
    outs: list | None
    framework: str
    device: str
    torch_device: object = None
    index_dtype: str = "int32"
    signature: tuple = field(default=())


class EmptyCall(CallError):
    """A call every output of which has no elements (an empty batch: a serving step with no
    requests, an expert no token was routed to): nothing to compute, so nothing launches, and
    the kernel returns :attr:`result` — the caller's ``out=``, else new empty arrays in the
    arguments' framework and on their device — as a torch operation would. Raised by
    :func:`bind_call` and caught where a kernel is called (a :class:`CallError` where nothing
    catches it: a plan asked for sizes at which no kernel runs)."""

    def __init__(self, result):
        super().__init__("every output of the call is empty: nothing runs")
        self.result = result


def split_scalars(program: Program, named: dict) -> tuple[dict, dict | None]:
    """``(sizes, scalars or None)`` of keyword arguments that name both (``schedule_origin(M=…,
    window=2048)``: tuning records are kept per value of some scalars)."""
    own = {p.name for p in program.scalar_params}
    scalars = {n: v for n, v in named.items() if n in own}
    # sizes the kernel derives from the given ones are computed, as a call computes them
    return program.with_derived_sizes({n: v for n, v in named.items() if n not in own}), \
        scalars or None


def check_named_sizes(program: Program, dims: dict, complete: bool) -> None:
    """Refuse sizes given by name (``source(M=128, ...)``, ``ptx(...)``) that the kernel does not
    have, that are missing when ``complete`` (every size is needed to generate code), or that are
    not positive integers — instead of a bare KeyError, or a typo silently ignored."""
    problem = program.size_problems(dims, complete)
    if problem:
        raise CallError(problem, user_location())
    if complete:   # code for these sizes: not where an index leaves its dimension
        check_index_arithmetic(program, program.with_derived_sizes(dims))


_AFFINE_READS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _affine_reads(program: Program) -> list:
    reads = _AFFINE_READS.get(program)
    if reads is None:
        reads = _AFFINE_READS[program] = affine_reads(program)
    return reads


def check_index_arithmetic(program: Program, dims: dict, scalars: dict | None = None) -> None:
    """Refuse sizes (and ``scalars``' values) at which an index computed from axes
    (``x[i, j + half]``, ``x[b, j + shift]``) reads outside its dimension
    (:mod:`~tensorfuse.dsl.index_bounds`): before anything runs, on every target — the reads are
    found once per program, their ranges once per call signature, and on every call where an
    index reads a scalar (:func:`index_scalars_of`)."""
    reads = _affine_reads(program)
    if reads:
        problems = overruns(program, reads, axis_sizes_for(program, dims), dims, scalars)
        if problems:
            raise IndexOutOfRange(problems[0], user_location())


def index_scalars_of(program: Program) -> tuple[str, ...]:
    """The scalar parameters that index arithmetic reads (``shift`` in ``x[b, j + shift]``):
    a call with another value is checked again, so no fast path skips them."""
    return index_scalars(_affine_reads(program))


def bind_call(program: Program, args: tuple, kwargs: dict, target_device: str) -> BoundCall:
    """Check a call's arguments and bind the sizes (the caller's line is looked up only when there
    is something to report: this runs on every call)."""
    kwargs = dict(kwargs)
    outs = kwargs.pop("out", None)
    names = [p.name for p in program.params]
    if len(args) > len(names):
        raise CallError(f"{program.name}() takes {len(names)} arguments ({', '.join(names)}) but "
                        f"{len(args)} were given", user_location())
    given = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            raise CallError(f"{program.name}() got an unexpected argument {key!r}; its parameters "
                            f"are {', '.join(names)}", user_location())
        if key in given:
            raise CallError(f"{program.name}() got two values for argument {key!r}", user_location())
        given[key] = value
    missing = [n for n in names if n not in given]
    if missing:
        raise CallError(f"{program.name}() is missing argument(s): {', '.join(missing)}", user_location())

    arrays, infos, scalars = {}, {}, {}
    dims: dict[str, int] = {}
    origin: dict[str, str] = {}
    empties: list = []   # (parameter, dimension, shape) of every empty dimension
    for p in program.params:
        value = given[p.name]
        if isinstance(p, ScalarParam):
            scalars[p.name] = _scalar(p, value)
            continue
        if not is_array(value):
            raise CallError(f"argument {p.name} must be an array (NumPy or PyTorch) of shape "
                            f"[{', '.join(map(str, p.dims))}], got {type(value).__name__}", user_location())
        info = describe(value)
        _check_tensor(p, info, dims, origin)
        arrays[p.name], infos[p.name] = value, info
        empties += [(p.name, k, info.shape) for k, n in enumerate(info.shape) if n == 0]

    dims = program.with_derived_sizes(dims)
    conflicts = program.fixed_size_conflicts(dims)
    if conflicts:
        raise CallError(conflicts[0], user_location())
    if not empties:   # an empty call reads nothing
        check_index_arithmetic(program, dims, scalars)

    frameworks = {i.framework for i in infos.values()}
    devices = {i.device for i in infos.values() if i.framework != "numpy"}
    if len(devices) > 1:
        raise CallError(f"arguments are on different devices ({', '.join(sorted(devices))}); "
                        "move them to one device", user_location())
    device = devices.pop() if devices else target_device
    if device != target_device:
        raise CallError(f"arguments are on the {device} but the kernel was compiled for "
                        f"{target_device}; compile for target="
                        f"{'cuda' if device == 'cuda' else 'llvm'!r} or move the tensors", user_location())
    framework = "torch" if "torch" in frameworks else ("tvm" if "tvm" in frameworks else "numpy")
    torch_device = next((arrays[n].device for n, i in infos.items() if i.framework == "torch"), None)

    outs_list = None
    if outs is not None:
        outs_list = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        if len(outs_list) != len(program.outputs):
            raise CallError(f"out= has {len(outs_list)} arrays but {program.name} has "
                            f"{len(program.outputs)} outputs", user_location())
        for c, o in zip(program.outputs, outs_list):
            shape = tuple(output_shape(c, dims))
            if not is_array(o):
                raise CallError(f"out= for output {c.name} must be an array", user_location())
            info = describe(o)
            if info.shape != shape or info.dtype != c.dtypes[0]:
                raise CallError(f"out= for output {c.name} must have shape {shape} and dtype "
                                f"{c.dtypes[0]}, got {info.shape} {info.dtype}", user_location())
            if info.framework != "numpy" and info.device != device:
                raise CallError(f"out= for output {c.name} is on the {info.device}, the kernel "
                                f"runs on the {device}", user_location())

    bound = BoundCall(arrays, infos, scalars, dims, outs_list, framework, device, torch_device)
    if empties:
        raise _empty_call(program, bound, empties)
    bound.index_dtype = "int64" if _largest_buffer(program, dims) > INT32_LIMIT else "int32"
    bound.signature = tuple(sorted(dims.items())) + (bound.index_dtype,)
    return bound


def _scalar(p: ScalarParam, value):
    symbolic = torch_symbolic(value)   # a number Dynamo made symbolic (dynamic=True's fakes)
    if symbolic is not None and symbolic in (
            ("SymBool",) if p.dtype == "bool" else ("SymInt",) if dt.is_int(p.dtype) else
            ("SymFloat", "SymInt")):
        return value
    if is_array(value):
        if np.size(value) != 1:
            raise CallError(f"argument {p.name} is a scalar ({p.dtype}), got an array of shape "
                            f"{tuple(np.shape(value))}", user_location())
        value = value.item() if hasattr(value, "item") else value
    if isinstance(value, (bool, np.bool_)) and p.dtype != "bool":
        raise CallError(f"argument {p.name} is a {p.dtype} scalar, got a bool", user_location())
    if dt.is_int(p.dtype):
        if not isinstance(value, (int, np.integer)):
            raise CallError(f"argument {p.name} is an integer scalar ({p.dtype}), got "
                            f"{type(value).__name__} {value!r}", user_location())
        return int(value)
    if p.dtype == "bool":
        return bool(value)
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise CallError(f"argument {p.name} is a {p.dtype} scalar, got {type(value).__name__}", user_location())
    return float(value)


def _check_tensor(p: TensorParam, info: ArrayInfo, dims: dict, origin: dict) -> None:
    if len(info.shape) != p.rank:
        raise CallError(f"argument {p.name} must have {p.rank} dimensions "
                        f"[{', '.join(map(str, p.dims))}], got shape {info.shape}", user_location())
    if info.dtype != p.dtype:
        raise CallError(f"argument {p.name} must have dtype {p.dtype}, got {info.dtype} "
                        f"(convert it, e.g. x.astype(...) / x.to(...))", user_location())
    for k, (d, n) in enumerate(zip(p.dims, info.shape)):
        if isinstance(d, int):
            if n != d:
                raise CallError(f"argument {p.name} must have size {d} in dimension {k}, got shape "
                                f"{info.shape}", user_location())
        elif d in dims and dims[d] != n:
            raise CallError(f"size {d} is {dims[d]} from {origin[d]} but {n} from dimension {k} of "
                            f"{p.name} (shape {info.shape})", user_location())
        else:
            dims.setdefault(d, n)
            origin.setdefault(d, f"dimension {k} of {p.name}")


def _empty_call(program: Program, bound: BoundCall, empties: list) -> CallError:
    """What a call with empty arguments raises: :class:`EmptyCall` with the outputs to return
    where every output is empty; else an error naming the empty argument and the output that
    would reduce over no elements (a sum of nothing is 0 and a max of nothing has no value: no
    kernel computes either; torch's own reductions differ by kind)."""
    shapes = [output_shape(c, bound.dims) for c in program.outputs]
    name, k, shape = empties[0]
    full = next((c.name for c, s in zip(program.outputs, shapes) if 0 not in s), None)
    if full is not None:
        return CallError(f"argument {name} has an empty dimension {k} (shape {shape}) while "
                         f"output {full} is not empty: it would be reduced over no elements, "
                         "which no kernel computes (a call with every output empty returns "
                         "them empty)", user_location())
    if bound.outs is not None:
        result = list(bound.outs)
    else:
        result = [_empty_like_inputs(s, c.dtypes[0], bound)
                  for c, s in zip(program.outputs, shapes)]
    return EmptyCall(result[0] if len(result) == 1 else tuple(result))


def _empty_like_inputs(shape: list, dtype: str, bound: BoundCall):
    """A new empty array of ``shape`` in the framework and on the device of the call's
    arguments."""
    if bound.framework == "torch":
        return torch_output(shape, dtype, None, bound.torch_device)
    if bound.framework == "tvm":
        import tvm

        place = next(a.device for a in bound.arrays.values() if hasattr(a, "device"))
        return tvm.runtime.empty(tuple(shape), dt.to_tvm(dtype), place)
    return np.empty(shape, dt.to_numpy(dtype))


def out_overlaps_an_argument(args: tuple, kwargs: dict) -> bool:
    """Whether a call's ``out=`` shares memory with one of its arguments (``f(x, w, out=x)``):
    a kernel writes tiles of its output while other tiles still read the inputs, so such a call
    is computed into new outputs and copied (:meth:`.torch_graph.GraphCallable.__call__`).
    Byte ranges compared (interleaved views count as sharing): ~5 µs of host time a call with
    ``out=`` and four tensors on a small CPU, nothing on calls without."""
    given = kwargs["out"]
    spans = [s for s in map(memory_span, given if isinstance(given, (tuple, list)) else (given,))
             if s is not None]
    if not spans:
        return False
    for x in (*args, *(v for n, v in kwargs.items() if n != "out")):
        span = memory_span(x)
        if span is not None and any(a < span[1] and span[0] < b for a, b in spans):
            return True
    return False


def output_shape(compute, dims: dict) -> list[int]:
    return [a.extent if isinstance(a.extent, int) else dims[a.extent] for a in compute.axes]


def param_shape(param, dims: dict) -> list[int]:
    """The shape of tensor parameter ``param`` at ``dims``."""
    return [d if isinstance(d, int) else dims[d] for d in param.dims]


def _largest_buffer(program: Program, dims: dict) -> int:
    """Elements of the largest tensor (exact Python ints: math.prod, not a numpy reduction, which
    was a fifth of a call's host time for small kernels)."""
    shapes = [output_shape(c, dims) for c in program.computes]
    shapes += [param_shape(p, dims) for p in program.tensor_params]
    return max((math.prod(s) for s in shapes), default=0)


class _Uncovered(Exception):
    """An argument of a kind the signature key does not describe."""


def _tensor_key(x):
    return (type(x), x.shape, x.dtype, x.device)


def _int_key(x):
    return (int, x == 1, x % 16 == 0, -2**31 <= x < 2**31)


def _kind_key(x):
    return type(x)


def _key_of_type(kind):
    """How to key a value of this type (decided once per type: the check runs on every call)."""
    if kind is int:
        return _int_key
    if kind is float or kind is bool or issubclass(kind, (np.floating, np.bool_)):
        return _kind_key
    if kind.__module__.startswith("torch") and hasattr(kind, "__dlpack__"):
        return _tensor_key
    if kind is np.ndarray:
        return lambda x: (np.ndarray, x.shape, x.dtype)
    if issubclass(kind, np.integer):
        return lambda x: _int_key(int(x)) + (type(x),)
    if kind is tuple or kind is list:
        return lambda x: (type(x),) + tuple(_arg_key(v) for v in x)
    return None


_KEYS: dict = {}


def _arg_key(x):
    """What a kernel's checks and code depend on in one argument. Integer scalars by the
    properties generated code specialises on (equal to 1, a multiple of 16, fits 32 bits), other
    scalars by type alone (their values are passed through)."""
    kind = type(x)
    key = _KEYS.get(kind)
    if key is None:
        key = _KEYS.setdefault(kind, _key_of_type(kind) or _uncovered)
    return key(x)


def _uncovered(x):
    raise _Uncovered


def signature_key(args: tuple, kwargs: dict) -> tuple | None:
    """A key of the call's argument kinds (None when an argument is of a kind it does not
    describe: that call is always checked in full)."""
    try:
        key = tuple([_arg_key(a) for a in args])   # a list is built faster than a generator
        if kwargs:
            key += tuple((k, _arg_key(v)) for k, v in sorted(kwargs.items()))
        return key
    except _Uncovered:
        return None


class CallBinder:
    """Binds the calls of one kernel, checking each signature once.

    The first call with a signature is checked in full (:func:`bind_call`); later ones with the
    same signature reuse what it found — sizes, framework, device, index width — and only pick
    up the argument objects and scalar values. ``checks`` counts the full checks (tests read it)."""

    LIMIT = 64   # signatures remembered per kernel

    def __init__(self, program: Program, target_device: str):
        self.program, self.target_device = program, target_device
        self.names = [p.name for p in program.params]
        self.scalar_kinds = {p.name: (int if dt.is_int(p.dtype) else bool if p.dtype == "bool"
                                      else float) for p in program.scalar_params}
        self._seen: OrderedDict = OrderedDict()
        self.checks = 0
        # gathered indices, checked on every call where the device is checked (index_checks)
        self.gathers = gathers(program) if checks_indices(target_device) else []
        self.index_scalars = index_scalars_of(program)   # index arithmetic checked per call

    def __call__(self, args: tuple, kwargs: dict, key=False) -> BoundCall:
        """The bound call; ``key``: the call's :func:`signature_key` when the caller has made it
        already (``AutoKernel`` does, to pick the kernel). Gathered indices out of range raise
        :class:`~tensorfuse.index_checks.IndexOutOfRange` (on the CPU; on a GPU where asked)."""
        bound = self._bind(args, kwargs, key)
        if self.gathers:
            check_gathers(self.program, self.gathers, bound.arrays, bound.dims, bound.scalars)
        return bound

    def remember(self, key, bound: BoundCall) -> None:
        """Keep what signature ``key`` decides, from ``bound`` (a call of this kernel's program
        bound in full for this device kind — here, or by ``AutoKernel`` picking the kernel, so
        that a new signature is bound once, not twice), without its arguments: a kept reference
        would keep the tensors alive (a growing decode cache: every step's K and V)."""
        if key is None or key in self._seen:
            return
        seen = object.__new__(BoundCall)
        seen.__dict__.update(bound.__dict__, arrays={}, scalars={}, outs=None)
        self._seen[key] = seen
        if len(self._seen) > self.LIMIT:
            self._seen.popitem(last=False)

    def _bind(self, args: tuple, kwargs: dict, key) -> BoundCall:
        if key is False:
            key = signature_key(args, kwargs)
        known = self._seen.get(key) if key is not None else None
        if known is None:
            bound = bind_call(self.program, args, kwargs, self.target_device)
            self.checks += 1
            self.remember(key, bound)
            return bound
        arrays, scalars = {}, {}
        outs = None
        for name, value in zip(self.names, args):
            if name in self.scalar_kinds:
                scalars[name] = self.scalar_kinds[name](value)
            else:
                arrays[name] = value
        for name, value in kwargs.items():
            if name == "out":
                outs = list(value) if isinstance(value, (tuple, list)) else [value]
            elif name in self.scalar_kinds:
                scalars[name] = self.scalar_kinds[name](value)
            else:
                arrays[name] = value
        bound = object.__new__(BoundCall)   # a copy of the first call's binding, cheaply
        bound.__dict__.update(known.__dict__, arrays=arrays, scalars=scalars, outs=outs)
        if self.index_scalars:
            check_index_arithmetic(self.program, bound.dims, scalars)
        return bound


def output_buffers(outputs, bound, device) -> tuple[list, list]:
    """The buffers a call's kernels write, one per output compute (:func:`torch_output`), and
    what the caller gave for each (None where nothing)."""
    given = list(bound.outs) if bound.outs is not None else [None] * len(outputs)
    return [torch_output(output_shape(c, bound.dims), c.dtypes[0], g, device)
            for c, g in zip(outputs, given)], given
