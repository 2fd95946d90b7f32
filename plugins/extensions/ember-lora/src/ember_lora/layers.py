"""The wrapped layers: ``LoraLinear``, ``LoraConv2d``, ``LoraEmbedding``, ``LoraMultiheadAttention`` (a frozen base
layer plus named low-rank adapters) and ``ModulesToSaveWrapper`` (a frozen module plus a trainable copy per adapter).

Parameter names follow PEFT's, so state dicts line up: ``<path>.base_layer.weight``, ``<path>.lora_A.<adapter>.weight``,
``<path>.lora_B.<adapter>.weight``, and for embeddings ``<path>.lora_embedding_A.<adapter>`` /
``<path>.lora_embedding_B.<adapter>``.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

import ember
from ember import nn
from ember.errors import DTypeError, ValueRangeError
from ember.nn import functional as F
from ember.nn import init
from ember.tensor import Tensor

from .config import LoraConfig


class _ParameterDict(nn.Module):
    """Parameters keyed by adapter name (ember has no ``nn.ParameterDict``); the state-dict key is
    ``<owner>.<adapter>``, as PEFT's ``ParameterDict``."""

    def __getitem__(self, key: str) -> nn.Parameter:
        return self._parameters[key]

    def __setitem__(self, key: str, value: nn.Parameter) -> None:
        self.register_parameter(key, value)

    def __delitem__(self, key: str) -> None:
        del self._parameters[key]

    def __contains__(self, key: object) -> bool:
        return key in self._parameters

    def keys(self) -> list[str]:
        return list(self._parameters)


