"""Caffe2's ``caffe2.python.serialized_test`` package: operator tests compared with outputs
Caffe2 recorded (see :mod:`ferrocaffe.serialized_test.serialized_test_util`)."""
