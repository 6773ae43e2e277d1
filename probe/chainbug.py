import numpy as np, warnings
warnings.simplefilter("ignore")
import tensorfuse as tf
from tensorfuse import dsl as T

@tf.kernel
def chain(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    v = T.sum(T.abs(x[i, j]) + 0.25, over=j)
    v_2 = T.min((T.abs(x[i, j]) + 0.25) / v, over=j)
    v_3 = T.logsumexp(x[i, j] * (j % 3) + 1.0 - v_2, over=j)
    r = T.min(T.where((j % 3 == 1) | (i == 1), x[i, j] * (j % 3) + 1.0 + v_3 * 0.5, T.inf), over=j)
    return v, v_2, v_3, r

rng = np.random.default_rng(0)
for n in (1, 2):
    x = (10000.0 + 0.001 * rng.standard_normal((4, n))).astype(np.float32)
    plain = tf.compile(chain, "llvm")(x)
    sch = tf.schedule(chain, "llvm")
    sch.rolling_update("v", "v_2", "v_3", "r", axis="j", chunk=96)
    rolled = sch.compile()(x)
    for name, p, r in zip(("v", "v_2", "v_3", "r"), plain, rolled):
        print(n, name, np.asarray(p)[:3], np.asarray(r)[:3])
