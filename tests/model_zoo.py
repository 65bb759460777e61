"""The models of the golden ``models/`` corpus, rebuilt with ferrocaffe's ``model_helper`` +
``brew`` (and ``cnn.CNNModelHelper``), as their descriptions and recorded nets spell them out.
Each builder returns the model; ``BUILDERS`` maps a case name to its builder."""

from ferrocaffe import brew, cnn, model_helper


def lenet(order):
    m = model_helper.ModelHelper(name="lenet_" + order.lower(), arg_scope={"order": order})
    conv1 = brew.conv(m, "data", "conv1", dim_in=1, dim_out=20, kernel=5)
    pool1 = brew.max_pool(m, conv1, "pool1", kernel=2, stride=2)
    conv2 = brew.conv(m, pool1, "conv2", dim_in=20, dim_out=32, kernel=5)
    pool2 = brew.max_pool(m, conv2, "pool2", kernel=2, stride=2)
    fc3 = brew.fc(m, pool2, "fc3", dim_in=32 * 4 * 4, dim_out=64)
    fc3 = brew.relu(m, fc3, fc3)
    pred = brew.fc(m, fc3, "pred", 64, 10)
    brew.softmax(m, pred, "softmax")
    return m


def alexnet_like():
    m = model_helper.ModelHelper(name="alexnet_like_nhwc", arg_scope={"order": "NHWC"})
    x = brew.conv(m, "data", "conv1", 3, 24, 11, stride=4, pad=2)
    x = brew.relu(m, x, x)
    x = brew.lrn(m, x, "norm1", size=5, alpha=1e-4, beta=0.75)
    x = brew.max_pool(m, x, "pool1", kernel=3, stride=2)
    x = brew.conv(m, x, "conv2", 24, 32, 5, pad=2, group=2)
    x = brew.relu(m, x, x)
    x = brew.lrn(m, x, "norm2", size=5, alpha=1e-4, beta=0.75)
    x = brew.max_pool(m, x, "pool2", kernel=3, stride=2)
    x = brew.conv(m, x, "conv3", 32, 48, 3, pad=1)
    x = brew.relu(m, x, x)
    x = brew.conv(m, x, "conv4", 48, 48, 3, pad=1, group=2)
    x = brew.relu(m, x, x)
    x = brew.conv(m, x, "conv5", 48, 32, 3, pad=1, group=2)
    x = brew.relu(m, x, x)
    x = brew.max_pool(m, x, "pool5", kernel=3, stride=2)
    x = brew.fc(m, x, "fc6", 32, 64)
    x = brew.relu(m, x, x)
    x = brew.dropout(m, x, "fc6_drop", ratio=0.5, is_test=True)
    x = brew.fc(m, x, "fc7", 64, 64)
    x = brew.relu(m, x, x)
    x = brew.dropout(m, x, "fc7_drop", ratio=0.5, is_test=True)
    x = brew.fc(m, x, "fc8", 64, 10)
    brew.softmax(m, x, "prob")
    return m


def _fire(m, prefix, x, dim_in, squeeze, expand):
    s = brew.conv(m, x, prefix + "/squeeze1x1", dim_in, squeeze, 1)
    s = brew.relu(m, s, s)
    e1 = brew.conv(m, s, prefix + "/expand1x1", squeeze, expand, 1)
    e1 = brew.relu(m, e1, e1)
    e3 = brew.conv(m, s, prefix + "/expand3x3", squeeze, expand, 3, pad=1)
    e3 = brew.relu(m, e3, e3)
    return brew.concat(m, [e1, e3], prefix + "/concat")


def squeezenet_like():
    m = model_helper.ModelHelper(name="squeezenet_like_nchw")
    x = brew.conv(m, "data", "conv1", 3, 32, 3, stride=2)
    x = brew.relu(m, x, x)
    x = brew.max_pool(m, x, "pool1", kernel=3, stride=2)
    x = _fire(m, "fire2", x, 32, 8, 16)
    x = _fire(m, "fire3", x, 32, 8, 16)
    x = brew.max_pool(m, x, "pool3", kernel=3, stride=2)
    x = _fire(m, "fire4", x, 32, 16, 32)
    x = brew.dropout(m, x, "fire4_drop", ratio=0.5, is_test=True)
    x = brew.conv(m, x, "conv10", 64, 10, 1)
    x = brew.relu(m, x, x)
    x = brew.average_pool(m, x, "pool10", global_pooling=True)
    brew.softmax(m, x, "softmax")
    return m


