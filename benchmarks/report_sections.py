"""What ``benchmarks/report.py`` writes RESULTS.md and the README's table from: each benchmark's
section (its CSV's name, a title, what the numbers are, the command that makes them) in the
order RESULTS.md shows them, and the README's headline cases."""

# The benchmarks in the order RESULTS.md shows them: the CSV's name after the device, a title,
# what the numbers are and the command that makes them (each run checks against float64 first).
SECTIONS = (
    ("hopper-attention", "Attention prefill (`tf.compile`: the Hopper template on sm_90a)",
     "bf16, B=2, 16 heads (GQA 32/8), D=128; TFLOP/s of the unmasked FLOPs; `tensorfuse` is "
     "`tf.compile`'s choice, `tensorfuse hopper` / `tensorfuse triton` each template by hand",
     "python -m benchmarks.hopper_attention --csv PATH"),
    ("hopper-attention-tuned", "Attention prefill with tuned records",
     "as above, after `tf.tune` (16 trials a kernel)",
     "python -m benchmarks.hopper_attention --csv PATH --tune 16"),
    ("user-kernels", "Kernels as users write them (their layouts, `tf.compile` defaults)",
     "bf16; each against the best torch alternative on the same tensors (SDPA on views of them)",
     "python -m benchmarks.user_kernels"),
    ("user-kernels-tuned", "Kernels as users write them, tuned",
     "as above, then `tf.tune` at each call's sizes (`tensorfuse tuned`: tf.compile reading "
     "the records; trials a task in its note)", "python -m benchmarks.user_kernels --tune 6"),
    ("unlisted-kernels", "Kernels no issue lists, as a new user writes them",
     "bf16 (the router, the squared distances, the Gaussian sum and the nearest neighbours "
     "f32); each against the best "
     "torch alternative on the same tensors; the distances in TFLOP/s (3 operations a pair and "
     "dimension) against cuBLAS's f32 GEMM on the CUDA cores, whose fused multiply-adds make "
     "75 % the limit here", "python -m benchmarks.unlisted_kernels"),
    ("layout-kernels", "Tensors passed in another axis order than the kernel declares",
     "bf16; the kernel on the views as they lie (the program in their memory order), the same "
     "kernel on a contiguous copy made in the timed call (`tensorfuse (copied contiguous)`), "
     "and torch on the same views", "python -m benchmarks.layout_kernels"),
    ("window-kernels", "Windows whose count the kernel derives (pooling with a stride)",
     "each against torch eager (`F.max_pool1d`, `F.avg_pool2d`, `F.conv1d`) and "
     "`torch.compile`; GB/s of the input read and the output written",
     "python -m benchmarks.window_kernels"),
    ("scan-kernels", "Scans and bands written as reductions up to each position",
     "each against torch eager (`cumsum`, `cummax`, `logcumsumexp`; `F.max_pool1d` of stride 1 "
     "for the rolling maximum) and `torch.compile`; GB/s of the input read and the output "
     "written", "python -m benchmarks.scan_kernels"),
    ("unlisted-kernels-weighted-token-pool", "Tokens summed with weights, again",
     "bf16; the weighted token pool of the section above, run alone after its defaults changed",
     "python -m benchmarks.unlisted_kernels --only weighted_token_pool"),
    ("unlisted-kernels-rmsnorm-linear", "RMSNorm written into a linear layer",
     "bf16; one sum `Σ_k x[i, k] · rsqrt(mean x²) · g[k] · w[j, k]`: the norm's sum, the "
     "normalised rows stored, the Hopper GEMM with the row scale in its epilogue; against "
     "`F.linear(F.rms_norm(x))`", "python -m benchmarks.unlisted_kernels --only rmsnorm_linear"),
    ("unlisted-kernels-bilinear-form", "A bilinear form per row",
     "bf16; `Σ_j (Σ_i x[b, i] · W[i, j]) · y[b, j]`: the GEMM stored in f32 by the Hopper GEMM, "
     "then the row template's sum over its columns; against `((x @ W) * y).sum(-1)`",
     "python -m benchmarks.unlisted_kernels --only bilinear_form"),
    ("unlisted-kernels-strided-matvec", "A matrix-vector product over the strided axis",
     "bf16; `Σ_k a[k, i] · x[k]` (`a.T @ x`, the rows i contiguous) on the row template: 128 "
     "contiguous rows a tile in blocks of 64, the sweep in parts for about four programs an SM; "
     "against cuBLAS's gemv on the transposed view and torch.compile",
     "python -m benchmarks.unlisted_kernels --only strided_matvec"),
    ("unlisted-kernels-router-softmax", "A router's softmax over 8 experts, again",
     "f32; the router softmax of the section above after rows of at most 8 columns took blocks "
     "of their width, 128 rows a program, held in registers",
     "python -m benchmarks.unlisted_kernels --only router_softmax"),
    ("unlisted-kernels-head-logsumexp-latent-attention-decode",
     "Chains past the row tile, cut at the call's sizes",
     "bf16; DeepSeek's absorbed latent attention at decode (q·k over 576, p·v over 512, every "
     "head over one cache) and a language model head's log-sum-exp over 4096 features: the "
     "floor's stages, each on a template (the Hopper GEMM for the products)",
     "python -m benchmarks.unlisted_kernels --only latent_attention_decode,head_logsumexp"),
    ("unlisted-kernels-lengths-mean-pool-masked-mean-pool",
     "A mean over tokens, from a mask and from the sequences' lengths",
     "bf16 `[32, 2048, 1024]`, 512-2048 tokens kept a sequence: the mask read whole, or the "
     "lengths bounding each program's sweep (the padding never read: GB/s of the kept tokens); "
     "torch.compile's time varied 45-97 µs between runs of the same day",
     "python -m benchmarks.unlisted_kernels --only lengths_mean_pool,masked_mean_pool"),
    ("unlisted-kernels-log-softmax-vocab-major",
     "A log-softmax down the vocabulary axis of vocabulary-major logits",
     "f32 `[V, B]`, reduced over V (the first axis): few columns, each a long sweep with outputs "
     "along it — the floor's two stages; against torch.compile and eager",
     "python -m benchmarks.unlisted_kernels --only log_softmax_vocab_major"),
    ("unlisted-kernels-attention-keys-transposed", "Attention with its keys kept transposed",
     "bf16, causal, k stored `[B, H, D, S]`; against SDPA on the transposed view and on a "
     "contiguous copy of it (the copy timed too)",
     "python -m benchmarks.unlisted_kernels --only attention_keys_transposed"),
    ("pipeline-kernels", "Kernels of training and serving pipelines, as a new user writes them",
     "bf16; a distillation loss (KL divergence of two soft-maxed rows) and a policy's entropy "
     "over a 128k vocabulary, sigmoid attention (no normaliser), groups of 128 features scaled "
     "by their largest magnitude, a global average pool, a log-sum-exp down the tokens; each "
     "against the best torch alternative on the same tensors",
     "python -m benchmarks.pipeline_kernels"),
    ("pipeline-kernels-attention-pool-latent-cross-attention-relu2-causal-attention",
     "Attention's kin as a new user writes them",
     "bf16; causal attention weighted by squared ReLU scores (no normaliser), Perceiver's latent "
     "queries shared by the batch (against SDPA on the latents broadcast), attention pooling by "
     "a learned query vector; each against the best torch alternative on the same tensors",
     "python -m benchmarks.pipeline_kernels --only relu2_causal_attention,"
     "latent_cross_attention,attention_pool"),
    ("pipeline-kernels-cosine-attention-gated-attention-w8a16-linear",
     "Attention by cosine similarity, gated attention, int8 weights",
     "bf16; Swin v2's attention by cosine similarity with a learned temperature (the norms "
     "stored, then the Hopper template reading the keys' norms as strips), Qwen3-Next's "
     "causal attention gated by a sigmoid of the query's projection (the Hopper attention, "
     "then the gate), a linear layer of int8 weights scaled per output channel (GB/s of the "
     "weights); each against the best torch alternative on the same tensors",
     "python -m benchmarks.pipeline_kernels --only cosine_attention,w8a16_linear,"
     "gated_attention"),
    ("pipeline-kernels-logsumexp-pool", "A log-sum-exp down the tokens, again",
     "bf16; the log-sum-exp pool of the section above after per-row strided tiles took 4 warps",
     "python -m benchmarks.pipeline_kernels --only logsumexp_pool"),
    ("variant-kernels", "Kernels of model variants, as a new user writes them",
     "bf16; GQA decode over an int8 cache with a scale per key (GB/s of the cache), the DIFF "
     "Transformer's differential attention (two causal softmaxes over one value tensor), "
     "RetNet's retention (a causal decay, no softmax), cross-entropy with label smoothing and "
     "with ignored targets, a Dice loss per row; each against the best torch alternative on the "
     "same tensors",
     "python -m benchmarks.variant_kernels"),
    ("serving-kernels", "Kernels of inference serving, as a new user writes them",
     "bf16; causal attention over a packed `[B, S, 3, H, D]` QKV tensor (against SDPA on its "
     "slices as views), speculative decoding's 4 draft tokens over a GQA cache (against SDPA "
     "with their boolean mask), causal attention with rotary embeddings applied where the "
     "scores are made (float32 tables: float32 products), a residual add written beside its "
     "RMSNorm, int8 quantisation of rows by their largest magnitude; each against the best "
     "torch alternative on the same tensors",
     "python -m benchmarks.serving_kernels"),
    ("monoid-kernels", "Reductions by the DSL's other monoids",
     "greedy decoding's argmax over a vocabulary (bf16), a row's logsumexp (f32), a KL "
     "divergence written with two logsumexps (bf16), the count of a row's maxima (bf16), the "
     "margin between a row's two largest logits as a user's monoid of two components (bf16), "
     "a product of survival factors (f32); each against torch eager and torch.compile",
     "python -m benchmarks.monoid_kernels"),
    ("full-reductions", "Values reduced over every axis",
     "the largest magnitude of 8192 × 8192 bf16 (an fp8 scale), the sum of squares of 64M f32 "
     "(a gradient norm's square), a cross-entropy averaged over 8192 tokens of a 32000-word "
     "vocabulary (bf16 logits); each against torch eager and torch.compile",
     "python -m benchmarks.full_reductions"),
    ("neighborhood", "Neighbourhood attention on 2-D and 3-D maps",
     "bf16; TFLOP/s of the kept FLOPs; `graph`: calls replayed from a CUDA graph",
     "python -m benchmarks.neighborhood --csv PATH"),
    ("neptune-suite", "Neptune's attention suite",
     "fp16, head dim 128: prefill and decode variants of the Neptune paper's table",
     "python -m benchmarks.neptune_suite --csv PATH"),
    ("attention-backward", "Attention backward",
     "bf16, D=128; TFLOP/s of the backward's FLOPs",
     "python -m benchmarks.attention_backward --csv PATH"),
    ("attention-backward-kernels", "Attention backward kernels: sm_90a and Triton",
     "bf16; both on the same inputs and the forward's saved log-sum-exp",
     "python -m benchmarks.attention_backward --kernels --sizes 4096,16384 --csv PATH"),
    ("attention-backward-kernels-d96", "Attention backward kernels at head dim 96",
     "bf16; the sm_90a kernel in tiles of 128 (TMA's zeros past the rows) and the Triton "
     "kernels (a block of 128 columns, 32 masked) on the same inputs and saved log-sum-exp",
     "python -m benchmarks.attention_backward --kernels --variants full,causal --sizes 4096 "
     "--head-dim 96 --csv PATH"),
    ("attention-backward-kernels-d64", "Attention backward kernels at head dim 64",
     "bf16; the sm_90a kernel (blocks of 128 queries) and the Triton kernels on the same inputs "
     "and saved log-sum-exp, against SDPA's backward",
     "python -m benchmarks.attention_backward --kernels --head-dim 64 --variants "
     "full,causal,gqa_causal --sizes 4096,16384 --csv PATH"),
    ("attention-backward-kernels-variants", "Attention backward kernels: soft-cap and masks",
     "bf16, D=128; the sm_90a kernel (a soft-cap's score and derivative per element; masks "
     "through the transposed block lists) and the Triton kernels on the same inputs and saved "
     "log-sum-exp, against FlexAttention's backward",
     "python -m benchmarks.attention_backward --kernels --variants "
     "softcap,prefix_lm,neighborhood,document --sizes 4096,16384 --csv PATH"),
    ("attention-backward-variants", "Attention backward: soft-cap and masks",
     "bf16, D=128; through autograd (the sm_90a kernel), against FlexAttention's backward",
     "python -m benchmarks.attention_backward --variants softcap,prefix_lm,neighborhood,document "
     "--sizes 4096,16384 --csv PATH"),
    ("attention-backward-kernels-alibi", "Attention backward kernels: ALiBi",
     "bf16; the sm_90a kernel (the score's bias evaluated where P is) and the Triton kernels on "
     "the same inputs and saved log-sum-exp, against FlexAttention's backward",
     "python -m benchmarks.attention_backward --kernels --variants alibi --sizes 4096,16384 "
     "--csv PATH"),
    ("attention-backward-alibi", "Attention backward: ALiBi",
     "bf16, D=128; through autograd (the sm_90a kernel), against FlexAttention's backward",
     "python -m benchmarks.attention_backward --variants alibi --sizes 4096,16384 --csv PATH"),
    ("attention-backward-layouts", "Attention backward on `[B, S, H, D]` tensors",
     "bf16, GQA-causal 32/8, D=128: autograd through `tf.compile` on q, k, v sliced out of one "
     "fused projection, against the same attention on contiguous `[B, H, S, D]` tensors and "
     "SDPA's backward on the transposed views; TFLOP/s of the masked FLOPs",
     "python -m benchmarks.attention_backward --layouts --sizes 4096,16384 --csv PATH"),
    ("attention-backward-masks", "Attention backward: masks and knobs",
     "the backward template's knobs per mask", "python -m benchmarks.attention_backward_masks"),
    ("cluster-decode", "Decode (one query token)",
     "bf16, 32 query / 8 KV heads, D=128; GB/s of the keys and values read",
     "python -m benchmarks.cluster --decode-only"),
    ("packed-decode", "Decode with a group's heads as the Hopper attention kernel's rows",
     "bf16, D=128; GB/s of the cache read; `tensorfuse packed …` is the plan measured before "
     "`tf.compile` takes it, `tensorfuse` what it runs now", "python -m benchmarks.packed_decode"),
    ("packed-decode-same-bytes", "Decode on one shared cache against a copy of the same bytes",
     "bf16, D=128; GB/s of the cache read; the note gives what a device copy moving the same "
     "bytes reaches when timed alike (the ceiling's 2 GiB copy hides fixed costs a 134 MB cache "
     "does not)", "python -m benchmarks.packed_decode --only 16/64/1/16384,8/64/1/65536"),
    ("decode-knobs", "The split update's knobs on the suite's decodes",
     "bf16; GB/s of the cache read; every candidate checked against float64, timed from a CUDA "
     "graph; `default` is `tf.compile`'s choice", "python -m benchmarks.decode_knobs"),
    ("decode-knobs-grid", "The decode kernels' knobs on the decode grid's shapes",
     "bf16, one query token, D=128; GB/s of the cache read; the split update's candidates "
     "(`m… n… w… s… splits…`) and the cluster decode's (`cluster w… s… copy`), each checked "
     "against float64, timed from a CUDA graph; `default` is `tf.compile`'s choice",
     "python -m benchmarks.decode_knobs --only grid"),
    ("strided-rows-knobs", "The row template's knobs across a strided axis",
     "bf16; GB/s of the bytes each kernel must move; every candidate checked against float64, "
     "timed from a CUDA graph; `default` is `tf.compile`'s choice",
     "python -m benchmarks.strided_rows_knobs"),
    ("strided-rows-knobs-layernorm-log-softmax-max-pool-row-tiles",
     "The row template's knobs across a strided axis: several row tiles a program",
     "bf16; the whole row in one block, each program sweeping 2 or 4 row tiles with the next "
     "ones' loads issued ahead (`t`: tiles a program); as the section above",
     "python -m benchmarks.strided_rows_knobs --tiles --only layernorm,log_softmax,max_pool"),
    ("strided-rows-knobs-logsumexp-pool",
     "The row template's knobs on a log-sum-exp down the tokens",
     "bf16; two states (a maximum and a sum of exponents) down the 512 strided tokens of "
     "[64, 512, 4096]; as the section above",
     "python -m benchmarks.strided_rows_knobs --only logsumexp_pool"),
    ("strided-rows-knobs-group-norm-swept-tiles",
     "The row template's knobs on a group norm: several swept row tiles a program",
     "bf16; each 65536-element row swept in blocks of 4k-16k, each program taking 1-4 row tiles "
     "in turn (`t`: tiles a program; fewer rows held between a row's two passes); as the "
     "section above",
     "python -m benchmarks.strided_rows_knobs --only group_norm --family swept_tiles"),
    ("strided-rows-knobs-group-norm-pipelined-tiles-cold",
     "The row template's knobs on a group norm, L2 flushed: swept row tiles pipelined",
     "bf16; each program taking 2-8 row tiles in turn, the sweep's loads 2-3 blocks ahead in "
     "8-16 warps; each call timed with L2 flushed before it (`bench_replayed`), beside the "
     "default and torch.compile timed alike",
     "python -m benchmarks.strided_rows_knobs --only group_norm --family pipelined_tiles --cold"),
    ("strided-rows-knobs-layernorm-wide-tiles-cold",
     "The row template's knobs on a layer norm over channels, L2 flushed: the row in 8-16 warps",
     "bf16; the whole 1024-channel row of 32 or 64 positions in 8-16 warps, 1-4 row tiles a "
     "program; L2 flushed before each call, as the section above",
     "python -m benchmarks.strided_rows_knobs --only layernorm --family wide_tiles --cold"),
    ("strided-rows-knobs-channel-stats-wide-parts-cold",
     "The row template's knobs on batch-norm statistics, L2 flushed: parts in 8 warps",
     "bf16; tiles of 32-64 channels by 256-512 rows in 8 warps, 33 or 66 parts; L2 flushed "
     "before each call, as the section above",
     "python -m benchmarks.strided_rows_knobs --only channel_stats --family wide_parts --cold"),
    ("strided-rows-knobs-channel-stats", "The row template's knobs on batch-norm statistics",
     "bf16; the mean and variance of 256 channels over 100352 rows, the sweep split in 33-264 "
     "parts (over 64 merged in a loop); as the section above",
     "python -m benchmarks.strided_rows_knobs --only channel_stats"),
    ("strided-rows-knobs-column-mean-weighted-pool",
     "The row template's knobs on a column mean and a weighted token pool",
     "bf16; a mean down the 65536 rows of [65536, 1024] and tokens summed with weights over "
     "[64, 4096, 1024]; as the section above",
     "python -m benchmarks.strided_rows_knobs --only column_mean,weighted_pool"),
    ("strided-rows-knobs-column-mean-weight-gradient-channel-stats-parts",
     "The row template's knobs on long sweeps of few tiles, split in parts",
     "bf16; a column mean, RMSNorm's weight gradient and batch-norm statistics over one family "
     "of candidates (32-256 rows, blocks of 32-512, 8-264 parts); as the section above",
     "python -m benchmarks.strided_rows_knobs --only column_mean,weight_gradient,channel_stats "
     "--family parts"),
    ("strided-rows-knobs-column-norm", "The row template's knobs on column norms",
     "bf16; the columns of [8192, 4096] L2-normalised (a sweep down the rows, then the outputs "
     "along it); as the section above", "python -m benchmarks.strided_rows_knobs --only "
     "column_norm"),
    ("strided-rows-knobs-strided-matvec",
     "The row template's knobs on a matrix-vector product over the strided axis",
     "bf16 `a.T @ x` over `[8192, 8192]`: tiles of 64-256 rows by 64 or 128, 4-16 parts, "
     "beside the default and torch.compile, from a CUDA graph",
     "python -m benchmarks.strided_rows_knobs --only strided_matvec"),
    ("strided-rows-knobs-weight-gradient", "The row template's knobs on a weight gradient",
     "bf16; RMSNorm's d_weight (a sum down the rows), its sweep also split into parts; as the "
     "section above", "python -m benchmarks.strided_rows_knobs --only weight_gradient"),
    ("gemm", "GEMM (the Hopper GEMM template)", "bf16; TFLOP/s", "python -m benchmarks.gemm"),
    ("contraction", "GEMMs on the contraction template (Triton tensor-core tiles)",
     "bf16; TFLOP/s and the fraction of cuBLAS's 8192³ rate; `tensorfuse template`: the "
     "template called directly, `tensorfuse`: `tf.compile`'s choice",
     "python -m benchmarks.contraction"),
    ("contraction-batched-product", "A batched product (`torch.bmm`)",
     "bf16, a short contracted axis (the output's stores bound it); TFLOP/s and the fraction of "
     "cuBLAS's 8192³ rate; `tensorfuse`: `tf.compile`'s choice (the Hopper GEMM, its batch axis "
     "on 3-D tensor maps), `tensorfuse template`: the contraction template",
     "python -m benchmarks.contraction --only batched_product"),
    ("contraction-attention-scores", "Attention's scores materialised (`q·kᵀ`)",
     "bf16, two batch axes walked as one, the head dim contracted; as the section above",
     "python -m benchmarks.contraction --only attention_scores"),
    ("contraction-knobs-batched-product", "The contraction template's knobs on a batched product",
     "bf16; as the section above", "python -m benchmarks.contraction --sweep --only "
     "batched_product"),
    ("contraction-knobs", "The contraction template's knobs",
     "bf16; TFLOP/s and the fraction of cuBLAS's 8192³ rate; every candidate checked against "
     "float64; `default`: the template's own choice", "python -m benchmarks.contraction --sweep"),
    ("contraction-pairs-knobs", "The contraction template's pairwise tiles",
     "f32 (L1 distances bf16); TFLOP/s (3 operations a pair and dimension, and 3 more a pair "
     "for the Gaussian kernel's sum) and the fraction of "
     "cuBLAS's f32 GEMM on the CUDA cores (75 % the instructions' limit); every candidate "
     "checked against float64; `default`: the template's own choice, `tf.compile`: its pick",
     "python -m benchmarks.contraction --pairs"),
    ("contraction-splits", "Outputs of few tiles: the contracted axis split into parts",
     "bf16 ``aᵀb`` over R rows; TFLOP/s and the fraction of cuBLAS's 8192³ rate; every "
     "candidate checked against float64; `default`: the template's own choice, "
     "`torch_eager`: cuBLAS", "python -m benchmarks.contraction --splits"),
    ("gemm-ffn", "FFN blocks (two Hopper GEMMs, the activation fused)",
     "bf16, K=4096, N=14336, O=4096", "python -m benchmarks.gemm --ffn"),
    ("rows", "Row reductions", "bf16; GB/s of the bytes each kernel must move",
     "python -m benchmarks.rows"),
    ("rows-operands", "Row reductions with extra operands", "bf16; GB/s",
     "python -m benchmarks.rows_operands --csv PATH"),
    ("rows-backward", "Row kernels' backward",
     "bf16; the backward alone (`torch.autograd.grad` after one recorded forward); GB/s of the "
     "inputs and incoming gradient read and the gradients written; the note says what runs "
     "tensorfuse's backward", "python -m benchmarks.rows_backward"),
    ("rows-backward-knobs", "The row template's knobs on backward kernels",
     "bf16; every candidate checked against float64, timed from a CUDA graph (L2 warm between "
     "replays); `default` is `tf.compile`'s choice", "python -m benchmarks.rows_backward --sweep"),
    ("rows-vocab", "Softmax and cross-entropy over a vocabulary",
     "bf16; GB/s of the logits read (and the softmax written); widths not a multiple of 8 start "
     "rows off 16-byte boundaries", "python -m benchmarks.rows_vocab"),
    ("rows-sweep", "The row template's settings", "bf16; the defaults against other knob sets",
     "python -m benchmarks.rows_sweep --csv PATH"),
    ("model-prefill", "A Llama-3-8B-shaped model: prefill", "bf16, random weights; tokens/s",
     "python -m benchmarks.model --csv PATH"),
    ("model-decode", "A Llama-3-8B-shaped model: decode", "bf16, random weights",
     "python -m benchmarks.model --csv PATH"),
    ("model-train", "A Llama-3-8B-shaped model: a training step",
     "bf16, its first four layers, random weights; forward + backward, tokens/s; the first "
     "layer's query-projection gradient against SDPA's in the note",
     "python -m benchmarks.model --config llama3-8b-4l --prefill-batches '' --decode-batches '' "
     "--train-batches 1 --csv PATH"),
    ("model-train-sliding-window", "A Mistral-shaped model with a sliding window: a training step",
     "bf16, Mistral 7B's widths, four layers, every layer's keys in a window of 1024 behind the "
     "query, random weights; forward + backward, tokens/s; FlexAttention's block mask the "
     "alternative", "python -m benchmarks.model --config mistral-7b-4l-sw1024 --prefill-batches "
     "'' --decode-batches '' --train-batches 1 --csv PATH"),
    ("overhead", "What a call costs the host", "small kernels, wall clock per call",
     "python -m benchmarks.overhead --csv PATH"),
    ("cpu", "CPU kernels", "2 cores; against torch on the same cores",
     "python -m benchmarks.cpu --csv PATH"),
    ("cpu-tuning", "CPU kernels, tuned", "2 cores; `tf.tune` records against the defaults",
     "python -m benchmarks.cpu_tuning --csv PATH"),
    ("tuning-gpus", "Tuning jobs on one and two GPUs", "wall clock of a job",
     "python -m benchmarks.tuning --gpus-compare --cases softmax"),
    ("tuning-gpus-together", "One tuning job of two kernels on one and two GPUs",
     "wall clock of a job of every fitting setting of a GQA decode and a softmax",
     "python -m benchmarks.tuning --gpus-compare --together --cases decode,softmax"),
    ("attention-sinks", "Attention with sinks (gpt-oss)",
     "bf16, gpt-oss-120b's heads (64 over 8 kv-heads of 64); a score per head outside the keys "
     "shares the softmax: the sink kernel the transformers integration runs (`tf.compile`'s "
     "choice) against gpt-oss's eager attention in transformers (what transformers runs for "
     "sinks) and SDPA's kernels with the sinks' share applied through their log-sum-exp "
     "(`sdpa with log-sum-exp`); `tensorfuse hopper`: the Hopper template applied by hand; "
     "TFLOP/s of the keys each query keeps. `attention_sinks_train`: forward and backward "
     "through autograd (dq, dk, dv and the sinks' gradient, checked against float64) against "
     "gpt-oss's eager code and FlexAttention with the sinks' share applied through its "
     "log-sum-exp; TFLOP/s counting the backward as 2.5 forwards",
     "python -m benchmarks.attention_sinks"),
    ("masked-attention", "Attention under a boolean mask (the transformers integration's)",
     "bf16, Llama-3-8B's heads (32 over 8 kv-heads of 128); rows the mask empties give 0; "
     "`tf.compile`'s choice and the Triton template applied by hand (`tensorfuse triton`) "
     "against SDPA with the same mask and FlexAttention with a block mask made from it; "
     "TFLOP/s of the keys each query keeps",
     "python -m benchmarks.masked_attention"),
    ("decode-grid-small", "Decode at small batches and caches, again",
     "bf16; the grid's batches 1, 4, 8 and caches of 1k, 4k and 32k keys, run alone after "
     "the cluster decode's launches were packed once (host time a call)",
     "python -m benchmarks.decode_grid --dtypes bf16 --batches 1,4,8 --lengths 1024,4096,32768 "
     "--part small"),
    ("decode-grid", "Decode over batch sizes, head layouts and cache lengths",
     "one query token, D=128; GB/s of the cache, query and output moved; against every SDPA "
     "backend that runs the shape and FlexAttention (torch.compile, dynamic shapes); "
     "`tensorfuse cluster` and `tensorfuse split update`, where present (`--routes`): the two "
     "decode kernels forced, which tf.compile's route between them is made from",
     "python -m benchmarks.decode_grid --dtypes bf16 && python -m benchmarks.decode_grid "
     "--dtypes fp16"),
    ("decode-grid-replayed", "Decode over batch sizes, head layouts and cache lengths, GPU time",
     "one query token, D=128; each call captured in a CUDA graph and replayed with L2 flushed "
     "(`bench_replayed`): the kernels' time without the host's; GB/s of the cache, query and "
     "output moved", "python -m benchmarks.decode_grid --dtypes bf16 --replayed "
     "--batches 1,4,8 --lengths 1024,4096,16384,32768"),
    ("decode-splits", "Decode: clusters per (batch, kv-head) pair",
     "one query token, D=128, bf16; every cluster size × splits of about one wave "
     "(`tensorfuse cluster=C splits=S`: the splits the launch takes at that key count) beside "
     "the default of the day (its knobs in the note) and SDPA",
     "python -m benchmarks.decode_splits"),
    ("decode-splits32k", "Decode: clusters per (batch, kv-head) pair at 32k keys",
     "as above, at 32768 keys (the run stopped after five of its shapes): one pair of 8 heads "
     "took 4 clusters of 16 faster than the 7 the GPU holds (that run's default; the defaults "
     "now take 4 there: `decode_plan.FEW_SPLITS`)",
     "python -m benchmarks.decode_splits --lengths 32768"),
    ("decode-groups", "Decode: many query heads on one cache",
     "one query token, D=128, bf16; teams of warps sharing each block (warps, stages) and the "
     "CUDA-core sweep beside the default and SDPA",
     "python -m benchmarks.decode_splits --groups"),
    ("decode-pipeline", "Decode on large caches: warps, stages and copies",
     "one query token, D=128, bf16; warps a CTA, blocks of 32 keys each warp keeps in shared "
     "memory (stages) and how they are copied (`tensorfuse warps=W stages=S copy=C`), cluster "
     "and splits as `tf.compile` chooses them, beside the default and SDPA",
     "python -m benchmarks.decode_splits --pipeline"),
    ("decode-masks", "Masked decode: sliding windows, static caches",
     "one query token, B8, D=128, bf16; GB/s of the keys and values the mask keeps; against "
     "SDPA with a boolean mask (every backend that runs it) and FlexAttention with a block mask",
     "python -m benchmarks.decode_masks"),
    ("dynamic", "New sizes on every call",
     "`tf.compile` defaults; `ms` the steady call, the note the first call's wall time at that "
     "size and the builds so far; the `all` rows sum up the first calls' cost over steady",
     "python -m benchmarks.dynamic"),
    ("dynamic-row-widths", "New row widths",
     "a softmax over 4096 rows, bf16, at random widths, as the `dynamic` section",
     "python -m benchmarks.dynamic --only row_widths"),
    ("dynamic-prefill-lengths", "New prompt lengths",
     "causal attention B1 H16 D128 bf16 at random lengths, as the `dynamic` section",
     "python -m benchmarks.dynamic --only prefill_lengths"),
    ("dynamic-growing-cache", "A decode cache that grows a key a step",
     "GQA decode B8 32/8 heads D128 bf16 from 4096 keys, as the `dynamic` section",
     "python -m benchmarks.dynamic --only growing_cache"),
    ("rows-sweep-stages", "Rows swept in blocks: the software pipeline's stages",
     "bf16; the defaults against blocks with other stage counts and hints",
     "python -m benchmarks.rows_sweep --stages --csv PATH"),
)
# The README's table: (benchmark, case prefix, a part of the shape, tensorfuse's label there)
HEADLINES = (("hopper-attention", "attention/full", "S4096", "tensorfuse"),
             ("hopper-attention", "attention/causal", "S16384", "tensorfuse"),
             ("hopper-attention", "attention/gqa_causal", "S4096", "tensorfuse"),
             ("hopper-attention", "attention/alibi", "", "tensorfuse"),
             ("hopper-attention", "attention/softcap", "", "tensorfuse"),
             ("hopper-attention", "attention/sliding_window", "", "tensorfuse"),
             ("masked-attention", "masked_attention/padded_causal", "", "tensorfuse"),
             ("attention-sinks", "attention_sinks/causal", "", "tensorfuse"),
             ("attention-sinks", "attention_sinks_train/causal", "", "tensorfuse"),
             ("attention-sinks", "attention_sinks_train/sliding_window", "", "tensorfuse"),
             ("user-kernels", "user/causal_sbhd", "", "tensorfuse"),
             ("user-kernels", "user/causal_dqk192_dv128", "", "tensorfuse"),
             ("user-kernels", "user/causal_bshd_d96", "", "tensorfuse"),
             ("user-kernels", "user/mqa_causal_one_cache", "", "tensorfuse"),
             ("pipeline-kernels-cosine-attention-gated-attention-w8a16-linear",
              "user/gated_attention", "", "tensorfuse"),
             ("user-kernels", "user/max_pool_l2", "", "tensorfuse"),
             ("user-kernels", "user/paged_decode", "", "tensorfuse"),
             ("serving-kernels", "user/packed_qkv_causal", "", "tensorfuse"),
             ("serving-kernels", "user/rope_attention_bf16_tables", "", "tensorfuse"),
             ("variant-kernels", "user/diff_attention", "", "tensorfuse"),
             ("attention-backward-kernels", "attention_bwd_kernels/causal", "S4096 D128",
              "tensorfuse hopper"),
             ("model-train", "model/train", "", "tensorfuse"),
             ("model-train-sliding-window", "model/train", "", "tensorfuse"),
             ("decode-grid", "decode/gqa", "B8 Hq32 Hkv8 N32768 D128 bf16", "tensorfuse"),
             ("decode-grid", "decode/mqa", "B1 Hq8 Hkv1 N131072 D128 bf16", "tensorfuse"),
             ("decode-masks", "decode_masks/sliding_window", "N32768", "tensorfuse"),
             ("decode-masks", "decode_masks/static_cache", "N32768", "tensorfuse"),
             ("gemm", "gemm", "8192x4096x14336/nk", "tensorfuse"),
             ("rows-operands", "rows/", "", "tensorfuse"),
             ("rows-vocab", "rows_vocab/cross_entropy", "4096x151936", "tensorfuse"),
             ("rows-vocab", "rows_vocab/softmax", "8192x50257", "tensorfuse"),
             ("cpu", "cpu/causal_attention", "S4096 D64 bf16", "tensorfuse"))
