"""ember-wgpu: the WebGPU backend for ember (``Device.wgpu(i, power="high"|"low")``) on wgpu-py.

WGSL compute shaders on Vulkan, Metal and DirectX 12 through wgpu-native; Mesa's lavapipe runs it on the CPU (ranked
"emulated", below flex). See ``docs/plugins/wgpu.md``.
"""

__version__ = "0.1.0"
#: backend-contract version this plugin implements
CONTRACT = 1