def _inception(m, prefix, x, dim_in, c1, c3r, c3, c5r, c5, cp, depth_concat):
    def conv_relu(blob_in, name, dim_in, dim_out, kernel, **kwargs):
        y = m.Conv(blob_in, prefix + "/" + name, dim_in, dim_out, kernel, **kwargs)
        return m.Relu(y, y)

    b1 = conv_relu(x, "1x1", dim_in, c1, 1)
    b3 = conv_relu(x, "3x3_reduce", dim_in, c3r, 1)
    b3 = conv_relu(b3, "3x3", c3r, c3, 3, pad=1)
    b5 = conv_relu(x, "5x5_reduce", dim_in, c5r, 1)
    b5 = conv_relu(b5, "5x5", c5r, c5, 5, pad=2)
    bp = m.MaxPool(x, prefix + "/pool", kernel=3, stride=1, pad=1)
    bp = conv_relu(bp, "pool_proj", dim_in, cp, 1)
    concat = m.DepthConcat if depth_concat else m.Concat
    return concat([b1, b3, b5, bp], prefix + "/output")


def googlenet_like():
    m = cnn.CNNModelHelper(order="NCHW", name="googlenet_like")
    x = m.Conv("data", "conv1", 3, 16, 5, pad=2)
    x = m.Relu(x, x)
    x = m.MaxPool(x, "pool1", kernel=3, stride=2)
    x = m.LRN(x, "norm1", size=5, alpha=1e-4, beta=0.75)
    x = m.Conv(x, "conv2_reduce", 16, 16, 1)
    x = m.Relu(x, x)
    x = m.Conv(x, "conv2", 16, 32, 3, pad=1)
    x = m.Relu(x, x)
    x = m.LRN(x, "norm2", size=5, alpha=1e-4, beta=0.75)
    x = m.MaxPool(x, "pool2", kernel=3, stride=2)
    x = _inception(m, "inc3a", x, 32, 16, 12, 16, 4, 8, 8, depth_concat=True)
    x = _inception(m, "inc3b", x, 48, 16, 16, 24, 4, 12, 12, depth_concat=False)
    x = m.AveragePool(x, "pool5", kernel=7, stride=1)
    x = m.Dropout(x, "pool5_drop", ratio=0.4, is_test=True)
    x = m.FC(x, "classifier", 64, 10)
    m.Softmax(x, "prob")
    return m


def _conv_bn(m, x, name, dim_in, dim_out, kernel, stride, pad, relu=True):
    y = brew.conv(m, x, name, dim_in, dim_out, kernel, stride=stride, pad=pad, no_bias=1)
    y = brew.spatial_bn(m, y, name + "_bn", dim_out, epsilon=1e-3, momentum=0.9, is_test=True)
    return brew.relu(m, y, y) if relu else y


def resnet_like(order):
    m = model_helper.ModelHelper(name="resnet_like_" + order.lower(), arg_scope={"order": order})
    x = _conv_bn(m, "data", "conv1", 3, 16, 3, 1, 1)
    a = _conv_bn(m, x, "res2a_branch2a", 16, 16, 3, 1, 1)
    a = _conv_bn(m, a, "res2a_branch2b", 16, 16, 3, 1, 1, relu=False)
    x = brew.sum(m, [a, x], "res2a")
    x = brew.relu(m, x, x)
    a = _conv_bn(m, x, "res3a_branch2a", 16, 32, 3, 2, 1)
    a = _conv_bn(m, a, "res3a_branch2b", 32, 32, 3, 1, 1, relu=False)
    shortcut = _conv_bn(m, x, "res3a_branch1", 16, 32, 1, 2, 0, relu=False)
    x = brew.sum(m, [a, shortcut], "res3a")
    x = brew.relu(m, x, x)
    x = brew.average_pool(m, x, "pool5", global_pooling=True)
    x = brew.fc(m, x, "pred", 32, 10)
    brew.softmax(m, x, "softmax")
    return m


def mobilenet_like(order):
    m = model_helper.ModelHelper(name="mobilenet_like_" + order.lower(), arg_scope={"order": order})
    x = _conv_bn(m, "data", "conv1", 3, 16, 3, 2, 1)
    for name, dim_in, dim_out, stride in (("conv2", 16, 32, 1), ("conv3", 32, 64, 2)):
        y = brew.conv(
            m, x, name + "_dw", dim_in, dim_in, 3, stride=stride, pad=1, no_bias=1, group=dim_in
        )
        y = brew.spatial_bn(m, y, name + "_dw_bn", dim_in, epsilon=1e-3, momentum=0.9, is_test=True)
        y = brew.relu(m, y, y)
        x = _conv_bn(m, y, name + "_pw", dim_in, dim_out, 1, 1, 0)
    x = brew.average_pool(m, x, "pool", global_pooling=True)
    x = brew.fc(m, x, "fc", 64, 10)
    brew.softmax(m, x, "softmax")
    return m


