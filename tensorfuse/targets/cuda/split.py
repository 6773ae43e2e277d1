"""Work split across CTAs and merged without waiting: the last arrival merges.

A tile whose reduction is split into pieces run by different CTAs (the Hopper GEMM's pieces
along K, the Hopper attention's pieces of a tile's keys) is merged by whichever piece finishes
last: each piece writes its partial state to a workspace, then arrives on a counter per tile;
the arrival that completes the count reads the others' partials (``ld.global.cg``) and finishes
the tile. Nobody waits for another CTA, so launches on concurrent streams cannot deadlock (a
piece spinning on a counter could hold an SM that the piece it waits for needs).
"""
from __future__ import annotations

HELPERS = r"""
// After every thread of a group (named barrier `bar`, `threads` threads) has written its piece's
// partial state: whether the group's arrival on `*counter` is the `expected`-th, the last — then
// the counter is left at 0 for the next launch and the other pieces' writes are visible to the
// group's cache-global reads that follow. `leader`: the one thread that arrives; `flag`: shared
// memory the group hears the answer through.
__device__ __forceinline__ bool tf_arrived_last(int* counter, int expected, int bar, int threads,
                                                bool leader, volatile int* flag) {
  __threadfence();
  asm volatile("bar.sync %0, %1;" :: "r"(bar), "r"(threads) : "memory");
  if (leader) {
    const bool last = atomicAdd(counter, 1) == expected - 1;
    if (last) atomicExch(counter, 0);
    *flag = last;
  }
  asm volatile("bar.sync %0, %1;" :: "r"(bar), "r"(threads) : "memory");
  const bool last = *flag;
  if (last) __threadfence();
  return last;
}
"""
