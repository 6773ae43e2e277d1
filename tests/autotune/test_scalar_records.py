"""Records kept per value of the scalars that change the plan (a window, a prefix length), not of
those that do not (a softcap, a scale); lookups at other values take the nearest record or the
defaults, and ``schedule_origin`` says which. The records are committed through the database API
with times we choose (no GPU here); on the GPU, ``test_tuning_with_the_call_s_scalars`` tunes."""
from dataclasses import replace

import pytest
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.database import TuningRecord

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse import kernels as K
from tensorfuse.autotune import open_database
from tensorfuse.autotune.database import default_database_dir
from tensorfuse.autotune.lookup import tuned
from tensorfuse.autotune.scalars import plan_scalars
from tensorfuse.autotune.tasks import knob_space, knobs_of, make_task, tuning_target
from tensorfuse.errors import TuningError

SIZES = dict(B=1, H=2, M=512, N=512, D=64)
TARGET = "cuda:sm_80"


def test_plan_scalars_are_those_in_masks_and_indices():
    assert plan_scalars(K.sliding_window_attention.program) == ("window",)
    assert plan_scalars(K.prefix_lm_attention.program) == ("prefix",)
    assert plan_scalars(K.neighborhood_attention.program) == ("radius",)
    assert plan_scalars(K.softcap_attention.program) == ()   # scale and cap: values only
    assert plan_scalars(K.layernorm.program) == ()


def _record(task, knobs: dict, secs: float) -> None:
    """Commit a record of ``task`` with ``knobs`` measured at ``secs``."""
    path = default_database_dir(task.target)
    db = open_database(path)
    sch = __import__("tvm").s_tir.Schedule(task.mod)
    knob_space(task.choices(), knobs)(sch)
    db.commit_tuning_record(TuningRecord(sch.trace, db.commit_workload(task.mod), [secs],
                                         tuning_target(task.target),
                                         ArgInfo.from_prim_func(task.mod["main"])))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path / "cache"))


def test_two_windows_two_records_and_each_call_gets_its_own(cache):
    target = tf.get_target(TARGET)
    kernel = K.sliding_window_attention
    narrow = make_task(kernel, SIZES, target, {"window": 64})
    wide = make_task(kernel, SIZES, target, {"window": 384, "scale": 0.3})
    assert narrow.name.endswith("{window=64}") and wide.name.endswith("{window=384}")
    first, second = (dict(zip(narrow.choices(), (v[0] for v in narrow.choices().values()))),
                     dict(zip(narrow.choices(), (v[-1] for v in narrow.choices().values()))))
    _record(narrow, first, 1e-3)
    _record(wide, second, 2e-3)

    program, fusion = kernel.program, narrow.fusion
    at_64 = tuned(program, "attention", fusion, target, SIZES, {"window": 64, "scale": 0.9})
    at_384 = tuned(program, "attention", fusion, target, SIZES, {"window": 384})
    assert knobs_of(at_64[0]) == first and "1 ms when tuned, from" in at_64[1]
    assert knobs_of(at_384[0]) == second and "2 ms when tuned, from" in at_384[1]
    near = tuned(program, "attention", fusion, target, SIZES, {"window": 300})
    assert knobs_of(near[0]) == second
    assert "at window=384, the nearest tuned values to window=300" in near[1]
    assert tuned(program, "attention", fusion, target, SIZES, {"window": 16}) is None  # > 2x off
    assert tuned(program, "attention", fusion, target, dict(SIZES, M=256, N=256),
                 {"window": 64}) is None   # other sizes: no record

    compiled = tf.compile(kernel, TARGET)
    assert compiled.schedule_origin(**SIZES, window=64).startswith("tuned record (1 ms")
    assert "nearest tuned values to window=300" in compiled.schedule_origin(**SIZES, window=300)
    assert compiled.schedule_origin(**SIZES, window=16) == "template defaults"


