"""tensorfuse: a compiler for fused GPU reduction kernels, built on Apache TVM.

>>> import tensorfuse as tf
>>> from tensorfuse import dsl as T
>>> @tf.kernel
... def softmax(x: T.Tensor["M", "N", "f32"]):
...     i, j = T.axes("i j")
...     m = T.max(x[i, j], over=j)
...     e = T.exp(x[i, j] - m)
...     return e / T.sum(e, over=j)
>>> f = tf.compile(softmax, target="llvm")
"""
__version__ = "0.1.0"

from .targets.cpu_threads import use_all_cores

use_all_cores()   # before any kernel runs: TVM's pool would take half the cores

from . import dsl, errors  # noqa: E402
from .api import compile, schedule
from .autotune import tune
from .autograd import grad
from .compiled import CompiledKernel
from .errors import TensorfuseError
from .kernel import Kernel, kernel
from .schedule import Schedule
from .targets import get_target
from . import kernels  # noqa: E402 - the library's kernels (tf.kernels.rmsnorm, …) use `kernel`

__all__ = ["dsl", "errors", "kernels", "compile", "schedule", "CompiledKernel", "TensorfuseError",
           "Kernel", "kernel", "Schedule", "get_target", "tune", "grad", "__version__"]
