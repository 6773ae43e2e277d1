"""A job whose budget covers a kernel's space measures every fitting setting once, each kernel's in
one batch (``autotune.every_setting``); a smaller budget keeps the evolutionary search. GPU tasks
for sm_90a are made and searched here without a GPU; the measurement is a stand-in (what is
checked is which candidates reach it, and what is recorded)."""
import random

import pytest

import tensorfuse as tf
from tensorfuse import kernels as K
from tensorfuse.autotune import job, open_database, runner
from tensorfuse.autotune.every_setting import EverySetting
from tensorfuse.autotune.job import _measured_settings
from tensorfuse.autotune.pruning import fitting_settings_of, setting_key
from tensorfuse.autotune.tasks import knobs_of, make_task

SOFTMAX = dict(M=16384, N=8192)
DECODE = dict(B=8, H=32, HKV=8, M=1, N=32768, D=128)


@pytest.fixture
def stand_in_gpu(tmp_path, monkeypatch):
    """Jobs for sm_90a measured by a stand-in: each candidate's knobs noted, a random time."""
    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TENSORFUSE_COMPILE_AHEAD", "0")
    monkeypatch.setattr(job, "_check_device", lambda spec: None)
    monkeypatch.setattr(runner, "reference_inputs", lambda task: None)
    measured = []

    def measure(task, knobs, inputs, repeat_ms=50, kernel=None):
        measured.append((task.name, setting_key(knobs)))
        return 1e-4 * (1 + random.random())

    monkeypatch.setattr(runner, "measure", measure)
    return measured


def test_the_strategy_proposes_the_settings_it_is_given_once():
    task = make_task(K.softmax, SOFTMAX, tf.get_target("cuda:sm_90a"))
    settings = fitting_settings_of(task)[2:]
    strategy = EverySetting(task, settings)
    strategy.pre_tuning(1000, 32, [])
    proposed = [knobs_of(c.sch.mod) for c in strategy.generate_measure_candidates()]
    assert proposed == settings   # the schedules carry exactly those knobs
    assert strategy.generate_measure_candidates() is None   # then the task ends
    strategy.pre_tuning(5, 32, [])                          # a budget below the space
    assert len(strategy.generate_measure_candidates()) == 5


def test_a_budget_that_covers_the_spaces_measures_every_setting_once(stand_in_gpu):
    lines = []
    summary = tf.tune([(K.softmax, SOFTMAX), (K.gqa_attention, DECODE)], "cuda:sm_90a",
                      trials=400, progress=lines.append)
    assert any("the budget covers every setting that fits" in line for line in lines)
    tasks = [make_task(K.softmax, SOFTMAX, tf.get_target("cuda:sm_90a")),
             make_task(K.gqa_attention, DECODE, tf.get_target("cuda:sm_90a"))]
    db = open_database(summary.database, read_only=True)
    for task, result in zip(tasks, summary.tasks):
        fitting = {setting_key(k) for k in fitting_settings_of(task)}
        assert _measured_settings(db, task) == fitting          # every one recorded
        # measured: the defaults, the search's candidates, then the defaults (as {}) and the
        # best record again for the summary
        ran = [key for name, key in stand_in_gpu if name == task.name]
        searched, defaults = ran[1:-2], setting_key(knobs_of(task.default_schedule().mod))
        # each once, all of them
        assert ran[0] == defaults and ran[-2] == () and len(searched) == len(set(searched))
        assert set(searched) | {defaults} == fitting and defaults not in searched
        assert result.trials == len(fitting) and result.failures_this_job == 0
        batches = [line for line in lines if line.startswith(f"  {task.name}: ")
                   and " trials (" in line]
        assert len(batches) == 1                                 # in one batch
    assert summary.exhausted


def test_a_smaller_budget_keeps_the_evolutionary_search(stand_in_gpu):
    lines = []
    summary = tf.tune(K.softmax, "cuda:sm_90a", trials=20, progress=lines.append, **SOFTMAX)
    assert not any("the budget covers" in line for line in lines)
    assert summary.tasks[0].trials == 20 and not summary.exhausted