def test_scalars_that_do_not_change_the_plan_share_one_record():
    target = tf.get_target(TARGET)
    one = make_task(K.softcap_attention, SIZES, target, {"cap": 30.0})
    other = make_task(K.softcap_attention, SIZES, target, {"cap": 50.0, "scale": 0.2})
    assert one.name == other.name and one.mod.script() == other.mod.script()
    assert one.scalars == {"cap": 30.0}   # but measured at the value given


@pytest.mark.parametrize("scalars, message", [
    ({"windw": 3}, "no scalar parameter named windw"),
    ({"window": "wide"}, "a finite number is needed"),
    ({"window": float("nan")}, "a finite number is needed"),
])
def test_bad_scalars_are_refused(scalars, message):
    with pytest.raises(TuningError, match=message):
        make_task(K.sliding_window_attention, SIZES, tf.get_target(TARGET), scalars)


def test_the_hopper_template_compile_picks_on_sm_90a_is_the_one_tuned(cache):
    """On sm_90a tf.compile runs prefill attention on the Hopper template: that is the task, and
    its record (per window) is what the compiled kernel uses."""
    target = tf.get_target("cuda:sm_90a")
    kernel = K.sliding_window_attention
    task = make_task(kernel, SIZES, target, {"window": 128})
    assert task.template == "hopper_attention"
    knobs = dict(task.space.defaults(), block_n=64, stages=3, pingpong=0)
    assert task.unfit(knobs) is None
    assert "registers per consumer" in task.unfit(dict(knobs, block_n=176, consumers=3))
    _record(task, {n: knobs[n] for n in task.choices()}, 5e-4)
    compiled = tf.compile(kernel, "cuda:sm_90a")
    origin = compiled.schedule_origin(**SIZES, window=128)
    assert origin.startswith("hopper_attention tuned record (0.5 ms when tuned")
    assert "block_n=64, stages=3" in origin and "pingpong=False" in origin
    assert compiled.schedule_origin(**SIZES, window=16).startswith(
        "hopper_attention template defaults")


def test_the_cluster_decode_compile_picks_on_sm_90a_is_the_one_tuned(cache):
    """On sm_90a tf.compile runs one query token on the cluster decode kernel: that is the task
    (its knobs: cluster, warps, stages, copy by index), the settings shared memory cannot hold
    are left out, and its record is what the compiled kernel uses at those sizes (defaults at
    others; the key count is a kernel argument, but records are kept per size, as every
    template's)."""
    target = tf.get_target("cuda:sm_90a")
    sizes = dict(B=2, H=8, HKV=2, M=1, N=4096, D=128)
    task = make_task(K.gqa_attention, sizes, target)
    assert task.template == "cluster_decode"
    assert set(task.choices()) == {"cluster", "warps", "stages", "copy"}
    defaults = task.space.defaults()
    assert defaults["copy"] == 0 and defaults["warps"] == 4   # bulk copies, four warps
    assert "shared memory" in task.unfit(dict(defaults, stages=4))
    knobs = dict(defaults, cluster=4, warps=2, stages=3, copy=1)
    assert task.unfit(knobs) is None
    _record(task, knobs, 2e-5)
    compiled = tf.compile(K.gqa_attention, "cuda:sm_90a")
    origin = compiled.schedule_origin(**sizes)
    assert origin.startswith("cluster_decode tuned record (0.02 ms when tuned"), origin
    assert "cluster=4, warps=2, stages=3, mma=mma_sync, copy=cp.async" in origin
    assert "tf_cp_async16" in compiled.for_sizes(**sizes).source(**sizes)
    other = dict(sizes, N=8192)
    assert compiled.schedule_origin(**other).startswith("cluster_decode template defaults (")
    assert "copy=tma" in compiled.schedule_origin(**other)


