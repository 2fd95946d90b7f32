"""ember-lora: LoRA adapters for ember models, with the semantics and file format of Hugging Face PEFT.

>>> import ember
>>> from ember import nn
>>> from ember_lora import LoraConfig, apply_lora, trainable_parameters
>>> model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
>>> _ = apply_lora(model, LoraConfig(r=4, lora_alpha=8, target_modules=["0"]))
>>> trainable_parameters(model)
(192, 868)
"""

__version__ = "0.1.0"
#: backend-contract version this plugin was built against
CONTRACT = 1

from .config import LoraConfig  # noqa: E402 - after __version__, which .io reads
from .io import load_adapter, save_adapter  # noqa: E402
from .layers import (  # noqa: E402
    LoraConv2d,
    LoraEmbedding,
    LoraLayer,
    LoraLinear,
    LoraMultiheadAttention,
    ModulesToSaveWrapper,
    QLoraLinear,
)
from .model import (  # noqa: E402
    active_adapter,
    adapters,
    apply_lora,
    delete_adapter,
    disable_adapters,
    lora_layers,
    lora_param_groups,
    merge,
    merge_and_unload,
    print_trainable_parameters,
    set_adapter,
    trainable_parameters,
    unload,
    unmerge,
)
from .qlora import apply_qlora  # noqa: E402

__all__ = [
    "LoraConfig", "apply_lora", "set_adapter", "delete_adapter", "disable_adapters", "merge", "unmerge",
    "merge_and_unload", "unload", "trainable_parameters", "print_trainable_parameters", "lora_param_groups",
    "lora_layers", "adapters", "active_adapter", "save_adapter", "load_adapter", "LoraLayer", "LoraLinear",
    "LoraConv2d", "LoraEmbedding", "LoraMultiheadAttention", "ModulesToSaveWrapper", "apply_qlora", "QLoraLinear",
]