def vgg_like():
    m = model_helper.ModelHelper(name="vgg_like_nhwc", arg_scope={"order": "NHWC"})
    x = "data"
    dim_in = 3
    for stage, dim_out in ((1, 16), (2, 32), (3, 32)):
        for i in (1, 2):
            x = brew.conv(m, x, f"conv{stage}_{i}", dim_in, dim_out, 3, pad=1)
            x = brew.relu(m, x, x)
            dim_in = dim_out
        x = brew.max_pool(m, x, f"pool{stage}", kernel=2, stride=2)
    x = brew.fc(m, x, "fc6", 4 * 4 * 32, 32)
    x = brew.relu(m, x, x)
    x = brew.dropout(m, x, "drop6", ratio=0.5, is_test=True)
    x = brew.fc(m, x, "fc7", 32, 64)
    x = brew.relu(m, x, x)
    x = brew.dropout(m, x, "drop7", ratio=0.5, is_test=True)
    x = brew.fc(m, x, "fc8", 64, 10)
    brew.softmax(m, x, "prob")
    return m


def style_transfer_like():
    m = model_helper.ModelHelper(name="style_transfer_like_bilinear")

    def conv_in(x, name, dim_in, dim_out, kernel, stride=None, pad=None, **in_kwargs):
        conv_kwargs = {}
        if stride is not None:
            conv_kwargs["stride"] = stride
        if pad is not None:
            conv_kwargs["pad"] = pad
        y = brew.conv(m, x, name, dim_in, dim_out, kernel, **conv_kwargs)
        return brew.instance_norm(m, y, name + "_in", dim_out, **in_kwargs)

    def conv_in_prelu(x, name, dim_in, dim_out, kernel, stride, pad):
        y = conv_in(x, name, dim_in, dim_out, kernel, stride, pad, epsilon=1e-5, is_test=True)
        return brew.prelu(m, y, name + "_prelu", num_channels=dim_out)

    x = conv_in_prelu("data", "conv1", 3, 8, 5, 1, 2)
    x = conv_in_prelu(x, "conv2", 8, 16, 3, 2, 1)
    x = conv_in_prelu(x, "conv3", 16, 32, 3, 2, 1)
    r = conv_in(x, "res1_a", 32, 32, 3, 1, 1, epsilon=1e-5, is_test=True)
    r = brew.relu(m, r, r)
    r = conv_in(r, "res1_b", 32, 32, 3, 1, 1, epsilon=1e-5, is_test=True)
    x = brew.sum(m, [x, r], "res1")
    x = brew.conv_transpose(m, x, "deconv1", 32, 16, 4, stride=2, pad=1)
    x = brew.instance_norm(m, x, "deconv1_in", 16, is_test=True)
    x = brew.relu(m, x, x)
    x = m.net.UpsampleBilinear(x, "up2", width_scale=2.0, height_scale=2.0)
    x = conv_in_prelu(x, "conv4", 16, 8, 3, 1, 1)
    x = brew.conv(m, x, "conv5", 8, 3, 5, pad=2)
    brew.tanh(m, x, "output")
    return m


def embedding_bag_int32():
    m = model_helper.ModelHelper(name="embedding_bag_int32")
    indices = m.net.Gather(["id_map", "raw_ids"], "indices")
    pooled = m.net.SparseLengthsSum(["emb", indices, "lengths"], "pooled")
    x = brew.fc(m, pooled, "fc1", 16, 32)
    x = brew.relu(m, x, x)
    x = brew.fc(m, x, "fc2", 32, 1)
    m.Sigmoid(x, "prob")
    return m


def embedding_bag_int64():
    m = model_helper.ModelHelper(name="embedding_bag_int64")
    bottom = brew.fc(m, "dense", "bottom_fc", 13, 16)
    bottom = brew.relu(m, bottom, bottom)
    pooled_a = m.net.SparseLengthsSum(["emb_a", "indices_a", "lengths_a"], "pooled_a")
    indices_b = m.net.Gather(["id_map_b", "raw_ids_b"], "indices_b")
    pooled_b = m.net.SparseLengthsWeightedSum(
        ["emb_b", "weights_b", indices_b, "lengths_b"], "pooled_b"
    )
    x = brew.concat(m, [bottom, pooled_a, pooled_b], "interaction", axis=1)
    x = brew.fc(m, x, "top_fc1", 48, 16)
    x = brew.relu(m, x, x)
    x = brew.fc(m, x, "top_fc2", 16, 1)
    m.Sigmoid(x, "prob")
    return m


