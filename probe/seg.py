import warnings, sys
warnings.simplefilter("ignore")
import torch
import tensorfuse as tf
from tensorfuse import dsl as T
from tests.schedule_templates.staged_floor import interpreted

@tf.kernel
def seg_argmax(logits: T.Tensor["B", "C", "H", "W", "bf16"]):
    b, c, h, w = T.axes("b c h w")
    return T.argmax(logits[b, c, h, w], over=c)

@tf.kernel
def col_count(x: T.Tensor["N", "D", "f32"]):
    n, d = T.axes("n d")
    m = T.max(x[n, d], over=n)
    return T.sum(T.where(x[n, d] == m, 1.0, 0.0), over=n)

g = torch.Generator().manual_seed(int(sys.argv[1]))
for B, C, H, W in ((2, 19, 33, 35), (1, 150, 16, 64), (4, 3, 8, 8)):
    x = (torch.randn(B, C, H, W, generator=g) * 3).round().bfloat16()
    c = tf.compile(seg_argmax, target="cuda:sm_90a")
    print(c.schedule_origin(B=B, C=C, H=H, W=W)[:200])
    out = interpreted(seg_argmax)(logits=x)
    want = torch.argmax(x.double(), 1)
    print((B, C, H, W), "OK" if torch.equal(out.long(), want) else "WRONG")
for N, D in ((5000, 48), (300, 600)):
    x = (torch.randn(N, D, generator=g) * 2).round()
    c = tf.compile(col_count, target="cuda:sm_90a")
    print(c.schedule_origin(N=N, D=D)[:200])
    out = interpreted(col_count)(x=x)
    want = (x == x.max(0, keepdim=True).values).sum(0).float()
    print((N, D), "OK" if torch.equal(out.float(), want) else f"WRONG {(out.float()-want).abs().max()}")
