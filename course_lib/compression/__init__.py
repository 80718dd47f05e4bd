"""Making the model small (lectures 12-15), one module per technique:

- `pruning`: remove the weights that matter least; retrain with the masks held; run sparse.
- `structured`: remove whole neurons and channels: a physically smaller dense model.
- `semi_structured`: 2:4 (N:M) masks, the pattern sparse tensor cores run; fine-tuned with
  `pruning.masked_fit`; stored as values plus 2-bit indices.
- `quantization`: observers, fake-quant with a straight-through estimator, PTQ and QAT; its
  quantize/dequantize/choose_qparams are lecture 02's (`course_lib.numerics`), re-exported.
- `gptq`: GPTQ, post-training quantization beyond round-to-nearest: each weight's rounding error
  corrected on the weights not yet rounded, with the inverse Hessian of the layer's inputs.
- `int8`: int8 inference through PyTorch's own APIs, feature-detected.
- `int4`: group-wise int4 weight-only quantization (scale + zero point per group of input channels,
  two codes per byte): what local LLM inference runs.
- `kmeans`: weight sharing by k-means (Deep Compression, section 3).
- `huffman`: Huffman coding, on real bits (Deep Compression, section 4).
- `storage`: Deep Compression's storage format and what it costs in bits.
- `pipeline`: Deep Compression end to end: prune, share weights, Huffman-code, count every bit.
- `distillation`: knowledge distillation: a small student learns from a big teacher.
- `measure`: latency and storage of a compressed model, measured the same way everywhere.
- `inference`: serving: throughput against batch size, autograd modes, the size-accuracy frontier.
"""