def test_a_lookup_where_no_record_is_lowers_nothing(cache, monkeypatch):
    """Every new shape of a compiled kernel asks the database (a decode cache that grows by a key
    a step asks at every step): where it holds no record of the kernel at those sizes with that
    template the answer comes from its index, without lowering the workload (18 ms a key count
    with one record in the database, 0.1 ms without); where it holds one, the record is found."""
    from tensorfuse.autotune import lookup

    target = tf.get_target("cuda:sm_90a")
    sizes = dict(B=2, H=8, HKV=2, M=1, N=4096, D=128)
    task = make_task(K.gqa_attention, sizes, target)
    _record(task, task.space.defaults(), 2e-5)
    lowered = []
    real = lookup.workload
    monkeypatch.setattr(lookup, "workload", lambda *a, **kw: lowered.append(a[3]) or real(*a, **kw))
    program, fusion = K.gqa_attention.program, task.fusion
    for n in (4097, 4098):
        assert tuned(program, "cluster_decode", fusion, target, dict(sizes, N=n)) is None
    assert tuned(program, "attention", fusion, target, sizes) is None   # another template
    assert lowered == []
    assert tuned(program, "cluster_decode", fusion, target, sizes) is not None
    assert lowered and lowered[0] == sizes


def test_a_kernel_not_preferred_at_these_sizes_is_not_laid_out():
    """``tf.compile`` asks each native template whether it runs a call's sizes; one that would not
    be preferred there answers without making its launches (the Hopper attention at a decode
    step made its source and looked up its records at every new key count)."""
    from tensorfuse.targets.cuda.kernel import ClusterKernel

    def layout(dims):
        raise AssertionError("laid out")

    kernel = ClusterKernel(K.attention.program, tf.get_target("cuda:sm_90a"), layout, "probe",
                           preferred=lambda dims: dims["M"] > 64)
    assert not kernel.fits(B=1, H=2, M=1, N=256, D=128)
    with pytest.raises(AssertionError, match="laid out"):
        kernel.fits(B=1, H=2, M=128, N=256, D=128)


def test_the_summary_says_when_the_space_ran_out():
    from tensorfuse.autotune.job import TaskResult, TuningSummary

    task = TaskResult("softmax[M=16,N=256]", "row_reduction", trials=21, trials_this_job=21,
                      settings=(21, 24))
    short = TuningSummary("cuda:sm_90a", "/db", [task], 10.0, asked=48)
    assert short.exhausted
    assert "the space is exhausted: 21 of the 48 trials asked were run" in str(short)
    assert "21 settings fit the GPU, of 24" in str(short)
    assert not TuningSummary("cuda:sm_90a", "/db", [task], 10.0, asked=21).exhausted
    assert not TuningSummary("cuda:sm_90a", "/db", [task], 10.0, interrupted=True,
                             asked=48).exhausted


def test_the_command_line_takes_scalars():
    from tensorfuse.cli import _scalars
    from tensorfuse.errors import TensorfuseError

    assert _scalars(["window=2048", "cap=30.5", "shift=-3"]) == {"window": 2048, "cap": 30.5,
                                                                 "shift": -3}
    with pytest.raises(TensorfuseError, match="NAME=NUMBER"):
        _scalars(["window"])
    with pytest.raises(TensorfuseError, match="NAME=NUMBER"):
        _scalars(["window=wide"])


@pytest.mark.parametrize("kernel, sizes, knobs, fits", [
    # prefill: Triton 3.6 on sm_90a needs 294912 bytes here (metadata.shared), 229376 with 3 stages
    (K.causal_attention, dict(B=1, H=2, M=1024, N=1024, D=128),
     dict(block_m=128, block_n=128, num_warps=8, num_stages=4, splits=1), False),
    (K.causal_attention, dict(B=1, H=2, M=1024, N=1024, D=128),
     dict(block_m=128, block_n=128, num_warps=8, num_stages=3, splits=1), True),
    # decode with 4 stages of 128 keys: 204800 bytes, which fits — never left out
    (K.gqa_attention, dict(B=2, H=8, HKV=2, M=1, N=4096, D=128),
     dict(block_m=16, block_n=128, num_warps=8, num_stages=4, splits=16), True),
])
def test_settings_that_cannot_fit_are_left_out_and_only_those(kernel, sizes, knobs, fits):
    task = make_task(kernel, sizes, tf.get_target("cuda:sm_90"))   # the Triton template's task
    assert task.template == "attention"
    assert (task.unfit(knobs) is None) == fits


