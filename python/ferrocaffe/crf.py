"""Caffe2's ``crf`` module: a linear-chain conditional random field loss over per-step class
scores (``CRFWithLoss``), and Viterbi re-ranking of predictions (``update_predictions``).

Two extra classes mark the beginning (index ``num_classes``) and the end (``num_classes + 1``)
of a sequence; the transitions matrix is ``(num_classes + 2)`` square. The loss of a labelled
sequence is ``log(sum over all paths of exp(score)) - score(labelled path)``, where a path's
score is the sum of its unary scores and transitions. The sum over all paths runs as a
``RecurrentNetwork`` (one ``SortedSegmentRangeLogSumExp`` per step), which handles one sequence
at a time (batch size 1), as in Caffe2.
"""

import numpy as np

from ferrocaffe import brew, core, model_helper, recurrent

__all__ = ["CRFWithLoss"]

# The score given to impossible entries (a real class at BOS/EOS, BOS/EOS inside a sequence).
_LOW_SCORE = -1000.0


class CRFWithLoss:
    """A CRF over ``num_classes`` classes whose transitions are the parameter
    ``transitions_blob`` (by default ``crf_transitions``, uniform in [-1, 1])."""

    def __init__(self, model, num_classes, transitions_blob=None):
        self.model = model
        self.num_classes = num_classes
        self.num_classes_padded = num_classes + 2
        if not transitions_blob:
            transitions_blob = model.param_init_net.UniformFill(
                [],
                [core.ScopedBlobReference("crf_transitions")],
                shape=[self.num_classes_padded, self.num_classes_padded],
                min=-1.0,
                max=1.0,
            )
        self.transitions = transitions_blob
        model.params.append(self.transitions)

    def crf_loss(self, predictions, labels, seq_lengths=None):
        """The loss blob of one sequence: ``predictions`` ``[T, num_classes]`` scores,
        ``labels`` ``[T]`` class ids."""
        net = self.model.net
        # The transitions are read by several ops: a snapshot keeps them consistent when
        # parameter updates run in parallel.
        transitions = net.Copy(self.transitions, core.ScopedBlobReference("transitions_snapshot"))
        unary = self._gather_entries_sum(predictions, labels, self.num_classes)
        init_net = self.model.param_init_net
        predictions = CRFWithLoss.pad_predictions(predictions, init_net, net, self.num_classes)
        labels = CRFWithLoss.pad_labels(labels, init_net, net, self.num_classes)
        binary = self._path_binary_scores(labels, transitions, seq_lengths)
        path_score = net.Add([binary, unary], core.ScopedBlobReference("path_total"))

        # The sum over all paths: the recurrence starts from the BOS row and runs over the rest.
        zero_index = init_net.ConstantFill([], shape=[1], value=0)
        initial_state = net.Gather(
            [predictions, zero_index], core.ScopedBlobReference("rnn_initial"), dense_gradient=True
        )
        steps, _ = net.RemovePadding([predictions], padding_width=1, end_padding_width=0, outputs=2)
        steps = net.ExpandDims([steps], core.ScopedBlobReference("rnn_input_data"), dims=[1])
        # A copy of its own for the RecurrentNetwork (as Caffe2 did).
        transitions_copy = net.Copy(transitions, core.ScopedBlobReference("transitions_copy"))
        all_paths = self._crf_forward(steps, initial_state, transitions_copy)
        return net.Sub([all_paths, path_score], core.ScopedBlobReference("crf_loss"))

    def _path_binary_scores(self, labels, transitions, seq_lengths=None):
        """Sum of the transitions along the padded label path: entries
        ``transitions[labels[t], labels[t + 1]]`` gathered from the flattened matrix."""
        net = self.model.net
        to_ids, _ = net.RemovePadding([labels], outputs=2, padding_width=1, end_padding_width=0)
        from_ids, _ = net.RemovePadding([labels], outputs=2, padding_width=0, end_padding_width=1)
        width = net.ConstantFill([from_ids], value=self.num_classes_padded)
        flat_ids = net.Add([net.Mul([from_ids, width]), to_ids])
        flat_transitions = net.FlattenToVec([transitions])
        entries = net.Gather([flat_transitions, flat_ids], dense_gradient=True)
        return self.model.ReduceFrontSum(entries)

    def _gather_entries_sum(self, in_data, indices, index_size):
        """``sum_t in_data[t, indices[t]]``, as a one-hot dot product."""
        net = self.model.net
        indices = net.Cast([indices], to="int64")
        size = self.model.param_init_net.ConstantFill([], shape=[1], value=index_size)
        one_hot = net.OneHot([indices, size])
        scores = net.DotProduct([net.FlattenToVec(one_hot), net.FlattenToVec(in_data)])
        return net.ReduceFrontSum([scores])

    def _crf_forward(self, input_blob, initial_state, transitions_copy, seq_lengths=None):
        """log-sum-exp of the last step's scores: the log of the sum over all paths."""
        net = self.model.net
        last = self.build_crf_net(input_blob, initial_state, transitions_copy)
        last, _ = net.Reshape([last], outputs=2, shape=(self.num_classes_padded,))
        one_segment = self.model.param_init_net.ConstantFill(
            [], value=0, shape=[self.num_classes_padded], dtype=core.DataType.INT32
        )
        total = net.SortedSegmentRangeLogSumExp([last, one_segment])
        total, _ = net.Reshape(total, outputs=2, shape=())
        return total

    def build_crf_net(self, input_blob, initial_state, transitions):
        """Adds the forward recursion as a RecurrentNetwork (scope ``crf_net``) over
        ``input_blob`` (``T x 1 x D``, batch size 1 only) from ``initial_state``; returns the
        last step's state, ``cell[j] = logsumexp_i(prev[i] + transitions[i, j]) + input[j]``."""
        scope = "crf_net"
        n = self.num_classes_padded

        def s(name):
            # Scoped by hand: the step net mixes its own blobs with outer ones.
            return f"{scope}/{name}"

        step = model_helper.ModelHelper(name="crf_step", param_model=self.model)
        input_t, cell_t_prev, _ = step.net.AddExternalInputs(
            core.ScopedBlobReference("input_t"),
            core.ScopedBlobReference("cell_t_prev"),
            transitions,
        )
        one_segment = step.param_init_net.ConstantFill(
            [], [s("zero_segment_id")], value=0, shape=[n], dtype=core.DataType.INT32
        )
        # Declared an output so that the step's init net keeps it (Caffe2's test relies on it).
        step.param_init_net.AddExternalOutput(one_segment)

        # prev[i] down the rows, input[j] along the columns, plus transitions[i, j].
        prev_t = brew.transpose(step, cell_t_prev, [s("prev_transpose")], axes=(0, 2, 1))
        prev_tiled = step.net.Tile(prev_t, [s("prev_tiled")], tiles=n, axis=2)
        input_tiled = step.net.Tile(input_t, [s("input_t_tiled")], tiles=n, axis=1)
        summed = step.net.Add([prev_tiled, input_tiled], [s("input_with_prev")])
        summed = step.net.Add(
            [summed, transitions], [s("prev_with_transitions")], broadcast=1, use_grad_hack=1
        )
        matrix, _ = step.net.Reshape(
            summed,
            [s("all_with_transitions_reshaped"), s("all_with_transitions_orig")],
            shape=(n, n),
        )
        cell_t = step.net.SortedSegmentRangeLogSumExp([matrix, one_segment], [s("cell_t")])
        step.net.AddExternalOutputs(cell_t)

        _, out_last = recurrent.recurrent_net(
            net=self.model.net,
            cell_net=step.net,
            inputs=[(input_t, input_blob)],
            initial_cell_inputs=[(cell_t_prev, initial_state)],
            links={cell_t_prev: cell_t},
            scope=scope,
            outputs_with_grads=(1,),
        )
        return out_last

    def update_predictions(self, classes):
        """``classes`` (``[T, num_classes]`` scores) re-ranked so that, at every step, the class
        on the Viterbi path (under the transitions) has the highest score: a ``Python`` op
        swapping the best score with the path's one. Returns the new scores blob."""

        def viterbi_rerank(inputs, outputs):
            scores = np.array(inputs[0].data, copy=True)
            transitions = inputs[1].data
            steps = scores.shape[0]
            trellis = np.zeros(scores.shape)
            back = np.zeros(scores.shape, dtype=np.int32)
            trellis[0] = scores[0]
            for t in range(1, steps):
                v = trellis[t - 1][:, None] + transitions
                trellis[t] = scores[t] + v.max(axis=0)
                back[t] = v.argmax(axis=0)
            path = [int(np.argmax(trellis[-1]))]
            for bp in back[:0:-1]:
                path.append(int(bp[path[-1]]))
            path.reverse()
            for t, row in enumerate(scores):
                best = int(np.argmax(row))
                row[path[t]], row[best] = row[best], row[path[t]]
            # Without the BOS/EOS steps and classes.
            result = scores[1:-1, :-2]
            outputs[0].reshape(result.shape)
            outputs[0].data[...] = result

        padded = CRFWithLoss.pad_predictions(
            classes, self.model.param_init_net, self.model.net, self.num_classes
        )
        return self.model.net.Python(viterbi_rerank)(
            [padded, self.transitions], core.ScopedBlobReference("post_crf_classes")
        )

    @staticmethod
    def pad_labels(labels, init_net, net, num_classes):
        """``[BOS] + labels + [EOS]`` as int64."""
        bos = init_net.ConstantFill([], shape=[1], value=num_classes)
        eos = init_net.ConstantFill([], shape=[1], value=num_classes + 1)
        labels = net.Cast([labels], to="int64")
        padded, _ = net.Concat([bos, labels, eos], axis=0, outputs=2)
        return padded

    @staticmethod
    def pad_predictions(predictions, init_net, net, num_classes):
        """The scores with the BOS and EOS classes added (as columns, very low inside the
        sequence) and a BOS and an EOS step added (as rows, where only their own class
        scores 0)."""
        low = _LOW_SCORE
        bos_row = np.array([[low] * num_classes + [0, low]], dtype=np.float32)
        eos_row = np.array([[low] * num_classes + [low, 0]], dtype=np.float32)
        bos_row = init_net.GivenTensorFill(
            [], "b_scores", shape=[1, num_classes + 2], values=bos_row
        )
        eos_row = init_net.GivenTensorFill(
            [], "e_scores", shape=[1, num_classes + 2], values=eos_row
        )

        zero_index = net.ConstantFill([], shape=[1], value=0)
        length = net.Cast(net.Gather([net.Shape([predictions]), zero_index]), to="int32")
        steps = net.LengthsRangeFill(length)
        column = net.ExpandDims(net.ConstantFill([steps], value=low), dims=[1])
        widened, _ = net.Concat([predictions, column, column], outputs=2, axis=1)
        padded, _ = net.Concat([bos_row, widened, eos_row], outputs=2, axis=0)
        return padded
