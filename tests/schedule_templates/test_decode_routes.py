"""Which decode kernel ``tf.compile`` runs on sm_90a: the cluster kernel where the H200's grid
measured it ahead of the split update (few (batch, kv-head) pairs over caches under 256 MB),
the split update elsewhere — told from the sizes alone."""
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.schedule_templates.decode_plan import LARGE_CACHE, cluster_decode_pays

CACHE = 2 * 128 * 2   # bytes of a key and its value, head dim 128, bf16


@pytest.mark.parametrize("pairs, keys, cluster", [
    (1, 131072, True),     # 64 MB
    (8, 32768, True),      # 128 MB
    (8, 131072, False),    # 512 MB: past LARGE_CACHE
    (32, 1024, False),
    (128, 32768, False),
    (31, 1024, True),
    (256, 1024, False),    # the split update unsplit (benchmarks.decode_knobs --only grid)
    (512, 131072, False),
    (2048, 4096, False),
])
def test_the_cluster_kernel_is_preferred_where_it_was_measured_ahead(pairs, keys, cluster):
    assert cluster_decode_pays(pairs, pairs * keys * CACHE) is cluster


def test_few_pairs_leave_the_cluster_kernel_at_a_large_cache():
    assert cluster_decode_pays(16, LARGE_CACHE - 1) and not cluster_decode_pays(16, LARGE_CACHE)


@pytest.mark.parametrize("B, HKV, N, route", [
    (1, 8, 32768, "cluster_decode"),
    (4, 8, 32768, "template defaults"),     # 32 pairs: the split update
    (1, 8, 131072, "template defaults"),    # 512 MB
    (32, 8, 16384, "template defaults"),    # 256 pairs
])
def test_tf_compile_takes_the_route_the_sizes_say(B, HKV, N, route):
    made = tf.compile(K.gqa_attention, "cuda:sm_90a")
    origin = made.schedule_origin(B=B, H=4 * HKV, HKV=HKV, M=1, N=N, D=128)
    assert origin.startswith(route), origin
