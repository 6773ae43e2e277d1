"""Programs whose one reduction a template reads another way than as it is written, ahead of
every template that would take it as written: a one-hot sum — a gathered read's gradient — as
the scatter-add it is (:mod:`.schedule_templates.scatter`: each term added into the element its
index names, not every element visiting every term), a reduction over the positions up to each
output's own — a cumulative sum — as a scan (:mod:`.schedule_templates.scan`: N terms, not
N²), and one over a band of positions around each output's own — a rolling maximum, a moving
sum — as two scans of segments (:func:`.schedule_templates.bands.plan_band`: a few operations
an output, not the band's width)."""
from __future__ import annotations

from .schedule_templates.bands import band_window
from .schedule_templates.base_two_weights import base_two_weights
from .schedule_templates.merged_reductions import merged_reductions
from .schedule_templates.nested_scans import nested_scans
from .schedule_templates.normalised_sums import normalised_sums

# the equivalent programs ``tf.compile`` compiles on a GPU instead of one as written, in order:
# nested reductions of one monoid as one over their axes (a soft-argmax's nested sums: one
# kernel, not a stage a level); a reduction over a band around each output's position (a
# rolling maximum) over a window axis of the band's width, not the whole row; one over ranges
# of several axes (an integral image) as a scan an axis; a sum of terms divided by a finished
# reduction over its axis (attention written softmax-then-sum) as the sum divided after;
# attention's weights in base two (exp2 of scores scaled by log2 e) as natural exponentials
PROGRAM_REWRITES = (merged_reductions, band_window, nested_scans, normalised_sums,
                    base_two_weights)


def equivalent_program(program):
    """``program`` after every rewrite of :data:`PROGRAM_REWRITES` that applies, in turn, as
    ``tf.compile`` applies them on a GPU (each rewritten program compiled anew): the form the
    templates recognise — what a backward planned from the forward's chain must read too (the
    gradient of an equivalent program is the program's), or ``program`` itself."""
    for _ in range(len(PROGRAM_REWRITES) * 2):   # each rewrite leaves a form it does not match
        found = next((made for rewrite in PROGRAM_REWRITES
                      if (made := rewrite(program)) is not None), None)
        if found is None:
            return program
        program = found[0]
    return program


def read_other_way(kernel, spec, dynamic: "bool | None" = None):
    """The scatter-add, scan or band template's kernel of ``kernel`` on the GPU ``spec`` where its
    program is one of those forms (Triton importable: the caller's to know), else ``None``."""
    from .schedule_templates.auto import scatters
    from .errors import TargetError
    from .schedule_templates.bands import plan_band
    from .schedule_templates.chain_scans import plan_chain_scan
    from .schedule_templates.scan import plan_scan
    from .schedule_templates.scatter import plan_scatter
    from .targets.triton.reductions import reducible
    from .targets.triton.scan_kernel import BandKernel, ScanKernel
    from .targets.triton.scatter_kernel import ScatterKernel

    if scatters(kernel.program):
        return ScatterKernel(plan_scatter(kernel.program), spec, dynamic)
    for plans, made in ((plan_scan, ScanKernel), (plan_chain_scan, ScanKernel),
                        (plan_band, BandKernel)):
        try:   # planned once: the plan is the kernel's
            plan = plans(kernel.program)
        except TargetError:
            continue
        return made(plan, spec, dynamic) if reducible(plan.monoid) else None
    return None


def scan_refused(program) -> list:
    """``[("the scan template", why)]`` where the one reduction of ``program`` compares its
    axis with its result's as a scan does but the template refuses the program
    (:func:`.schedule_templates.scan.near_miss`: the plan then says why it runs as N² terms);
    else ``[]``."""
    from .schedule_templates.scan import near_miss

    why = near_miss(program)
    return [("the scan template", why)] if why else []
