"""Every generated kernel source is byte-identical to the recorded one (``golden_sources.txt``):
the emitters are restructured without changing a kernel, and a deliberate change is recorded in
the same commit (``python -m tests.targets.golden_sources --write``; its docstring says what
evidence goes with it)."""
from __future__ import annotations

import os

from tests.targets.golden_sources import hashes_in_parallel, read_golden


def test_every_generated_source_is_the_recorded_one():
    want = read_golden()
    got = hashes_in_parallel(min(2, os.cpu_count() or 1))
    missing, new = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    changed = sorted(n for n in set(want) & set(got) if want[n] != got[n])
    assert not (missing or new or changed), (
        f"{len(changed)} sources changed: {changed[:20]}; {len(missing)} cases no longer made: "
        f"{missing[:10]}; {len(new)} new cases: {new[:10]} — if deliberate, regenerate with "
        "`python -m tests.targets.golden_sources --write` (tests/targets/golden_sources.py)")
    assert len(want) > 400   # every family of kernels is there
