"""Optimizers and learning-rate schedulers with PyTorch's names, arguments, defaults and update numerics.

>>> import ember
>>> from ember import nn
>>> model = nn.Module()
>>> model.w = nn.Parameter(ember.ones(3))
>>> opt = ember.optim.SGD(model.parameters(), lr=0.1)
>>> model.w.grad = ember.ones(3)
>>> _ = opt.step()
>>> [round(v, 6) for v in model.w.tolist()]
[0.9, 0.9, 0.9]
"""

from ..nn.param_group import param_groups
from . import lr_scheduler
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .adamax import Adamax
from .asgd import ASGD
from .lbfgs import LBFGS
from .lion import Lion
from .nadam import NAdam
from .optimizer import Optimizer
from .radam import RAdam
from .rmsprop import RMSprop
from .sgd import SGD
from .unsupported import SparseAdam

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Lion", "Adadelta", "Adamax", "NAdam", "RAdam",
           "ASGD", "SparseAdam", "LBFGS", "lr_scheduler", "param_groups"]
