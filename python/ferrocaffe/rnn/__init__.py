"""Caffe2's ``caffe2.python.rnn`` package (its RNN test helpers)."""
