"""ember-flex: the portable CPU backend of ember (numpy and its BLAS).

Users never import this package: ``Device.flex()`` (or ``Device.default()`` on a machine without GPUs) finds it
through the ``ember`` entry-point group.
"""

__version__ = "0.1.0"
#: backend-contract version this plugin implements
CONTRACT = 1
