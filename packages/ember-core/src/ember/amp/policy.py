"""Which dtype each op runs in under ``ember.autocast``: PyTorch 2.x's autocast op lists, for the ops ember has.

Rules (applied to the floating tensor arguments of the op, in :func:`ember.amp.autocast_mode.run`):

- ``"lower"``: float32, float16 and bfloat16 arguments are cast to the autocast dtype (float64 is left alone, as
  PyTorch does); matrix products and convolutions, where lower precision pays.
- ``"fp32"``: float16 and bfloat16 arguments are cast to float32 (losses, and on GPUs also softmax, norms, ...:
  ops whose range or accuracy needs it).
- ``"promote"``: arguments of different floating dtypes are cast to the widest (an op fed by a lower-precision
  matmul and a float32 parameter runs at float32).
- ``"keep"``: the normalisation layers: like ``"promote"``, then the result is cast back to the input's dtype
  (PyTorch's mixed-dtype kernels: a bfloat16 input with float32 weights gives a bfloat16 result).
- ``"input"``: floating arguments are cast to the first argument's dtype (PyTorch's CPU GRU: its composite
  decomposes into ops that follow the input, so a bfloat16 input runs in bfloat16 and a float32 one in float32).
- ``"banned"``: the op refuses lower-precision input under autocast (``binary_cross_entropy`` on GPUs).

Two tables mirror ``torch.autocast("cpu")`` and ``torch.autocast("cuda")``; a backend declares which one applies
(``register_backend_traits(autocast_ops=...)``), by default its kind ("gpu" or not). An op wrapped by autocast but
missing from a table follows ``"promote"``.
"""

from __future__ import annotations

_LOWER = ("matmul", "mm", "bmm", "einsum", "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
          "conv_transpose2d", "conv_transpose3d", "prelu", "scaled_dot_product_attention")
_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "nll_loss", "cross_entropy", "kl_div",
           "binary_cross_entropy_with_logits")
_NORMS = ("batch_norm", "instance_norm", "rms_norm")

#: torch.autocast("cpu") (aten/src/ATen/autocast_mode.cpp, the CPU lists), as ember names the ops
CPU: dict[str, str] = {
    **dict.fromkeys(_LOWER, "lower"),
    **dict.fromkeys(_LOSSES + ("binary_cross_entropy",), "fp32"),
    **dict.fromkeys(("avg_pool3d", "max_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d"), "fp32"),
    # reflection_pad1d/2d and replication_pad1d/2d/3d are float32 ops; reflection_pad3d and the others are not
    **dict.fromkeys(("pad_reflect_1d", "pad_reflect_2d", "pad_replicate_1d", "pad_replicate_2d",
                     "pad_replicate_3d"), "fp32"),
    **dict.fromkeys(_NORMS + ("layer_norm", "group_norm"), "keep"),
    # nn.LSTM runs in bfloat16 under CPU autocast (mkldnn_rnn), and so do plain RNNs (their cells' linears are
    # lower-precision ops); GRU follows its input's dtype
    **dict.fromkeys(("rnn_LSTM", "rnn_RNN_TANH", "rnn_RNN_RELU"), "lower"),
    "rnn_GRU": "input",
}

#: torch.autocast("cuda") (the CUDA lists: lower_precision_fp, fp32, fp32_set_opt_dtype, promote, banned)
GPU: dict[str, str] = {
    **dict.fromkeys(_LOWER + ("mv",), "lower"),
    **dict.fromkeys(_LOSSES, "fp32"),
    **dict.fromkeys(("softmax", "log_softmax", "softmin", "softplus", "layer_norm", "group_norm",
                     "cosine_similarity", "interpolate"), "fp32"),
    **dict.fromkeys(("bilinear", "dot"), "promote"),
    "binary_cross_entropy": "banned",
    **dict.fromkeys(_NORMS, "keep"),
    # the recurrent cells (lstm_cell, gru_cell, rnn_tanh_cell, rnn_relu_cell) are lower-precision ops on CUDA
    **dict.fromkeys(("rnn_LSTM", "rnn_GRU", "rnn_RNN_TANH", "rnn_RNN_RELU"), "lower"),
}

TABLES: dict[str, dict[str, str]] = {"cpu": CPU, "gpu": GPU}