def test_a_task_with_several_plan_scalars_is_named_alike_by_the_job_and_its_candidates(cache):
    """The job names a task from the program's scalars, a candidate's builder from its
    workload's JSON: with two or more plan scalars (a map's width, a radius, a dilation) both
    must give one name, or every candidate fails to find its task (it did on the H100)."""
    from tensorfuse.autotune.builder import task_key

    kernel = K.neighborhood_attention_2d
    assert set(plan_scalars(kernel.program)) == {"width", "radius", "dilation"}
    task = make_task(kernel, dict(B=1, H=2, M=1024, N=1024, D=64), tf.get_target(TARGET),
                     {"width": 32, "radius": 3, "dilation": 2})
    assert task.name.endswith("{dilation=2, radius=3, width=32}")
    assert task_key(task.mod) == task.name


def test_a_record_serves_the_sizes_of_its_power_of_two_bucket(cache, monkeypatch):
    """A softmax tuned at 4096 columns: tf.compile takes its knobs at 3000 and 5000 (the nearest
    power of two of each is 4096) and says where they come from; at 6000 and at 2048 it keeps the
    template defaults; a record at the call's own sizes wins over its neighbour's."""
    target = tf.get_target(TARGET)
    task = make_task(K.softmax, dict(M=512, N=4096), target)
    choices = task.choices()
    picked = {n: v[-1] for n, v in choices.items()}
    _record(task, picked, 1e-3)
    compiled = tf.compile(K.softmax, TARGET)
    for N in (3000, 5000):
        origin = compiled.schedule_origin(M=512, N=N)
        assert origin.startswith("tuned record (1 ms") and "tuned at M=512, N=4096" in origin, \
            origin
        plan = compiled.template.describe_plan(M=512, N=N)
        assert "tuned at M=512, N=4096" in plan
    for N in (6000, 2048):
        assert compiled.schedule_origin(M=512, N=N) == "template defaults"
    assert compiled.schedule_origin(M=400, N=4096).startswith("tuned record")   # 400 ~ 2⁹
    assert compiled.schedule_origin(M=300, N=4096) == "template defaults"    # 300 ~ 2⁸
    # the neighbour's record is replayed once, not at every new width that takes it
    from tensorfuse import records
    replays = []
    original = records.tuned
    monkeypatch.setattr(records, "tuned", lambda program, template, fusion, target, dims, *a:
                        replays.append(dims.get("N")) or original(program, template, fusion,
                                                                  target, dims, *a))
    compiled = tf.compile(K.softmax, TARGET)
    for N in range(3000, 3010):
        assert "tuned at M=512, N=4096" in compiled.schedule_origin(M=512, N=N)
    assert replays.count(4096) == 1 and len(replays) == 11   # each width's own record looked up
    own = make_task(K.softmax, dict(M=512, N=5000), target)
    _record(own, {n: v[0] for n, v in own.choices().items()}, 2e-3)
    tf.compile(K.softmax, TARGET)   # a new compile reads the database again
    assert "tuned at" not in tf.compile(K.softmax, TARGET).schedule_origin(M=512, N=5000)


