"""Protobuf messages of Caffe2's schema (``caffe2_pb2``)."""
