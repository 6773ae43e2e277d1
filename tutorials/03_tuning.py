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