def test_a_neighbours_record_that_does_not_fit_leaves_the_defaults():
    """Knobs tuned at other sizes of the bucket that cannot run at the call's (here a split
    count no grid launches) give way to the template defaults, and the origin says why."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction

    target = tf.get_target(TARGET)
    _, fusion = choose(K.softmax.program, target)

    def lookup(dims, scalars=None):
        return {"splits": 70000}, "1 ms when tuned; tuned at M=512, N=4096", dict(M=512, N=4096)
    lookup.scalar_names = ()
    made = row_reduction(K.softmax, fusion, target, tuned=lookup)
    plan, knobs = made.build(M=512, N=3000)[:2]
    assert knobs.splits != 70000
    assert made.schedule_origin(M=512, N=3000).startswith(
        "template defaults (the record of the nearest tuned sizes does not fit these")


def test_the_hopper_template_takes_a_record_of_its_bucket_where_it_runs(cache):
    """A Hopper attention record at 512 tokens serves 400 and 700 (nearest power of two 512),
    not 300; a record whose knobs cannot run gives way to the defaults (three consumers of
    176-key blocks need more registers than a consumer has: committed as if tuned, as a record
    of another version of the rules could be)."""
    target = tf.get_target("cuda:sm_90a")
    kernel = K.sliding_window_attention
    task = make_task(kernel, SIZES, target, {"window": 128})
    knobs = dict(task.space.defaults(), block_n=64, stages=3, pingpong=0)
    _record(task, {n: knobs[n] for n in task.choices()}, 5e-4)
    compiled = tf.compile(kernel, "cuda:sm_90a")
    for n in (400, 700):
        origin = compiled.schedule_origin(**dict(SIZES, M=n, N=n), window=128)
        assert origin.startswith("hopper_attention tuned record (0.5 ms when tuned"), origin
        assert "tuned at B=1, D=64, H=2, M=512, N=512" in origin and "block_n=64" in origin
    assert compiled.schedule_origin(**dict(SIZES, M=300, N=300), window=128).startswith(
        "hopper_attention template defaults")
    unfit = dict(knobs, block_n=176, consumers=3)
    assert "registers per consumer" in task.unfit(unfit)
    wide = make_task(kernel, dict(SIZES, M=1024, N=1024), target, {"window": 128})
    _record(wide, {n: unfit[n] for n in wide.choices()}, 1e-4)
    origin = tf.compile(kernel, "cuda:sm_90a").schedule_origin(**dict(SIZES, M=900, N=900),
                                                               window=128)
    assert origin.startswith("hopper_attention template defaults"), origin


def test_a_size_range_is_tuned_at_one_size_per_bucket(monkeypatch):
    """``--size N=1000..5000`` tunes 1024, 2048 and 4096 (every bucket the range meets, each
    tuned size in its own bucket and in the range), ``--size M=N`` follows N, and every kernel is
    tuned at every combination; a reversed or empty range, or a name no size has, is refused."""
    from tensorfuse import autotune, cli
    from tensorfuse.autotune.lookup import bucket_sizes, size_bucket
    from tensorfuse.errors import TensorfuseError

    made = bucket_sizes({"B": 2, "N": (1000, 5000), "M": "N"})
    assert [s["N"] for s in made] == [1024, 2048, 4096] and all(s["M"] == s["N"] for s in made)
    assert bucket_sizes({"N": (1500, 1500)}) == [{"N": 1500}]
    ends = bucket_sizes({"N": (1000, 1500)})   # 1500's bucket is 2048's: tuned at 1500
    assert [s["N"] for s in ends] == [1024, 1500]
    assert len({size_bucket(s) for s in ends}) == 2
    assert len(bucket_sizes({"M": (1, 64), "N": (100, 300)})) == 7 * 2   # 1..64; 128, 256
    for bad, match in (({"N": (5000, 1000)}, "LOW..HIGH"), ({"N": (0, 8)}, "LOW..HIGH"),
                       ({"M": "K", "N": 8}, "K is not given")):
        with pytest.raises(TensorfuseError, match=match):
            bucket_sizes(bad)
    with pytest.raises(TensorfuseError, match="NAME=LOW..HIGH"):
        cli._sizes(["N=10..x"], ranges=True)
    with pytest.raises(TensorfuseError, match="NAME=INTEGER, got"):
        cli._sizes(["N=1..8"])   # show takes one size per name
    asked = []
    monkeypatch.setattr(autotune, "tune", lambda kernels, **options: asked.append(
        (kernels, options)) or autotune.TuningSummary("llvm", "/db", [], 0.0))
    assert cli.main(["tune", "tensorfuse.kernels:softmax", "tensorfuse.kernels:rmsnorm",
                     "--size", "M=64", "--size", "N=3000..8192", "--quiet"]) == 0
    (kernels, options), = asked
    assert [(k.name, s) for k, s in kernels] == [
        (name, {"M": 64, "N": n}) for name in ("softmax", "rmsnorm") for n in (4096, 8192)]


def test_a_score_tile_read_by_query_and_key_counts_in_the_shared_memory():
    """A bias [H, S, S] in the score: Triton pipelines its 128 × 128 tiles beside the keys and
    values, so three stages (294912 bytes: Triton 3.6, sm_90a) do not fit; the template's
    default takes two, which compile within the SM's shared memory."""
    pytest.importorskip("triton", reason="the template generates Triton kernels")
    from benchmarks.unlisted_kernels import biased_attention_bshd
    from tensorfuse.schedule_templates.attention import shared_bytes

    made = tf.schedule(biased_attention_bshd, "cuda:sm_90a").rolling_update(
        "m", "out_sum", "out_sum_2", axis="j").apply_template("attention").compile()
    sizes = dict(B=2, S=2048, H=16, D=128)
    plan, knobs = made.build({}, **sizes)[:2]
    assert knobs.num_stages == 2
    assert shared_bytes(plan, replace(knobs, num_stages=3)) == 294912
    assert made.compiled(**sizes).metadata.shared == shared_bytes(plan, knobs) == 196608


