"""Program → TensorIR: one PrimFunc, one ``sblock`` per compute, named after the DSL variable."""
from .naive import lower_naive
from .builder import FunctionBuilder, LoopAxis, emit_compute
from .expr_to_tir import Scope, lower as lower_expr

__all__ = ["lower_naive", "FunctionBuilder", "LoopAxis", "emit_compute", "Scope",
           "lower_expr"]
