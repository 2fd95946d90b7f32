"""ember's op functions, grouped by kind. Everything public is re-exported from the top-level ``ember``
namespace and, where PyTorch has the method, attached to :class:`ember.Tensor` (see each module's
``TENSOR_METHODS``). The elementwise ones (``pointwise``) are generated from the op registry, :mod:`ember.opinfo`."""
