# %% [markdown]
# # 3. Tuning a kernel for your machine
#
# `tensorfuse.compile` starts from a template's defaults. `tensorfuse.tune` searches the
# template's knobs with TVM's MetaSchedule, guided by its XGBoost cost model, measures candidates
# on this machine, and keeps the records in a database per device. `compile` then uses the best
# record for the sizes it was tuned at, and says so.
#
# This notebook tunes on the local target: the CPU here (the tests run it there), the GPU where
# there is one. On the command line the same job is
# `tensorfuse tune tensorfuse.kernels:rmsnorm --trials 16 --size M=128 --size N=512`.

# %%
import os
import tempfile

import numpy as np
import tensorfuse as tf
from tensorfuse import kernels as K
from tensorfuse.kernels.reference import TOLERANCE, random_inputs, reference, relative_error

# A private cache for this notebook, so it neither reads nor changes your real database.
os.environ["TENSORFUSE_CACHE"] = tempfile.mkdtemp(prefix="tensorfuse-tutorial-")
target = tf.get_target("auto")
sizes = dict(M=128, N=512) if not target.is_gpu else dict(M=4096, N=4096)
print("tuning for", target.name, "at", sizes)

# %% [markdown]
# ## What `compile` uses before tuning
# `schedule_origin` tells where the schedule at given sizes comes from.

# %%
before = tf.compile(K.rmsnorm, target)
print(before.schedule_origin(**sizes) if hasattr(before, "schedule_origin") else before)

# %% [markdown]
# ## A tuning job
# `trials` is the budget of measured candidates. A line per batch reports progress; the table at
# the end compares the best record with the defaults, both timed here the same way. Stop the
# job with Ctrl-C whenever you like: the batch in flight is finished and recorded, and running
# the same call again goes on from there.

# %%
summary = tf.tune(K.rmsnorm, target, trials=16, **sizes)

# %% [markdown]
# ## The database
# One folder per device (GPU name and compute capability, or CPU model) and tensorfuse version,
# in MetaSchedule's JSON format: a table of workloads and one line per measured candidate.

# %%
from tensorfuse.autotune import open_database

print(summary.database)
db = open_database(summary.database)
records = db.get_all_tuning_records()
print(len(records), "records")
best = min((r for r in records if r.run_secs), key=lambda r: float(np.mean([float(s) for s in r.run_secs])))
print("best candidate measured at", f"{np.mean([float(s) for s in best.run_secs]) * 1e3:.4g} ms")

# %% [markdown]
# ## The best schedule's trace
# The trace is the list of schedule steps, sampled decisions included, that MetaSchedule
# replays on the kernel's TensorIR. On the CPU: which loops run in parallel, how innermost
# loops are split and vectorised, how deep loops unroll. On a GPU template: the knobs (tile
# sizes, warps, pipeline stages, split parts) as annotations.

# %%
print(best.trace)

# %% [markdown]
# ## `compile` now uses the record
# ...and the kernel is still checked against the float64 reference, on fresh random inputs.

# %%
after = tf.compile(K.rmsnorm, target)
print(after.schedule_origin(**sizes))
tensors, scalars = random_inputs(K.rmsnorm, sizes, np.random.default_rng())
out = after(**tensors, **scalars)
err = relative_error(out, reference(K.rmsnorm, tensors, scalars))
print(f"max relative error {err:.2e} (bf16 tolerance {TOLERANCE['bf16']:.0e})")
assert err <= TOLERANCE["bf16"]

# %% [markdown]
# ## Tune at the values you call with
# A window, a prefix length or a radius decides which blocks of work exist, so the best knobs
# depend on it: pass the values you call with (`scalars={"window": 2048}`, or
# `--scalar window=2048`). Records are kept per value of the scalars that reach a mask or an
# index, and not per softcap or scale; a call with other values gets the nearest record (within
# 2×) or the defaults, and `schedule_origin(**sizes, window=...)` says which. Here, without
# running anything, the tasks a GPU job would make (on an H100, prefill attention is tuned on the
# Hopper template, which is what `compile` runs there):

# %%
from tensorfuse.autotune.scalars import plan_scalars
from tensorfuse.autotune.tasks import make_task

print(plan_scalars(K.sliding_window_attention.program), plan_scalars(K.softcap_attention.program))
attention_sizes = dict(B=2, H=16, M=4096, N=4096, D=128)
for target_name in ("cuda:sm_90a", "cuda:sm_80"):
    task = make_task(K.sliding_window_attention, attention_sizes, tf.get_target(target_name),
                     {"window": 2048})
    print(target_name, task.template, task.name, f"{task.space_size} settings")

# %% [markdown]
# ## Every GPU of a machine, or many machines
# `tensorfuse tune ... --gpus all` measures on every GPU here (the job's own process on the
# first, a worker per other GPU). For a fleet, start TVM's RPC tracker and a worker per GPU host,
# all sharing a secret, then point the job at the tracker; the job alone writes the database,
# and `tensorfuse merge` joins databases tuned apart:
#
#     export TENSORFUSE_TUNING_SECRET=...      # on every host
#     python -m tvm.exec.rpc_tracker --host 127.0.0.1 --port 9190
#     tensorfuse worker --tracker 127.0.0.1:9190 --key h100 --gpu 0
#     tensorfuse tune my_kernels.py:attn --size ... --tracker 127.0.0.1:9190 --key h100
#
# Everything binds to 127.0.0.1 unless told otherwise (a TVM RPC server runs what it is sent:
# across hosts, use an SSH tunnel or a private network).
