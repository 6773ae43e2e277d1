"""What a fused chain reads from the rest of its program, and the order in which the lowering
(:mod:`.fusion`) emits chains and the computes around them."""
from __future__ import annotations

from ..algebra import Chain, inline_elementwise
from ..dsl.expr import Expr, Ref, walk
from ..dsl.program import Compute


class ChainInputs:
    """What a chain reads from the rest of the program: reductions recomputed per chunk (they
    run over the fused axis) and computes needed before the pass."""

    def __init__(self, chain: Chain):
        self.local: list[Compute] = []
        self.outside: dict[str, Compute] = {}
        members = {m.name for m in chain.members}
        seen: set[str] = set()

        def visit_expr(e: Expr):
            def visit(n):
                if isinstance(n, Ref) and n.compute.name not in members:
                    visit_compute(n.compute)

            walk(e, visit)

        def visit_compute(c: Compute):
            if c.name in seen:
                return
            seen.add(c.name)
            if c.is_reduction and any(a.uid == chain.axis.uid for a in c.axes):
                for b in c.bodies:
                    visit_expr(inline_elementwise(b))
                self.local.append(c)  # after what it reads: a valid order
            elif c.is_reduction or not any(a.uid == chain.axis.uid for a in c.axes):
                self.outside[c.name] = c
            else:
                visit_expr(c.bodies[0])

        for m in chain.members:
            for b in chain.bodies[m.name]:
                visit_expr(b)


def emission_order(program, chains, analyses, owner) -> list:
    """Needed computes and chains (as indices) in an order that respects every dependency."""
    node_of = lambda c: owner.get(c.name, c)  # noqa: E731
    needed: dict = {}
    stack = list(program.outputs)
    while stack:
        c = stack.pop()
        node = node_of(c)
        key = node if isinstance(node, int) else c.name
        if key in needed:
            continue
        needed[key] = node
        if isinstance(node, int):
            stack.extend(analyses[node].outside.values())
        else:
            stack.extend(c.inputs())
    deps: dict = {}
    for key, node in needed.items():
        if isinstance(node, int):
            deps[key] = {k for k in analyses[node].outside}
        else:
            deps[key] = {(owner[i.name] if i.name in owner else i.name) for i in node.inputs()}
    position = {c.name: k for k, c in enumerate(program.computes)}
    first = lambda key: (min(position[m.name] for m in chains[key].members)  # noqa: E731
                         if isinstance(key, int) else position[key])
    order, done = [], set()

    def place(key):
        if key in done:
            return
        done.add(key)
        for d in sorted(deps[key], key=first):
            place(d)
        order.append(needed[key])

    for key in sorted(needed, key=first):
        place(key)
    return order
