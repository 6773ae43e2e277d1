"""A C launch function for compiled Triton kernels that does the launch and nothing else.

Triton's own launcher parses a dozen fixed arguments and the kernel's metadata on every call,
makes sure a CUDA context exists and calls the launch hooks (about 5 µs on the H100 host,
``benchmarks/overhead.py --breakdown``). The fast call of a shape signature knows all of that
once: :func:`plan` turns a compiled kernel into a fixed configuration (function handle, grid,
threads, shared memory, and one type code per kernel parameter), and :func:`launcher`'s
``launch(config, stream, *values)`` packs the values by those codes and calls
``cuLaunchKernel``. The module is C (CPython's API and ``cuda.h`` as Triton ships it), built once
per machine with Triton's own builder and cache — where Triton can build its launcher, this
builds too — and finds the CUDA driver with ``dlopen`` when it first launches, so it also builds
(and its packing is tested) on machines without a GPU.

``launch`` returns False, launching nothing, where no CUDA context is current on the calling
thread (Triton's launcher makes one; the caller then goes through it).
"""
from __future__ import annotations

import os
import struct

MAX_PARAMS = 64
# One character per kernel parameter: how its value is passed (Triton's signature types)
CODES = {"i1": "c", "i8": "c", "u1": "C", "u8": "C", "i16": "s", "u16": "S", "i32": "i",
         "u32": "I", "i64": "l", "u64": "L", "fp16": "h", "bf16": "b", "fp32": "f", "f32": "f",
         "fp64": "d"}
SCRATCH = "z"   # Triton's scratch pointers, passed as null when the kernel needs no scratch
CONFIG = struct.Struct(f"<Q3III I{MAX_PARAMS}s")

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include "cuda.h"

#define MAX_PARAMS %(max)d

typedef struct {
  uint64_t function;
  uint32_t grid[3];
  uint32_t threads;
  uint32_t shared;
  uint32_t count;
  char codes[MAX_PARAMS];
} Config;

typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*current_t)(CUcontext *);
typedef CUresult (*error_string_t)(CUresult, const char **);
static launch_t cu_launch = NULL;
static current_t cu_current = NULL;
static error_string_t cu_error = NULL;

static int load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    PyErr_SetString(PyExc_RuntimeError, "tensorfuse launcher: cannot load libcuda.so.1");
    return -1;
  }
  cu_launch = (launch_t)dlsym(lib, "cuLaunchKernel");
  cu_current = (current_t)dlsym(lib, "cuCtxGetCurrent");
  cu_error = (error_string_t)dlsym(lib, "cuGetErrorString");
  if (!cu_launch || !cu_current || !cu_error) {
    cu_launch = NULL;
    PyErr_SetString(PyExc_RuntimeError, "tensorfuse launcher: libcuda.so.1 lacks cuLaunchKernel");
    return -1;
  }
  return 0;
}

static const Config *config_of(PyObject *o) {
  if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != (Py_ssize_t)sizeof(Config)) {
    PyErr_SetString(PyExc_TypeError, "tensorfuse launcher: not a launch configuration");
    return NULL;
  }
  const Config *c = (const Config *)PyBytes_AS_STRING(o);
  if (c->count > MAX_PARAMS) {
    PyErr_SetString(PyExc_ValueError, "tensorfuse launcher: too many parameters");
    return NULL;
  }
  return c;
}

static int integer(PyObject *v, long long lo, long long hi, long long *out) {
  long long x = PyLong_AsLongLong(v);
  if (x == -1 && PyErr_Occurred()) return -1;
  if (x < lo || x > hi) {
    PyErr_Format(PyExc_OverflowError, "tensorfuse launcher: %%lld does not fit the parameter", x);
    return -1;
  }
  *out = x;
  return 0;
}

