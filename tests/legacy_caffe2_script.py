"""A legacy Caffe2 script: after ``ferrocaffe.compat.install()`` it touches only ``caffe2``
names. Run by tests/test_compat.py in a fresh interpreter; prints one JSON object.

    python legacy_caffe2_script.py protos|modules|net
"""

import json
import sys

import ferrocaffe.compat

ferrocaffe.compat.install()

# Everything below is the way Caffe2 code imported and used Caffe2.
import caffe2.proto.caffe2_pb2  # noqa: E402
import caffe2.python.core  # noqa: E402
import caffe2.python.workspace  # noqa: E402
from caffe2.proto import caffe2_pb2  # noqa: E402
from caffe2.python import core, workspace  # noqa: E402


def protos():
    net = caffe2_pb2.NetDef()
    net.name = "legacy"
    op = net.op.add()
    op.type = "Relu"
    op.input.append("x")
    op.output.append("y")
    op.device_option.device_type = caffe2_pb2.CPU
    arg = op.arg.add()
    arg.name = "order"
    arg.s = b"NCHW"
    net.external_input.append("x")
    net.external_output.append("y")
    plan = caffe2_pb2.PlanDef(name="plan")
    plan.network.add().CopyFrom(net)
    step = plan.execution_step.add(name="step", num_iter=3)
    step.network.append("legacy")
    data = plan.SerializeToString()
    back = caffe2_pb2.PlanDef.FromString(data)
    return {
        "plan_roundtrip_equal": back == plan,
        "op_type": back.network[0].op[0].type,
        "device_type": back.network[0].op[0].device_option.device_type,
        "cpu": caffe2_pb2.CPU,
        "cuda": caffe2_pb2.CUDA,
        "float": caffe2_pb2.TensorProto.FLOAT,
        "message_module": type(net).__module__,
        "b64": __import__("base64").b64encode(data).decode(),
    }


def modules():
    return {
        "core": core.__name__,
        "workspace": workspace.__name__,
        "caffe2_pb2": caffe2_pb2.__name__,
        "dotted_core_is_core": caffe2.python.core is core,
        "dotted_workspace_is_workspace": caffe2.python.workspace is workspace,
        "dotted_pb2_is_pb2": caffe2.proto.caffe2_pb2 is caffe2_pb2,
        "core_pb2_is_pb2": core.caffe2_pb2 is caffe2_pb2,
        "packages": [caffe2.__name__, caffe2.python.__name__, caffe2.proto.__name__],
        "sys_modules": sorted(n for n in sys.modules if n.split(".")[0] == "caffe2"),
    }


def net():
    # Works once the core.Net helper is merged.
    n = core.Net("legacy_mlp")
    fc = n.FC(["data", "w", "b"], "fc")
    relu = n.Relu(fc, "relu")
    softmax = n.Softmax(relu, "softmax")
    n.AddExternalOutput(softmax)
    return {
        "name": n.Name(),
        "outputs": [str(fc), str(relu), str(softmax)],
        "b64": __import__("base64").b64encode(n.Proto().SerializeToString()).decode(),
    }


if __name__ == "__main__":
    part = {"protos": protos, "modules": modules, "net": net}[sys.argv[1]]
    print(json.dumps(part()))