def layout_ops():
    m = model_helper.ModelHelper(name="layout_ops")
    x = m.net.NHWC2NCHW("data_nhwc", "data_nchw")
    x = brew.conv(m, x, "conv1", 3, 8, 3, pad=1)
    x = brew.relu(m, x, "relu1")
    x = brew.max_pool(m, x, "pool1", kernel=2, stride=2)
    x = m.net.NCHW2NHWC(x, "pool1_nhwc")
    x = brew.transpose(m, x, "pool1_nchw", axes=[0, 3, 1, 2])
    x = m.net.Flatten(x, "flat")
    x = brew.fc(m, x, "fc1", 8 * 8 * 8, 24)
    x, _ = m.net.Reshape(x, ["fc1_3d", "fc1_old_shape"], shape=[-1, 4, 6])
    x = brew.transpose(m, x, "fc1_3d_t", axes=[0, 2, 1])
    x, _ = m.net.Reshape(x, ["fc1_2d", "fc1_3d_t_old_shape"], shape=[0, -1])
    x = brew.fc(m, x, "fc2", 24, 10)
    brew.softmax(m, x, "softmax")
    return m


def mlp_train():
    """The MLP of ``model.mlp.trained_extracted`` before training: FC/Relu x2, FC, Softmax,
    and its loss."""
    m = model_helper.ModelHelper(name="mlp_train")
    x = brew.fc(m, "data", "fc1", 32, 64)
    x = brew.relu(m, x, "fc1_relu")
    x = brew.fc(m, x, "fc2", 64, 32)
    x = brew.relu(m, x, "fc2_relu")
    x = brew.fc(m, x, "fc3", 32, 5)
    softmax = brew.softmax(m, x, "softmax")
    xent = m.LabelCrossEntropy([softmax, "label"], "xent")
    m.AveragedLoss(xent, "loss")
    return m


BUILDERS = {
    "model.lenet.mnist": lambda: lenet("NCHW"),
    "model.lenet.nhwc": lambda: lenet("NHWC"),
    "model.alexnet_like.nhwc": alexnet_like,
    "model.squeezenet_like.fire": squeezenet_like,
    "model.googlenet_like.inception": googlenet_like,
    "model.resnet_like.nchw": lambda: resnet_like("NCHW"),
    "model.resnet_like.nhwc": lambda: resnet_like("NHWC"),
    "model.mobilenet_like.nchw": lambda: mobilenet_like("NCHW"),
    "model.mobilenet_like.nhwc": lambda: mobilenet_like("NHWC"),
    "model.vgg_like.nhwc": vgg_like,
    "model.style_transfer_like.instance_norm": style_transfer_like,
    "model.embedding_bag.int32": embedding_bag_int32,
    "model.embedding_bag.int64": embedding_bag_int64,
    "model.layout_ops.transpose_reshape": layout_ops,
}


def dpm_forward(model, kind, loss_scale=1.0):
    """The forward pass of a golden ``dpm/`` model (see its model_description), in the current
    scopes; returns the loss scaled by ``loss_scale`` (what Parallelize passes)."""
    if kind == "mlp":
        x = brew.fc(model, "data", "fc1", 10, 16)
        x = brew.relu(model, x, "relu1")
        x = brew.fc(model, x, "fc2", 16, 4)
    elif kind == "cnn":
        x = model.Conv("data", "conv1", 3, 4, 3, pad=1)
        x = model.Relu(x, "relu1")
        x = model.MaxPool(x, "pool1", kernel=2, stride=2)
        x = model.Conv(x, "conv2", 4, 8, 3, pad=1)
        x = model.Relu(x, "relu2")
        x = model.MaxPool(x, "pool2", kernel=2, stride=2)
        x = model.FC(x, "fc", 32, 5)
    elif kind == "cnn_bn":
        x = brew.conv(model, "data", "conv1", 3, 4, 3, pad=1, no_bias=1)
        x = brew.spatial_bn(model, x, "conv1_bn", 4, epsilon=1e-3, momentum=0.9, is_test=False)
        x = brew.relu(model, x, "relu1")
        x = brew.max_pool(model, x, "pool1", kernel=2, stride=2)
        x = brew.fc(model, x, "fc", 64, 5)
    else:
        emb = model.param_init_net.GaussianFill([], "emb", shape=[20, 4])
        model.AddParameter(emb)
        x = model.net.Gather([emb, "idx"], "gathered")
        x = brew.fc(model, x, "fc", 4, 3)
    softmax = brew.softmax(model, x, "softmax")
    xent = model.LabelCrossEntropy([softmax, "label"], "xent")
    loss = model.AveragedLoss(xent, "loss")
    return model.Scale(loss, "loss_scaled", scale=loss_scale)
