"""Caffe2's ``rnn_cell`` module: recurrent cells and the builders that turn them into a
``RecurrentNetwork`` op (see ``ferrocaffe.recurrent``).

The cells write to a ``model_helper.ModelHelper`` through ``brew`` and build nets equal to the
ones Caffe2 built. Caffe2's ``cudnn_LSTM`` (the cuDNN ``Recurrent`` op) is not provided.
"""

from ferrocaffe.attention import AttentionType
from ferrocaffe.rnn_cell.attention import (
    AttentionCell,
    LSTMWithAttention,
    LSTMWithAttentionCell,
    MILSTMWithAttentionCell,
)
from ferrocaffe.rnn_cell.base import RNNCell, _RectifyName, _RectifyNames
from ferrocaffe.rnn_cell.basic import BasicRNNCell
from ferrocaffe.rnn_cell.builders import (
    _LSTM,
    LSTM,
    MILSTM,
    BasicRNN,
    GetLSTMParamNames,
    InitFromLSTMParams,
    LayerNormLSTM,
    LayerNormMILSTM,
    _layered_LSTM,
    layered_LSTM,
)
from ferrocaffe.rnn_cell.lstm import (
    LayerNormLSTMCell,
    LayerNormMILSTMCell,
    LSTMCell,
    LSTMInitializer,
    MILSTMCell,
)
from ferrocaffe.rnn_cell.wrappers import (
    DropoutCell,
    MultiRNNCell,
    MultiRNNCellInitializer,
    UnrolledCell,
)

__all__ = [
    "RNNCell",
    "_RectifyName",
    "_RectifyNames",
    "BasicRNNCell",
    "LSTMInitializer",
    "LSTMCell",
    "LayerNormLSTMCell",
    "MILSTMCell",
    "LayerNormMILSTMCell",
    "DropoutCell",
    "MultiRNNCellInitializer",
    "MultiRNNCell",
    "UnrolledCell",
    "_LSTM",
    "LSTM",
    "BasicRNN",
    "MILSTM",
    "LayerNormLSTM",
    "LayerNormMILSTM",
    "GetLSTMParamNames",
    "InitFromLSTMParams",
    "_layered_LSTM",
    "layered_LSTM",
    "AttentionType",
    "AttentionCell",
    "LSTMWithAttentionCell",
    "MILSTMWithAttentionCell",
    "LSTMWithAttention",
]
