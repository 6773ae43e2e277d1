"""GQA decode at B=4 (32 query heads on 8 kv-heads, 32k keys, D=128, bf16) through the cluster
kernel (``cluster_distribute``, its defaults) and through the split-update template, three
calls each, for Nsight Compute to profile the cluster kernel and the split update's part kernel
(issue 18: the cluster kernel streams the keys at 0.89x the split update's rate at B=4 only).

    ncu --clock-control none -k regex:'tf_decode_cluster|_part' --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python tools/ncu_decode.py
"""
import torch

from benchmarks.cluster import (DECODE_D, DECODE_HEADS, DECODE_KEYS, cluster_decode,
                                decode_inputs, split_update_decode)

B = 4
q, k, v, scale, _, _ = decode_inputs(B)
cluster = cluster_decode()
split = split_update_decode()
print(cluster.launches(B=B, H=DECODE_HEADS[0], HKV=DECODE_HEADS[1], M=1, N=DECODE_KEYS,
                       D=DECODE_D).knobs)
for f in (cluster, split):
    for _ in range(3):
        out = f(q, k, v, scale=scale)
    torch.cuda.synchronize()
print("max |cluster - split|:", (cluster(q, k, v, scale=scale).float()
                                 - split(q, k, v, scale=scale).float()).abs().max().item())
