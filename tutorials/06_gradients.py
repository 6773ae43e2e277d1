# %% [markdown]
# # 6. Gradients: the backward pass is a program too
#
# A kernel's backward pass is itself a chain of reductions. `tf.grad` derives it from the DSL
# program by reverse-mode differentiation and hands back a kernel you can print, compile, fuse and
# tune like any other. Compiled kernels are also differentiable in PyTorch: called on tensors that
# require grad, they record their backward with autograd.

# %%
import numpy as np
import torch
import tensorfuse as tf
from tensorfuse import dsl as T


@tf.kernel
def temperature_cross_entropy(logits: T.Tensor["M", "V", "f64"], t: T.Tensor["M", "f64"],
                              target: T.Tensor["M", "i32"]):
    """Cross-entropy of logits divided by a per-row temperature."""
    i, j = T.axes("i j")
    s = logits[i, j] / t[i]
    m = T.max(s, over=j)
    return m + T.log(T.sum(T.exp(s - m), over=j)) - logits[i, target[i]] / t[i]

# %% [markdown]
# ## The backward program
# Its parameters are the forward's plus the incoming gradient `d_out`; its outputs the gradients
# of the floating-point tensors (`target` is an integer input: it has none). The forward values
# it needs are recomputed from the inputs. The gather `logits[i, target[i]]` becomes an equality
# mask over the vocabulary, added into the gradient of the plain read `logits[i, j]`: one
# `d_logits`. The maximum `m` only keeps the exponentials in range — the loss does not change
# when it moves (`m` and `log(l)` move together) — which tensorfuse derives from the program
# (`stabilising_maxima`), so it gets no adjoint: no pass counting the elements tied with it, and
# the backward stays one sweep over each row.

# %%
from tensorfuse.dsl.stabilisers import stabilising_maxima

backward = tf.grad(temperature_cross_entropy)
print(backward.program)
assert [p.name for p in backward.program.params][-1] == "d_out"
outputs = [c.name for c in backward.program.outputs]
assert sorted(outputs) == ["d_logits", "d_t"]   # the gathered part added into d_logits
assert stabilising_maxima(temperature_cross_entropy.program) == {"m"}
assert not any(c.name.startswith("ties") for c in backward.program.computes)

# %% [markdown]
# ## Called directly ...

# %%
rng = np.random.default_rng(0)
logits = rng.standard_normal((4, 50)) * 3.0
t = rng.uniform(0.5, 2.0, 4)
target = rng.integers(0, 50, 4).astype(np.int32)
d_logits, d_t = backward(logits, t, target, np.ones(4), target="llvm")
print(d_logits.shape, d_t)
# by hand: d/ds = softmax(s) - onehot(target), and s = logits / t
s = logits / t[:, None]
p_ = np.exp(s - s.max(1, keepdims=True))
p_ /= p_.sum(1, keepdims=True)
d_s = p_ - np.eye(50)[target]
assert np.allclose(d_logits, d_s / t[:, None], rtol=1e-10, atol=1e-12)
assert np.allclose(d_t, -(d_s * s).sum(1) / t, rtol=1e-10, atol=1e-12)

# %% [markdown]
# ## ... or through PyTorch autograd
# The compiled kernel is a custom operator whose backward runs the compiled backward kernel;
# `gradcheck` compares it with finite differences in float64.

# %%
f = tf.compile(temperature_cross_entropy, target="llvm")
x = torch.tensor(logits, requires_grad=True)
temperature = torch.tensor(t, requires_grad=True)
labels = torch.tensor(target)
passed = torch.autograd.gradcheck(lambda x, t: f(x, t, labels), (x, temperature))
print(passed)
assert passed

reference = torch.nn.functional.cross_entropy(x / temperature[:, None], labels.long(),
                                              reduction="sum")
want = torch.autograd.grad(reference, (x, temperature))
got = torch.autograd.grad(f(x, temperature, labels).sum(), (x, temperature))
differences = [float((a - b).abs().max()) for a, b in zip(got, want)]
print(differences)
assert max(differences) < 1e-10   # float64 against PyTorch's own cross-entropy

# %% [markdown]
# On an NVIDIA GPU, attention's backward does not run this generic program: it gets
# FlashAttention-2's backward, generated from the same forward (the score's derivative, the
# mask's block lists, grouped heads) — see `python -m benchmarks.attention_backward`.