@tf.kernel
def bucketed_attention(q: T.Tensor["B", "S", "H", "D", "bf16"],
                       k: T.Tensor["B", "S", "H", "D", "bf16"],
                       v: T.Tensor["B", "S", "H", "D", "bf16"],
                       bias: T.Tensor["H", "S", "S", "f64"], scale: T.f32):
    """The bias of ``biased_attention_bshd`` kept in float64."""
    b, i, h, j, d, e = T.axes("b i h j d e")
    s = T.sum(q[b, i, h, d] * k[b, j, h, d], over=d) * scale + T.cast(bias[h, i, j], "f32")
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, j, h, e], over=j) / T.sum(p, over=j)


def test_a_score_tile_of_wide_elements_counts_them_whole():
    """A float64 bias pipelines 8 bytes an element, not the 2 a 16-bit one takes: counted short,
    a tile past the shared memory would be planned."""
    from tensorfuse.schedule_templates.attention import shared_bytes

    made = tf.schedule(bucketed_attention, "cuda:sm_90a").rolling_update(
        "m", "out_sum", "out_sum_2", axis="j").apply_template("attention").compile()
    plan, knobs = made.build({}, B=2, S=2048, H=16, D=128)[:2]
    knobs = replace(knobs, num_stages=2)
    # two key and value slots and the queries (bf16, D=128), one slot of the bias's tile
    assert shared_bytes(plan, knobs) == 2 * knobs.block_n * 2 * 128 * 2 + \
        knobs.block_m * 128 * 2 + knobs.block_m * knobs.block_n * 8


