"""The plugin's own tests exercise the OpenCL backend itself, so its devices are not fused here (fusion would wrap
``Device.opencl(0).stack``); fused OpenCL runs in the conformance kit and in test_fusion.py."""

import os

os.environ.setdefault("EMBER_FUSION", "0")
