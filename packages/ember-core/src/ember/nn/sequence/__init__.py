"""``ember.nn.sequence``: the layers over sequences, with PyTorch's names, parameters and numerics: multi-head
attention (``attention``), transformer encoder/decoder layers and stacks (``transformer``), and recurrent layers,
RNN, LSTM, GRU and their cells (``rnn``); ``ember.nn`` re-exports every name in ``__all__``."""

from .attention import MultiheadAttention
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from .transformer import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "MultiheadAttention",
    "TransformerEncoderLayer", "TransformerEncoder", "TransformerDecoderLayer", "TransformerDecoder", "Transformer",
    "RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell",
]