class LoraLayer(nn.Module):
    """A frozen ``base_layer`` plus named adapters; the output is ``base(x) + Σ scaling · B(A(dropout(x)))`` over the
    active adapters (none while adapters are disabled; the merged ones are already inside ``base_layer.weight``)."""

    #: names of the per-adapter parameter containers, as in PEFT
    adapter_containers: tuple[str, ...] = ("lora_A", "lora_B")

    def __init__(self, base_layer: nn.Module) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.r: dict[str, int] = {}
        self.lora_alpha: dict[str, float] = {}
        self.scaling: dict[str, float] = {}
        self.lora_dropout = nn.ModuleDict()
        self.active_adapters: list[str] = []
        self.merged_adapters: list[str] = []
        self.disable_adapters = False

    # -- adapters ------------------------------------------------------------------------------------------------
    @property
    def adapter_names(self) -> list[str]:
        """Every adapter this layer holds, in the order they were added."""
        return list(self.r)

    @property
    def merged(self) -> bool:
        """Whether some adapter is folded into the base weight."""
        return bool(self.merged_adapters)

    def _weight(self) -> Tensor:
        return self.base_layer.weight

    def check_config(self, adapter: str, config: LoraConfig) -> None:
        """Raise what ``update_layer(adapter, config)`` would refuse, before anything changes."""
        if adapter in self.r:
            raise ValueRangeError(f"{type(self).__name__}: adapter {adapter!r} already exists on this layer")
        if config.init_lora_weights == "pissa":
            rows, cols = self._delta_matrix_shape()
            if config.r > min(rows, cols):
                raise ValueRangeError(f"{type(self).__name__}: init_lora_weights='pissa' needs r <= "
                                      f"min{(rows, cols)} of the weight matrix "
                                      f"{tuple(self._weight().shape)}, got r={config.r}")

    def update_layer(self, adapter: str, config: LoraConfig) -> None:
        """Add adapter ``adapter`` shaped and initialised by ``config``."""
        self.check_config(adapter, config)
        self.r[adapter] = config.r
        self.lora_alpha[adapter] = config.lora_alpha
        self.scaling[adapter] = config.scaling
        self.lora_dropout[adapter] = nn.Dropout(config.lora_dropout) if config.lora_dropout > 0 else nn.Identity()
        w = self._weight()
        self._create(adapter, config.r, w.device, w.dtype)
        self._initialise(adapter, config.init_lora_weights)

    def _create(self, adapter: str, r: int, device: Any, dtype: Any) -> None:
        raise NotImplementedError

    def _ab(self, adapter: str) -> tuple[Tensor, Tensor]:
        """The adapter's A and B weights."""
        return self.lora_A[adapter].weight, self.lora_B[adapter].weight

    def _initialise(self, adapter: str, mode: bool | str) -> None:
        if mode == "pissa":
            self._pissa(adapter)
        else:
            _init_pair(*self._ab(adapter), mode, self.r[adapter])

    def _delta_matrix_shape(self) -> tuple[int, int]:
        """(rows of B, columns of A) of the 2-d view of the base weight the update ``B @ A`` is added to."""
        w = self._weight()
        return w.shape[0], int(np.prod(w.shape[1:]))

    def _pissa(self, adapter: str) -> None:
        # PiSSA (PEFT's "pissa"): A, B from the top-r singular triplets of W, W keeps the residual, so
        # base + scaling * B @ A == W at step 0. The SVD runs on the host: it is a one-off initialisation.
        w = self._weight()
        r, scale = self.r[adapter], self.scaling[adapter]
        mat = self._to_matrix(w.detach().numpy().astype(np.float64))
        b_np, a_np, residual = _pissa_factors(mat, r, scale)
        a, b = self._ab(adapter)
        with ember.no_grad():
            a.copy_(ember.tensor(a_np.reshape(a.shape), dtype=a.dtype, device=a.device))
            b.copy_(ember.tensor(b_np.reshape(b.shape), dtype=b.dtype, device=b.device))
            w.copy_(ember.tensor(self._from_matrix(residual), dtype=w.dtype, device=w.device))

    # 2-d views used by PiSSA; the embedding overrides them (its table is the transpose of the update)
    def _to_matrix(self, w: np.ndarray) -> np.ndarray:
        return w.reshape(w.shape[0], -1)

    def _from_matrix(self, m: np.ndarray) -> np.ndarray:
        return m.reshape(self._weight().shape)

    def get_delta_weight(self, adapter: str) -> Tensor:
        """``scaling · B @ A`` in the base weight's shape (what ``merge`` adds)."""
        a, b = self._ab(adapter)
        rows, cols = self._delta_matrix_shape()
        delta = b.reshape(rows, self.r[adapter]) @ a.reshape(self.r[adapter], cols)
        return (delta * self.scaling[adapter]).reshape(self._weight().shape)

    def set_adapter(self, adapter: str | None) -> None:
        """Make ``adapter`` the active one (``None`` or a name this layer lacks: none active); only its parameters
        require grad."""
        self.active_adapters = [adapter] if adapter in self.r else []
        for name in self.adapter_containers:
            container = getattr(self, name)
            for key in container.keys():
                trainable = key in self.active_adapters
                for p in _params_of(container[key]):
                    p.requires_grad_(trainable)

    def delete_adapter(self, adapter: str) -> None:
        """Remove ``adapter`` (unmerged first if it was merged)."""
        if adapter not in self.r:
            raise ValueRangeError(f"{type(self).__name__}: no adapter {adapter!r} (adapters: {self.adapter_names})")
        if adapter in self.merged_adapters:
            self._unmerge_one(adapter)
        for name in self.adapter_containers:
            del getattr(self, name)[adapter]
        del self.lora_dropout[adapter]
        for d in (self.r, self.lora_alpha, self.scaling):
            del d[adapter]
        if adapter in self.active_adapters:
            self.active_adapters.remove(adapter)

    # -- merging -------------------------------------------------------------------------------------------------
    def merge(self, adapter_names: list[str] | None = None) -> None:
        """Fold the adapters (default: the active ones) into ``base_layer.weight``; already merged ones are skipped."""
        names = self.active_adapters if adapter_names is None else adapter_names
        w = self._weight()
        for name in names:
            if name not in self.r:
                raise ValueRangeError(f"{type(self).__name__}.merge: no adapter {name!r} (adapters: "
                                      f"{self.adapter_names})")
            if name in self.merged_adapters:
                continue
            with ember.no_grad():
                w.add_(self.get_delta_weight(name).to(w.dtype))
            self.merged_adapters.append(name)

    def _unmerge_one(self, name: str) -> None:
        w = self._weight()
        with ember.no_grad():
            w.sub_(self.get_delta_weight(name).to(w.dtype))
        self.merged_adapters.remove(name)

    def unmerge(self) -> None:
        """Take every merged adapter back out of the base weight (last merged first)."""
        for name in reversed(list(self.merged_adapters)):
            self._unmerge_one(name)

    # -- forward -------------------------------------------------------------------------------------------------
    def _lora_term(self, adapter: str, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if self.disable_adapters and self.merged:  # as PEFT: a disabled layer computes the base model's output
            self.unmerge()
        result = self.base_layer(x, *args, **kwargs)
        if self.disable_adapters:
            return result
        for adapter in self.active_adapters:
            if adapter in self.merged_adapters:
                continue
            result = result + self._lora_term(adapter, x)
        return result

    def base_biases(self) -> dict[str, Tensor]:
        """The base layer's biases by their names under it (what ``bias="lora_only"`` trains)."""
        bias = getattr(self.base_layer, "bias", None)
        return {"bias": bias} if bias is not None else {}

    def release_base(self) -> nn.Module:
        """The base layer, to be put back into the model in this wrapper's place (unload, last adapter deleted)."""
        return self.base_layer

    def extra_repr(self) -> str:
        return f"adapters={self.adapter_names}, active={self.active_adapters}, merged={self.merged_adapters}"


def _init_pair(a: Tensor, b: Tensor, mode: bool | str, r: int) -> None:
    """PEFT's initialisations of one (A, B) pair other than PiSSA: A Kaiming-uniform (True) or normal with std 1/r
    ("gaussian") and B zero, so the adapter starts as a no-op; False: both Kaiming-uniform."""
    if mode is False:  # both random (kaiming-uniform, nn.Linear's default): the model starts changed
        init.kaiming_uniform_(a, a=math.sqrt(5))
        init.kaiming_uniform_(b, a=math.sqrt(5))
        return
    if mode is True:
        init.kaiming_uniform_(a, a=math.sqrt(5))
    else:  # "gaussian"
        init.normal_(a, std=1 / r)
    init.zeros_(b)


def _pissa_factors(mat: np.ndarray, r: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PiSSA's (B, A, residual) of a 2-d float64 matrix: the top-r singular triplets split evenly between B and A,
    so ``residual + scale * B @ A == mat``."""
    u, s, vh = np.linalg.svd(mat, full_matrices=False)
    sr = np.sqrt(s[:r] / scale)
    b_np = u[:, :r] * sr[None, :]
    a_np = sr[:, None] * vh[:r]
    return b_np, a_np, mat - scale * (b_np @ a_np)


def _params_of(obj: Any) -> list[nn.Parameter]:
    return [obj] if isinstance(obj, nn.Parameter) else list(obj.parameters())


def _cast_input(x: Tensor, like: Tensor) -> Tensor:
    # the adapter computes in its own dtype (PEFT casts the input the same way), the sum is in the base's dtype
    return x.to(like.dtype) if x.dtype != like.dtype and x.dtype.is_floating_point else x


class LoraLinear(LoraLayer):
    """LoRA around an ``nn.Linear``: ``lora_A`` is ``Linear(in, r)``, ``lora_B`` is ``Linear(r, out)``, no biases."""

    def __init__(self, base_layer: nn.Linear) -> None:
        if not isinstance(base_layer, nn.Linear):
            raise DTypeError(f"LoraLinear: base_layer must be an nn.Linear, got {type(base_layer).__name__}")
        super().__init__(base_layer)
        self.lora_A = nn.ModuleDict()
        self.lora_B = nn.ModuleDict()
        self.in_features, self.out_features = base_layer.in_features, base_layer.out_features

    def _create(self, adapter: str, r: int, device: Any, dtype: Any) -> None:
        self.lora_A[adapter] = nn.Linear(self.in_features, r, bias=False, device=device, dtype=dtype)
        self.lora_B[adapter] = nn.Linear(r, self.out_features, bias=False, device=device, dtype=dtype)

    def _lora_term(self, adapter: str, x: Tensor) -> Tensor:
        a, b = self.lora_A[adapter], self.lora_B[adapter]
        out = b(a(self.lora_dropout[adapter](_cast_input(x, a.weight)))) * self.scaling[adapter]
        return out.to(self._weight().dtype) if out.dtype != self._weight().dtype else out


class QLoraLinear(LoraLinear):
    """LoRA around a 4-bit ``ember.quantization.Linear4bit`` (QLoRA): the base weight stays NF4/FP4 and frozen, the
    adapters are in the base's ``compute_dtype``, and the base path runs ``quant.matmul_4bit`` (the weight
    dequantized on the fly). Both compute in ``compute_dtype``; the output has the input's dtype (PEFT's and
    bitsandbytes' rule).

    ``merge`` dequantizes: the base becomes a float ``nn.Linear`` in ``compute_dtype`` (its 4-bit storage is given
    up) and the update is added to it, so ``merge_and_unload`` returns a float model. ``init_lora_weights="pissa"``
    is refused (it rewrites the base weight, which is quantized).
    """

    def __init__(self, base_layer: Any) -> None:
        from ember.quantization import Linear4bit

        if not isinstance(base_layer, Linear4bit):
            raise DTypeError(f"QLoraLinear: base_layer must be an ember.quantization.Linear4bit, got "
                             f"{type(base_layer).__name__}")
        LoraLayer.__init__(self, base_layer)
        self.lora_A = nn.ModuleDict()
        self.lora_B = nn.ModuleDict()
        self.in_features, self.out_features = base_layer.in_features, base_layer.out_features

    @property
    def quantized(self) -> bool:
        """Whether the base is still 4-bit (False after a merge dequantized it)."""
        from ember.quantization import Linear4bit

        return isinstance(self.base_layer, Linear4bit)

    def _compute_dtype(self) -> Any:
        return self.base_layer.compute_dtype if self.quantized else self.base_layer.weight.dtype

    def _weight(self) -> Tensor:
        if self.quantized:
            raise ValueRangeError("QLoraLinear: the base weight is 4-bit; merge() dequantizes it first")
        return self.base_layer.weight

    def check_config(self, adapter: str, config: LoraConfig) -> None:
        if config.init_lora_weights == "pissa":
            raise ValueRangeError(f"QLoraLinear: init_lora_weights='pissa' rewrites the base weight, which is "
                                  f"quantized ({self.base_layer.quant_type if self.quantized else 'float'}, "
                                  f"{(self.out_features, self.in_features)}); use True or 'gaussian'")
        super().check_config(adapter, config)

    def update_layer(self, adapter: str, config: LoraConfig) -> None:
        self.check_config(adapter, config)
        self.r[adapter] = config.r
        self.lora_alpha[adapter] = config.lora_alpha
        self.scaling[adapter] = config.scaling
        self.lora_dropout[adapter] = nn.Dropout(config.lora_dropout) if config.lora_dropout > 0 else nn.Identity()
        device = self.base_layer._buffers["weight"].device if self.quantized else self.base_layer.weight.device
        self._create(adapter, config.r, device, self._compute_dtype())
        self._initialise(adapter, config.init_lora_weights)

    def _delta_matrix_shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    def get_delta_weight(self, adapter: str) -> Tensor:
        a, b = self._ab(adapter)
        return (b @ a) * self.scaling[adapter]

    def merge(self, adapter_names: list[str] | None = None) -> None:
        names = self.active_adapters if adapter_names is None else adapter_names
        if self.quantized and not names:
            return  # nothing to fold in: the base stays 4-bit
        unknown = [n for n in names if n not in self.r]
        if unknown:  # refuse before dequantizing anything
            raise ValueRangeError(f"QLoraLinear.merge: no adapter(s) {unknown} (adapters: {self.adapter_names})")
        if self.quantized:
            base = self.base_layer.dequantized_linear(self._compute_dtype())
            base.requires_grad_(False)
            if self.base_layer.bias is not None and self.base_layer.bias.requires_grad:
                base.bias.requires_grad_(True)
            self.base_layer = base
        super().merge(adapter_names)

    def _lora_term(self, adapter: str, x: Tensor) -> Tensor:
        # the adapter computes in compute_dtype; the sum is in the input's dtype, what the 4-bit base returns
        a, b = self.lora_A[adapter], self.lora_B[adapter]
        out = b(a(self.lora_dropout[adapter](_cast_input(x, a.weight)))) * self.scaling[adapter]
        want = x.dtype if x.dtype.is_floating_point else self._compute_dtype()
        return out.to(want) if out.dtype != want else out


class LoraConv2d(LoraLayer):
    """LoRA around an ``nn.Conv2d``: ``lora_A`` is the base's convolution with ``r`` output channels (same kernel,
    stride, padding, dilation and padding mode), ``lora_B`` a 1×1 convolution from ``r`` channels; no biases."""

    def __init__(self, base_layer: nn.Conv2d) -> None:
        if not isinstance(base_layer, nn.Conv2d):
            raise DTypeError(f"LoraConv2d: base_layer must be an nn.Conv2d, got {type(base_layer).__name__}")
        if base_layer.groups != 1:
            # B @ A is a dense (out, in·k·k) matrix: it cannot be folded into a grouped convolution's weight
            raise ValueRangeError(f"LoraConv2d: grouped convolutions are not supported (groups={base_layer.groups}, "
                                  f"weight {tuple(base_layer.weight.shape)})")
        super().__init__(base_layer)
        self.lora_A = nn.ModuleDict()
        self.lora_B = nn.ModuleDict()
        self.in_features, self.out_features = base_layer.in_channels, base_layer.out_channels

    def _create(self, adapter: str, r: int, device: Any, dtype: Any) -> None:
        base = self.base_layer
        self.lora_A[adapter] = nn.Conv2d(self.in_features, r, base.kernel_size, base.stride, base.padding,
                                         base.dilation, bias=False, padding_mode=base.padding_mode, device=device,
                                         dtype=dtype)
        self.lora_B[adapter] = nn.Conv2d(r, self.out_features, 1, bias=False, device=device, dtype=dtype)

    def _lora_term(self, adapter: str, x: Tensor) -> Tensor:
        a, b = self.lora_A[adapter], self.lora_B[adapter]
        out = b(a(self.lora_dropout[adapter](_cast_input(x, a.weight)))) * self.scaling[adapter]
        return out.to(self._weight().dtype) if out.dtype != self._weight().dtype else out


class LoraEmbedding(LoraLayer):
    """LoRA around an ``nn.Embedding``: ``lora_embedding_A`` ``(r, num_embeddings)`` and ``lora_embedding_B``
    ``(embedding_dim, r)``; the update to the table is ``(B @ A).T``. As in PEFT, ``A`` starts at zero and ``B``
    normal, and no dropout is applied (the input is indices)."""

    adapter_containers = ("lora_embedding_A", "lora_embedding_B")

    def __init__(self, base_layer: nn.Embedding) -> None:
        if not isinstance(base_layer, nn.Embedding):
            raise DTypeError(f"LoraEmbedding: base_layer must be an nn.Embedding, got {type(base_layer).__name__}")
        if base_layer.max_norm is not None:
            # max_norm renormalises looked-up rows in place: the base table and the adapter would drift apart
            raise ValueRangeError(f"LoraEmbedding: embeddings with max_norm ({base_layer.max_norm}) are not "
                                  f"supported (weight {tuple(base_layer.weight.shape)})")
        super().__init__(base_layer)
        self.lora_embedding_A = _ParameterDict()
        self.lora_embedding_B = _ParameterDict()
        self.in_features, self.out_features = base_layer.num_embeddings, base_layer.embedding_dim

    def _create(self, adapter: str, r: int, device: Any, dtype: Any) -> None:
        self.lora_embedding_A[adapter] = nn.Parameter(ember.zeros(r, self.in_features, device=device, dtype=dtype))
        self.lora_embedding_B[adapter] = nn.Parameter(ember.zeros(self.out_features, r, device=device, dtype=dtype))

    def _ab(self, adapter: str) -> tuple[Tensor, Tensor]:
        return self.lora_embedding_A[adapter], self.lora_embedding_B[adapter]

    def _initialise(self, adapter: str, mode: bool | str) -> None:
        a, b = self._ab(adapter)
        if mode == "pissa":
            self._pissa(adapter)
        elif mode is False:
            init.normal_(a)
            init.normal_(b)
        else:  # True and "gaussian" alike, as PEFT
            init.zeros_(a)
            init.normal_(b)

    def _delta_matrix_shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    def _to_matrix(self, w: np.ndarray) -> np.ndarray:
        return w.T

    def _from_matrix(self, m: np.ndarray) -> np.ndarray:
        return m.T

    def get_delta_weight(self, adapter: str) -> Tensor:
        a, b = self._ab(adapter)
        return (b @ a).T * self.scaling[adapter]

    def _lora_term(self, adapter: str, x: Tensor) -> Tensor:
        a, b = self._ab(adapter)
        after_a = F.embedding(x, a.T, self.base_layer.padding_idx)
        out = (after_a @ b.T) * self.scaling[adapter]
        return out.to(self._weight().dtype) if out.dtype != self._weight().dtype else out


#: the projections of ``nn.MultiheadAttention`` LoRA can adapt, named as PEFT's ``target_modules`` name them on
#: models with separate projection layers; the hook names ``MultiheadAttention.projection_hook`` passes
ATTENTION_PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "out_proj")
_HOOK_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "out": "out_proj"}


class LoraMultiheadAttention(LoraLayer):
    """LoRA on the projections of an ``nn.MultiheadAttention``: per adapter, a pair ``lora_A[adapter][proj]``
    (``Linear(in, r)``) and ``lora_B[adapter][proj]`` (``Linear(r, embed_dim)``) for each adapted projection
    ``proj`` in ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``.

    The attention module keeps its packed ``in_proj_weight`` (one GEMM for q, k and v): the adapters' terms
    ``scaling · B(A(dropout(x)))`` are added to each projection's output through the module's
    ``projection_hook``, so the forward is LoRA's ``x W^T + s · x A^T B^T`` with no weight materialised, and the
    frozen base gets no gradient. ``merge`` adds ``s · B @ A`` to the projection's rows of ``in_proj_weight`` (or
    to ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` when kdim/vdim differ, or ``out_proj.weight``).
    Adapter files name the projections as layers: ``<path>.q_proj.lora_A.weight``, ... .
    """

    def __init__(self, base_layer: nn.MultiheadAttention) -> None:
        if not isinstance(base_layer, nn.MultiheadAttention):
            raise DTypeError(f"LoraMultiheadAttention: base_layer must be an nn.MultiheadAttention, got "
                             f"{type(base_layer).__name__}")
        if base_layer.projection_hook is not None:
            raise ValueRangeError("LoraMultiheadAttention: this MultiheadAttention already has a projection_hook "
                                  "(another wrapper owns it)")
        super().__init__(base_layer)
        self.lora_A = nn.ModuleDict()
        self.lora_B = nn.ModuleDict()
        self.projections: dict[str, tuple[str, ...]] = {}
        e = base_layer.embed_dim
        self.in_features = {"q_proj": e, "k_proj": base_layer.kdim, "v_proj": base_layer.vdim, "out_proj": e}
        self.out_features = e
        base_layer.projection_hook = self._projection_term

    def base_biases(self) -> dict[str, Tensor]:
        m = self.base_layer
        out = {"in_proj_bias": m.in_proj_bias, "out_proj.bias": m.out_proj.bias}
        return {k: v for k, v in out.items() if v is not None}

    def __getattr__(self, name: str) -> Any:
        # the layers that hold the attention read its settings (embed_dim, batch_first, num_heads, ...)
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base_layer":
                raise
            return getattr(self.base_layer, name)

    def release_base(self) -> nn.Module:
        # the plain module goes back into the model: it must not call into this wrapper any more
        self.base_layer.__dict__.pop("projection_hook", None)
        return self.base_layer

    # -- the base weights, per projection --------------------------------------------------------------------------
    def _weight(self) -> Tensor:
        m = self.base_layer
        return m.in_proj_weight if m.in_proj_weight is not None else m.q_proj_weight

    def _proj_weight(self, proj: str) -> tuple[Tensor, int]:
        """(the parameter holding ``proj``'s weight, its first row there)."""
        m = self.base_layer
        if proj == "out_proj":
            return m.out_proj.weight, 0
        i = ATTENTION_PROJECTIONS.index(proj)
        if m.in_proj_weight is not None:
            return m.in_proj_weight, i * m.embed_dim
        return getattr(m, f"{proj[0]}_proj_weight"), 0

    # -- adapters --------------------------------------------------------------------------------------------------
    def check_config(self, adapter: str, config: LoraConfig, projections: Any = None) -> None:
        projs = self._check_projections(projections)
        if adapter in self.r:
            raise ValueRangeError(f"LoraMultiheadAttention: adapter {adapter!r} already exists on this layer")
        if config.init_lora_weights == "pissa":
            for proj in projs:
                shape = (self.out_features, self.in_features[proj])
                if config.r > min(shape):
                    raise ValueRangeError(f"LoraMultiheadAttention: init_lora_weights='pissa' needs r <= min{shape} "
                                          f"of the {proj} weight, got r={config.r}")

    def _check_projections(self, projections: Any) -> tuple[str, ...]:
        if projections is None:
            return ATTENTION_PROJECTIONS
        projs = tuple(projections)
        bad = [p for p in projs if p not in ATTENTION_PROJECTIONS]
        if bad or not projs:
            raise ValueRangeError(f"LoraMultiheadAttention: projections must be a non-empty selection of "
                                  f"{ATTENTION_PROJECTIONS}, got {projs!r}")
        return tuple(p for p in ATTENTION_PROJECTIONS if p in projs)  # canonical order: keys do not depend on it

    def update_layer(self, adapter: str, config: LoraConfig, projections: Any = None) -> None:
        """Add adapter ``adapter`` on ``projections`` (default: all four) shaped and initialised by ``config``."""
        self.check_config(adapter, config, projections)
        projs = self._check_projections(projections)
        self.r[adapter] = config.r
        self.lora_alpha[adapter] = config.lora_alpha
        self.scaling[adapter] = config.scaling
        self.lora_dropout[adapter] = nn.Dropout(config.lora_dropout) if config.lora_dropout > 0 else nn.Identity()
        self.projections[adapter] = projs
        w = self._weight()
        kw = {"bias": False, "device": w.device, "dtype": w.dtype}
        self.lora_A[adapter] = nn.ModuleDict({p: nn.Linear(self.in_features[p], config.r, **kw) for p in projs})
        self.lora_B[adapter] = nn.ModuleDict({p: nn.Linear(config.r, self.out_features, **kw) for p in projs})
        mode = config.init_lora_weights
        if mode == "pissa":
            self._pissa(adapter)
        else:
            for p in projs:
                _init_pair(self.lora_A[adapter][p].weight, self.lora_B[adapter][p].weight, mode, config.r)

    def delete_adapter(self, adapter: str) -> None:
        super().delete_adapter(adapter)
        del self.projections[adapter]

    def _pair(self, adapter: str, proj: str) -> tuple[Tensor, Tensor]:
        return self.lora_A[adapter][proj].weight, self.lora_B[adapter][proj].weight

    def _ab(self, adapter: str) -> tuple[Tensor, Tensor]:
        raise ValueRangeError("LoraMultiheadAttention: adapters have one (A, B) pair per projection; use "
                              "get_delta_weights")

    def _pissa(self, adapter: str) -> None:
        # per projection, as LoraLayer._pissa on that projection's rows of the weight it lives in
        r, scale = self.r[adapter], self.scaling[adapter]
        for proj in self.projections[adapter]:
            w, row = self._proj_weight(proj)
            full = w.detach().numpy().astype(np.float64)
            rows = slice(row, row + self.out_features)
            b_np, a_np, residual = _pissa_factors(full[rows], r, scale)
            full[rows] = residual
            a, b = self._pair(adapter, proj)
            with ember.no_grad():
                a.copy_(ember.tensor(a_np, dtype=a.dtype, device=a.device))
                b.copy_(ember.tensor(b_np, dtype=b.dtype, device=b.device))
                w.copy_(ember.tensor(full, dtype=w.dtype, device=w.device))

    def get_delta_weight(self, adapter: str) -> Tensor:
        raise ValueRangeError("LoraMultiheadAttention: an adapter changes several weights; use get_delta_weights")

    def get_delta_weights(self, adapter: str) -> dict[str, Tensor]:
        """``{projection: scaling · B @ A}`` (each ``(embed_dim, in)``) of ``adapter``'s projections."""
        out = {}
        for proj in self.projections[adapter]:
            a, b = self._pair(adapter, proj)
            out[proj] = (b @ a) * self.scaling[adapter]
        return out

    # -- merging ---------------------------------------------------------------------------------------------------
    def _add_delta(self, adapter: str, sign: float) -> None:
        """Add (sign 1) or subtract (-1) ``adapter``'s updates to the weights they belong to, one in-place update
        per weight (the packed in_proj_weight gets its q, k and v rows at once)."""
        updates: dict[int, tuple[Tensor, list[tuple[int, Tensor]]]] = {}
        for proj, delta in self.get_delta_weights(adapter).items():
            w, row = self._proj_weight(proj)
            updates.setdefault(id(w), (w, []))[1].append((row, delta))
        with ember.no_grad():
            for w, parts in updates.values():
                if len(parts) == 1 and parts[0][1].shape == w.shape:
                    full = parts[0][1]
                else:
                    full = ember.zeros(tuple(w.shape), dtype=parts[0][1].dtype, device=w.device)
                    for row, delta in parts:
                        full[row:row + delta.shape[0]] = delta
                full = full.to(w.dtype)
                if sign > 0:
                    w.add_(full)
                else:
                    w.sub_(full)

    def merge(self, adapter_names: list[str] | None = None) -> None:
        """Fold the adapters (default: the active ones) into the projection weights; merged ones are skipped."""
        names = self.active_adapters if adapter_names is None else adapter_names
        for name in names:
            if name not in self.r:
                raise ValueRangeError(f"LoraMultiheadAttention.merge: no adapter {name!r} (adapters: "
                                      f"{self.adapter_names})")
            if name in self.merged_adapters:
                continue
            self._add_delta(name, 1.0)
            self.merged_adapters.append(name)

    def _unmerge_one(self, name: str) -> None:
        self._add_delta(name, -1.0)
        self.merged_adapters.remove(name)

    # -- forward ---------------------------------------------------------------------------------------------------
    def _projection_term(self, name: str, x: Tensor, y: Tensor) -> Tensor:
        """The base module's ``projection_hook``: ``y`` plus the active, unmerged adapters' terms for ``name``."""
        if self.disable_adapters:
            return y
        proj = _HOOK_NAMES[name]
        for adapter in self.active_adapters:
            if adapter in self.merged_adapters or proj not in self.projections[adapter]:
                continue
            a, b = self.lora_A[adapter][proj], self.lora_B[adapter][proj]
            term = b(a(self.lora_dropout[adapter](_cast_input(x, a.weight)))) * self.scaling[adapter]
            y = y + (term.to(y.dtype) if term.dtype != y.dtype else term)
        return y

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.disable_adapters and self.merged:  # as PEFT: a disabled layer computes the base model's output
            self.unmerge()
        return self.base_layer(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, projections={self.projections}"


class ModulesToSaveWrapper(nn.Module):
    """A frozen ``original_module`` plus a trainable copy per adapter (``modules_to_save.<adapter>``); the forward
    runs the active adapter's copy, or the original when adapters are disabled or none is active."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.original_module = module
        self.modules_to_save = nn.ModuleDict()
        self.active_adapter: str | None = None
        self.disable_adapters = False

    @property
    def adapter_names(self) -> list[str]:
        """Every adapter with a copy here."""
        return list(self.modules_to_save.keys())

    def update(self, adapter: str) -> None:
        """Add a trainable copy of the original module for ``adapter``."""
        if adapter in self.modules_to_save:
            raise ValueRangeError(f"ModulesToSaveWrapper: adapter {adapter!r} already has a copy")
        clone = copy.deepcopy(self.original_module)
        for p in clone.parameters():
            if p.dtype.is_floating_point:
                p.requires_grad_(True)
        self.modules_to_save[adapter] = clone

    def set_adapter(self, adapter: str | None) -> None:
        """Run ``adapter``'s copy (``None`` or a name without a copy: the original); only that copy trains."""
        self.active_adapter = adapter if adapter in self.modules_to_save else None
        for name in self.modules_to_save.keys():
            for p in self.modules_to_save[name].parameters():
                p.requires_grad_(name == self.active_adapter and p.dtype.is_floating_point)

    def delete_adapter(self, adapter: str) -> None:
        """Drop ``adapter``'s copy."""
        del self.modules_to_save[adapter]
        if self.active_adapter == adapter:
            self.active_adapter = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.disable_adapters or self.active_adapter is None:
            return self.original_module(*args, **kwargs)
        return self.modules_to_save[self.active_adapter](*args, **kwargs)

    def extra_repr(self) -> str:
        return f"adapters={self.adapter_names}, active={self.active_adapter!r}"


def _linear4bit() -> type[nn.Module]:
    from ember.quantization import Linear4bit

    return Linear4bit


#: the base layer types ``apply_lora`` wraps, and their wrappers (exact subclasses of the ember layers included);
#: ``Linear4bit`` is what ``apply_qlora`` quantizes the targets to
WRAPPERS: tuple[tuple[type[nn.Module], type[LoraLayer]], ...] = (
    (nn.Linear, LoraLinear), (nn.Conv2d, LoraConv2d), (nn.Embedding, LoraEmbedding), (_linear4bit(), QLoraLinear),
    (nn.MultiheadAttention, LoraMultiheadAttention),
)


def wrapper_for(module: nn.Module) -> type[LoraLayer] | None:
    """The LoRA wrapper class for ``module``, or None when LoRA does not wrap its type."""
    for base, wrapper in WRAPPERS:
        if isinstance(module, base):
            return wrapper
    return None


__all__ = ["LoraLayer", "LoraLinear", "QLoraLinear", "LoraConv2d", "LoraEmbedding", "LoraMultiheadAttention",
           "ModulesToSaveWrapper", "wrapper_for", "WRAPPERS", "ATTENTION_PROJECTIONS"]