/* Each parameter's value in its own 8-byte slot, in the parameter's type (little-endian). */
static int pack(const Config *c, PyObject *const *values, Py_ssize_t n, uint64_t *slots) {
  Py_ssize_t k = 0;
  for (uint32_t i = 0; i < c->count; i++) {
    char code = c->codes[i];
    slots[i] = 0;
    if (code == 'z') continue;
    if (k >= n) {
      PyErr_SetString(PyExc_TypeError, "tensorfuse launcher: too few kernel arguments");
      return -1;
    }
    PyObject *v = values[k++];
    long long x;
    double f;
    switch (code) {
      case 'L': {
        unsigned long long u = PyLong_AsUnsignedLongLong(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        slots[i] = u;
        break;
      }
      case 'l': if (integer(v, INT64_MIN, INT64_MAX, &x)) return -1;
        memcpy(&slots[i], &x, 8); break;
      case 'i': { if (integer(v, INT32_MIN, INT32_MAX, &x)) return -1;
        int32_t y = (int32_t)x; memcpy(&slots[i], &y, 4); break; }
      case 'I': { if (integer(v, 0, UINT32_MAX, &x)) return -1;
        uint32_t y = (uint32_t)x; memcpy(&slots[i], &y, 4); break; }
      case 's': { if (integer(v, INT16_MIN, INT16_MAX, &x)) return -1;
        int16_t y = (int16_t)x; memcpy(&slots[i], &y, 2); break; }
      case 'S': { if (integer(v, 0, UINT16_MAX, &x)) return -1;
        uint16_t y = (uint16_t)x; memcpy(&slots[i], &y, 2); break; }
      case 'c': { if (integer(v, INT8_MIN, INT8_MAX, &x)) return -1;
        int8_t y = (int8_t)x; memcpy(&slots[i], &y, 1); break; }
      case 'C': { if (integer(v, 0, UINT8_MAX, &x)) return -1;
        uint8_t y = (uint8_t)x; memcpy(&slots[i], &y, 1); break; }
      case 'f': case 'd': case 'h': case 'b':
        f = PyFloat_AsDouble(v);
        if (f == -1.0 && PyErr_Occurred()) return -1;
        if (code == 'd') { memcpy(&slots[i], &f, 8); }
        else if (code == 'f') { float y = (float)f; memcpy(&slots[i], &y, 4); }
        else if (code == 'h') {
          if (PyFloat_Pack2(f, (char *)&slots[i], 1) < 0) return -1;
        } else {  /* bf16: the float's upper half, as Triton's launcher passes it */
          float y = (float)f; uint32_t u; memcpy(&u, &y, 4);
          uint16_t h = (uint16_t)(u >> 16); memcpy(&slots[i], &h, 2);
        }
        break;
      default:
        PyErr_Format(PyExc_ValueError, "tensorfuse launcher: unknown parameter code %%c", code);
        return -1;
    }
  }
  if (k != n) {
    PyErr_SetString(PyExc_TypeError, "tensorfuse launcher: too many kernel arguments");
    return -1;
  }
  return 0;
}

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 2) {
    PyErr_SetString(PyExc_TypeError, "launch(config, stream, *values)");
    return NULL;
  }
  const Config *c = config_of(args[0]);
  if (!c) return NULL;
  unsigned long long stream = PyLong_AsUnsignedLongLong(args[1]);
  if (stream == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  uint64_t slots[MAX_PARAMS];
  void *params[MAX_PARAMS];
  if (pack(c, args + 2, nargs - 2, slots)) return NULL;
  for (uint32_t i = 0; i < c->count; i++) params[i] = &slots[i];
  if (!cu_launch && load_driver()) return NULL;
  CUcontext context = NULL;
  if (cu_current(&context) != CUDA_SUCCESS || context == NULL) Py_RETURN_FALSE;
  CUresult r;
  Py_BEGIN_ALLOW_THREADS;
  r = cu_launch((CUfunction)(uintptr_t)c->function, c->grid[0], c->grid[1], c->grid[2],
                c->threads, 1, 1, c->shared, (CUstream)(uintptr_t)stream, params, NULL);
  Py_END_ALLOW_THREADS;
  if (r != CUDA_SUCCESS) {
    const char *text = NULL;
    cu_error(r, &text);
    PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed: %%s", text ? text : "unknown error");
    return NULL;
  }
  Py_RETURN_TRUE;
}

/* The parameter slots launch() would pass, as bytes (8 per parameter): for tests. */
static PyObject *packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "packed(config, *values)");
    return NULL;
  }
  const Config *c = config_of(args[0]);
  if (!c) return NULL;
  uint64_t slots[MAX_PARAMS];
  if (pack(c, args + 1, nargs - 1, slots)) return NULL;
  return PyBytes_FromStringAndSize((const char *)slots, 8 * (Py_ssize_t)c->count);
}

static PyMethodDef methods[] = {
  {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch(config, stream, *values)"},
  {"packed", (PyCFunction)(void (*)(void))packed, METH_FASTCALL, "packed(config, *values)"},
  {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tensorfuse_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_tensorfuse_launch(void) { return PyModule_Create(&module); }
""" % {"max": MAX_PARAMS}

_MODULE: list = []


def launcher():
    """The compiled C module (built on first use, then from Triton's cache), or None where it
    cannot be built here (no C compiler or Python headers: calls keep Triton's launcher) or where
    ``TENSORFUSE_NATIVE_LAUNCH=0`` turns it off."""
    if os.environ.get("TENSORFUSE_NATIVE_LAUNCH", "1") == "0":
        return None
    if not _MODULE:
        try:
            import triton
            from triton.runtime.build import compile_module_from_src

            include = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                   "include")
            _MODULE.append(compile_module_from_src(SOURCE, "tensorfuse_launch",
                                                   include_dirs=[include]))
        except Exception:  # noqa: BLE001 - any failure to build leaves Triton's launcher in use
            _MODULE.append(None)
    return _MODULE[0]


def plan(kernel, grid: tuple) -> bytes | None:
    """The launch configuration of Triton's compiled ``kernel`` on ``grid`` for
    ``launcher().launch``, or None for a kernel this launcher does not cover (thread-block
    clusters, cooperative or programmatic-dependent launches, tensor descriptors or tuple
    arguments: those keep Triton's launcher). The values passed at launch are the kernel's
    non-constexpr arguments, in order."""
    meta = kernel.metadata
    if not kernel.function or getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False) or \
            getattr(meta, "launch_pdl", False) or getattr(meta, "global_scratch_size", 0) or \
            getattr(meta, "profile_scratch_size", 0):
        return None
    codes = []
    for ty in kernel.src.signature.values():
        if ty == "constexpr":
            continue
        if not isinstance(ty, str):
            return None
        code = "L" if ty.startswith("*") else CODES.get(ty)
        if code is None:
            return None
        codes.append(code)
    codes += [SCRATCH, SCRATCH]
    if len(codes) > MAX_PARAMS:
        return None
    g = tuple(grid) + (1,) * (3 - len(grid))
    return CONFIG.pack(kernel.function or 0, g[0], g[1], g[2], 32 * meta.num_warps, meta.shared,
                       len(codes), "".join(codes).encode())


def values_in_order(kernel, names: list) -> list:
    """Which of ``names`` (a launch's argument names, in the kernel's order) are passed at launch:
    those Triton did not make constexpr (its constexprs and integers specialised to 1)."""
    signature = kernel.src.signature
    return [n for n in names if signature.get(n) not in (None, "constexpr")]