def test_a_decode_written_with_three_axes_is_tuned_as_the_lifted_cluster_decode(cache):
    """A decode written without its query axis (``q[b, h, d]``) runs the cluster decode of the
    program lifted to four axes (``schedule_templates/lifted_kernel.py``): its task is that
    program's at the lifted sizes (the unit sizes added), and the record made of it is the one
    the three-axis kernel runs at those sizes — defaults at others."""
    from benchmarks.user_kernels import mqa_decode

    target = tf.get_target("cuda:sm_90a")
    sizes = dict(B=1, H=8, N=131072, D=128)
    task = make_task(mqa_decode, sizes, target)
    assert task.template == "cluster_decode" and task.kernel.name == "mqa_decode"
    assert task.dims == dict(sizes, ONE_Q=1, ONE_KV=1)
    assert task.kernel.program is not mqa_decode.program   # the lifted program
    knobs = dict(task.space.defaults(), cluster=4, warps=2, stages=3, copy=1)
    assert task.unfit(knobs) is None
    _record(task, knobs, 3e-5)
    compiled = tf.compile(mqa_decode, "cuda:sm_90a")
    origin = compiled.schedule_origin(**sizes)
    assert origin.startswith("lifted to four axes; cluster_decode tuned record (0.03 ms"), origin
    assert "cluster=4, warps=2, stages=3, mma=mma_sync, copy=cp.async" in origin
    assert "tf_cp_async16" in compiled.source(**sizes)
    other = dict(sizes, N=65536)
    assert compiled.schedule_origin(**other).startswith(
        "lifted to four axes; cluster_decode template defaults (")


@pytest.mark.parametrize("case", ["shared queries", "merged heads", "one cache"])
def test_attention_rewritten_for_the_hopper_template_is_tuned_as_the_rewritten_program(cache,
                                                                                        case):
    """Attention the Hopper template takes once rewritten (queries shared by the batch copied
    per sequence, query heads written as two axes merged, keys without a head axis given a unit
    one) is tuned as the rewritten program at its sizes — where ``tf.compile`` looks its records
    up: a record made of the task is what the kernel as written runs at those sizes."""
    from benchmarks.pipeline_kernels import latent_cross_attention
    from benchmarks.user_kernels import gqa_causal_grouped_axes, mqa_causal_one_cache

    kernel, sizes, added = {
        "shared queries": (latent_cross_attention, dict(L=256, B=32, S=4096, D=128),
                           dict(ONE_H=1)),
        "merged heads": (gqa_causal_grouped_axes, dict(B=2, G=8, R=4, S=4096, D=128),
                         dict(GR=32)),
        "one cache": (mqa_causal_one_cache, dict(B=2, H=16, S=4096, D=128), dict(ONE_KV=1))}[case]
    target = tf.get_target("cuda:sm_90a")
    task = make_task(kernel, sizes, target, {"scale": 0.088})
    assert task.template == "hopper_attention" and task.kernel.name == kernel.name
    assert task.kernel.program is not kernel.program   # the rewritten program
    assert {**sizes, **added}.items() >= task.dims.items() and added.items() <= task.dims.items()
    knobs = dict(task.space.defaults(), block_n=64, stages=3)
    assert task.unfit(knobs) is None
    _record(task, knobs, 3e-5)
    origin = tf.compile(kernel, "cuda:sm_90a").schedule_origin(**sizes, scale=0.088)
    assert "hopper_attention tuned record (0.03 ms" in origin, origin
    assert "block_n=64, stages=3" in origin, origin


def test_a_kernel_with_renamed_arguments_is_tuned_as_tf_compile_looks_it_up(cache):
    """A tensor named like a template's variable: the task tunes the renamed program
    (``renamed_params``), and tf.compile finds that record for the kernel as written."""
    from tests.targets.test_shadowed_names import scaled_softmax

    kernel, sizes = scaled_softmax("seen", "first"), dict(M=64, N=300)
    task = make_task(kernel, sizes, tf.get_target(TARGET), {"first": 2.0})
    assert {p.name for p in task.kernel.program.params} == {"arg_seen", "w", "arg_first"}
    _record(task, dict(zip(task.choices(), (v[-1] for v in task.choices().values()))), 1e-3)
    origin = tf.compile(kernel, TARGET).schedule_origin(**sizes)
    assert origin.startswith("arguments renamed; tuned record"), origin
