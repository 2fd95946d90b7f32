"""ember-opencl: the OpenCL backend of ember (pyopencl; GPUs of every vendor, and CPU runtimes such as PoCL).

Users never import this package: ``Device.opencl(i)`` finds it through the ``ember`` entry-point group.
"""

__version__ = "0.1.0"
#: backend-contract version this plugin implements
CONTRACT = 1
