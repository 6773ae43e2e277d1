"""The algebra of rolling updates (pure Python, no TVM).

A chain of reductions where later ones depend on earlier ones (max → sum of exp(x − max) → weighted
sum) can run in one pass if each dependent value can be *corrected* when the values it depends on
change. This package derives those corrections from the expression tree by rewrite rules
(:mod:`.transfer`), turns them into running states per monoid (:mod:`.schemes`), checks every one
numerically (:mod:`.verify`) and plans whole chains (:mod:`.chain`).
"""
from .chain import Chain, chain_candidates, inline_elementwise, plan_chain
from .schemes import Scheme, State, derive_scheme
from .transfer import Context, NoCorrection, Reset, Terms, register_rule, transfer
from .verify import verify_scheme

__all__ = ["Chain", "chain_candidates", "plan_chain", "inline_elementwise", "Scheme", "State", "derive_scheme",
           "Context", "NoCorrection", "Reset", "Terms", "register_rule", "transfer",
           "verify_scheme"]
