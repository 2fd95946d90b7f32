"""``ember.nn.layers``: PyTorch's layer classes over ``ember.nn.functional`` (same names, constructor arguments,
defaults, initialisation and reprs); ``ember.nn`` re-exports every name in ``__all__``."""

from __future__ import annotations

from .activation import (
    CELU,
    ELU,
    GELU,
    GLU,
    SELU,
    Hardshrink,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LeakyReLU,
    LogSigmoid,
    LogSoftmax,
    Mish,
    PReLU,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softmax2d,
    Softmin,
    Softplus,
    Softshrink,
    Softsign,
    Tanh,
    Tanhshrink,
    Threshold,
)
from .conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from .dropout import Dropout, Dropout1d, Dropout2d, Dropout3d
from .linear import Bilinear, Linear
from .loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from .norm import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    RMSNorm,
)
from .pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
)
from .shape import (
    Flatten,
    Identity,
    PixelShuffle,
    PixelUnshuffle,
    Unflatten,
    Upsample,
    UpsamplingBilinear2d,
    UpsamplingNearest2d,
)
from .sparse import Embedding

__all__ = [
    # linear and lookup
    "Identity", "Linear", "Bilinear", "Embedding",
    # convolution and pooling
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
    # normalisation
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
    "LayerNorm", "RMSNorm", "GroupNorm",
    # dropout
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
    # shape and resampling
    "Flatten", "Unflatten", "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "PixelShuffle",
    "PixelUnshuffle",
    # activations
    "Threshold", "ReLU", "Hardtanh", "ReLU6", "Sigmoid", "Tanh", "Hardsigmoid", "Hardswish", "SiLU", "Mish", "ELU",
    "CELU", "SELU", "GLU", "GELU", "Hardshrink", "Softshrink", "LeakyReLU", "LogSigmoid", "Softplus", "Softsign",
    "Tanhshrink", "PReLU", "Softmax", "LogSoftmax", "Softmin", "Softmax2d",
    # losses
    "L1Loss", "MSELoss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss", "KLDivLoss", "NLLLoss",
    "CrossEntropyLoss",
]
