"""``ember.nn.functional``: stateless neural-network functions with PyTorch's names, arguments and defaults.

Every function validates its arguments (ranks, shapes, dtypes, devices, option values) and raises a typed ember
error naming the function and the shapes involved, then calls one function of :mod:`ember.ops.nn`, the nn layer
of the Bridge, which promotes where needed and runs a short chain of backend calls on the input's device
(``conv``, ``max_pool``, ``interpolate``, ``pad``, ``softmax`` ... are backend methods with default compositions
in core, which fast backends override). Nothing here touches the device's stack itself.
"""

from __future__ import annotations

from .activations import (
    celu,
    elu,
    elu_,
    gelu,
    glu,
    hardshrink,
    hardsigmoid,
    hardswish,
    hardtanh,
    hardtanh_,
    leaky_relu,
    leaky_relu_,
    log_softmax,
    logsigmoid,
    mish,
    normalize,
    prelu,
    relu,
    relu6,
    relu_,
    selu,
    sigmoid,
    silu,
    softmax,
    softmin,
    softplus,
    softshrink,
    softsign,
    tanh,
    tanhshrink,
    threshold,
)
from .attention import scaled_dot_product_attention
from .conv import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    adaptive_max_pool3d,
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    conv1d,
    conv2d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    fold,
    interpolate,
    max_pool1d,
    max_pool2d,
    max_pool3d,
    pad,
    pixel_shuffle,
    pixel_unshuffle,
    unfold,
    upsample,
    upsample_bilinear,
    upsample_nearest,
)
from .linear import bilinear, dropout, dropout1d, dropout2d, dropout3d, embedding, linear, one_hot
from .loss import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cosine_similarity,
    cross_entropy,
    huber_loss,
    kl_div,
    l1_loss,
    mse_loss,
    nll_loss,
    pairwise_distance,
    smooth_l1_loss,
)
from .norm import batch_norm, group_norm, instance_norm, layer_norm, rms_norm

__all__ = [
    # activations
    "relu", "relu_", "relu6", "hardtanh", "hardtanh_", "gelu", "sigmoid", "tanh", "silu", "elu", "elu_", "selu",
    "celu", "leaky_relu", "leaky_relu_", "softplus", "softsign", "mish", "hardsigmoid", "hardswish", "logsigmoid",
    "tanhshrink", "hardshrink", "softshrink", "threshold", "prelu", "softmax", "log_softmax", "softmin", "glu",
    "normalize",
    # linear, lookup, dropout
    "linear", "bilinear", "embedding", "one_hot", "dropout", "dropout1d", "dropout2d", "dropout3d",
    # convolution, pooling, resampling
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    "interpolate", "upsample", "upsample_nearest", "upsample_bilinear", "pad", "unfold", "fold",
    "pixel_shuffle", "pixel_unshuffle",
    # normalisation
    "layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm",
    # losses and distances
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "nll_loss", "cross_entropy", "cosine_similarity",
    "pairwise_distance",
    # attention
    "scaled_dot_product_attention",
]
