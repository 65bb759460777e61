"""A character-level LSTM language model, trained and sampled with ferrocaffe: the ``demo``
command (``ferrocaffe demo`` / ``python -m ferrocaffe demo``).

The model is Caffe2's char-RNN: one-hot characters (T x N x V) -> ``rnn_cell.LSTM`` (a
RecurrentNetwork op running on the threaded step executor) -> ``brew.fc`` on axis 2 -> softmax
cross-entropy averaged over time and batch (``SoftmaxWithLoss``), trained with
``optimizer.build_adagrad``. Training is truncated back-propagation through time: the batch is
N cursors spread over the text, each advancing ``seq_length`` characters per iteration, and the
last hidden and cell states of one iteration are the initial states of the next. Generation
runs the forward part of the same net one character at a time.

By default the corpus is the package's own sources and documentation (read with
``importlib.resources``); any UTF-8 text file can be given instead.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

TEXT_SUFFIXES = (".py", ".pyi", ".md", ".txt", ".pbtxt", ".proto")


def package_corpus() -> str:
    """The text of the package's Python sources and docs, files in sorted path order."""
    parts: list[tuple[str, str]] = []

    def walk(node, path):
        for child in node.iterdir():
            name = child.name
            if name.startswith(".") or name == "__pycache__":
                continue
            if child.is_dir():
                walk(child, f"{path}{name}/")
            elif name.endswith(TEXT_SUFFIXES):
                try:
                    parts.append((path + name, child.read_text(encoding="utf-8")))
                except (UnicodeDecodeError, OSError):
                    continue

    walk(resources.files("ferrocaffe"), "")
    parts.sort()
    return "".join(text if text.endswith("\n") else text + "\n" for _, text in parts)


@dataclass
class Config:
    """Training settings (the command-line options of ``demo``)."""

    hidden_size: int = 128
    seq_length: int = 32
    batch_size: int = 32
    iterations: int = 2000
    learning_rate: float = 0.1
    max_seconds: float = 75.0
    threads: int = 0
    sample_length: int = 300
    temperature: float = 0.7
    seed: int = 1234


@dataclass
class Result:
    """What a training run produced."""

    losses: list[float] = field(default_factory=list)
    sample: str = ""
    seconds: float = 0.0
    chars_per_second: float = 0.0
    vocab_size: int = 0
    corpus_chars: int = 0


class CharRNN:
    """The training and generation nets over one vocabulary."""

    def __init__(self, text: str, config: Config):
        from ferrocaffe import brew, core, model_helper, optimizer, rnn_cell

        if len(text) < config.seq_length * config.batch_size + 1:
            raise ValueError(
                f"the corpus has {len(text)} characters; it needs more than seq_length x "
                f"batch_size = {config.seq_length * config.batch_size}"
            )
        self.config = config
        self.text = text
        self.vocab = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.vocab)}
        self.ids = np.fromiter((self.index[c] for c in text), dtype=np.int32, count=len(text))
        V, H = len(self.vocab), config.hidden_size

        model = model_helper.ModelHelper(name="char_rnn")
        hidden, hidden_last, _, cell_last = rnn_cell.LSTM(
            model,
            "input_blob",
            "seq_lengths",
            ("hidden_init", "cell_init"),
            V,
            H,
            scope="LSTM",
        )
        self.hidden_last, self.cell_last = str(hidden_last), str(cell_last)
        logits = brew.fc(model, hidden, "logits", dim_in=H, dim_out=V, axis=2)
        # The forward part, before the loss, generates text.
        self.forward_net = core.Net(model.net.Proto().name + "_forward")
        self.forward_net.Proto().CopyFrom(model.net.Proto())
        self.forward_net.Proto().name = model.net.Proto().name + "_forward"
        self.forward_net.Softmax(logits, "probs", axis=2)
        flat, _ = model.net.Reshape(logits, ["logits_flat", "logits_old_shape"], shape=[-1, V])
        _, loss = model.net.SoftmaxWithLoss([flat, "target"], ["softmax", "loss"])
        model.AddGradientOperators([loss])
        optimizer.build_adagrad(model, base_learning_rate=config.learning_rate)
        self.model = model
        for net in (model.net, self.forward_net):
            for op in net.Proto().op:
                if op.type.startswith("RecurrentNetwork") and config.threads:
                    op.arg.add(name="rnn_executor.num_threads", i=config.threads)

    def one_hot(self, ids: np.ndarray) -> np.ndarray:
        out = np.zeros(ids.shape + (len(self.vocab),), np.float32)
        np.put_along_axis(out, ids[..., None].astype(np.int64), 1.0, axis=-1)
        return out

    def train(self, progress=None) -> Result:
        """Runs the configured iterations, or fewer when ``max_seconds`` (if positive) runs out;
        ``progress(iteration, loss, chars_per_second)`` is called after each."""
        from ferrocaffe import workspace

        cfg = self.config
        T, N, H = cfg.seq_length, cfg.batch_size, cfg.hidden_size
        workspace.RunNetOnce(self.model.param_init_net)
        zeros = np.zeros((1, N, H), np.float32)
        workspace.FeedBlob("hidden_init", zeros)
        workspace.FeedBlob("cell_init", zeros)
        workspace.FeedBlob("seq_lengths", np.full(N, T, np.int32))
        span = (len(self.ids) - 1) // N
        cursors = np.arange(N) * span
        steps = np.arange(T)[:, None]
        result = Result(vocab_size=len(self.vocab), corpus_chars=len(self.text))
        # Warm-up inputs so the net can be created, then train.
        workspace.FeedBlob("input_blob", np.zeros((T, N, len(self.vocab)), np.float32))
        workspace.FeedBlob("target", np.zeros(T * N, np.int32))
        workspace.CreateNet(self.model.net, overwrite=True)
        name = self.model.net.Proto().name
        start = time.perf_counter()
        for it in range(cfg.iterations):
            wrap = cursors + T + 1 > (np.arange(N) + 1) * span
            if wrap.any():
                cursors = np.where(wrap, np.arange(N) * span, cursors)
                workspace.FeedBlob("hidden_init", zeros)
                workspace.FeedBlob("cell_init", zeros)
            pos = cursors[None, :] + steps
            workspace.FeedBlob("input_blob", self.one_hot(self.ids[pos]))
            workspace.FeedBlob("target", self.ids[pos + 1].reshape(-1))
            workspace.RunNet(name)
            workspace.FeedBlob("hidden_init", workspace.FetchBlob(self.hidden_last))
            workspace.FeedBlob("cell_init", workspace.FetchBlob(self.cell_last))
            cursors = cursors + T
            result.losses.append(float(workspace.FetchBlob("loss")))
            elapsed = time.perf_counter() - start
            result.chars_per_second = (it + 1) * T * N / max(elapsed, 1e-9)
            if progress is not None:
                progress(it + 1, result.losses[-1], result.chars_per_second)
            if cfg.max_seconds > 0 and elapsed > cfg.max_seconds:
                break
        result.seconds = time.perf_counter() - start
        return result

    def generate(self, length: int, prime: str = "def ") -> str:
        """``length`` characters sampled after ``prime`` (unknown characters dropped)."""
        from ferrocaffe import workspace

        cfg = self.config
        rng = np.random.default_rng(cfg.seed)
        H = cfg.hidden_size
        prime = "".join(c for c in prime if c in self.index) or self.text[0]
        workspace.FeedBlob("seq_lengths", np.ones(1, np.int32))
        workspace.FeedBlob("hidden_init", np.zeros((1, 1, H), np.float32))
        workspace.FeedBlob("cell_init", np.zeros((1, 1, H), np.float32))
        workspace.FeedBlob("input_blob", self.one_hot(np.zeros((1, 1), np.int32)))
        workspace.CreateNet(self.forward_net, overwrite=True)
        name = self.forward_net.Proto().name
        out = []
        current = self.index[prime[0]]
        for k in range(len(prime) + length - 1):
            workspace.FeedBlob("input_blob", self.one_hot(np.array([[current]], np.int32)))
            workspace.RunNet(name)
            workspace.FeedBlob("hidden_init", workspace.FetchBlob(self.hidden_last))
            workspace.FeedBlob("cell_init", workspace.FetchBlob(self.cell_last))
            if k + 1 < len(prime):
                current = self.index[prime[k + 1]]
                continue
            p = workspace.FetchBlob("probs").reshape(-1).astype(np.float64)
            logp = np.log(np.maximum(p, 1e-12)) / max(cfg.temperature, 1e-3)
            q = np.exp(logp - logp.max())
            current = int(rng.choice(len(q), p=q / q.sum()))
            out.append(self.vocab[current])
        return prime + "".join(out)


def _bar(done: int, total: int, loss: float, cps: float, width: int = 30) -> str:
    filled = int(width * done / max(total, 1))
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  "
        f"loss {loss:6.3f}  {cps:8.0f} chars/s"
    )


def run(config: Config, corpus_path: str | None = None, out=None, err=None) -> Result:
    """Trains on the corpus, shows progress on ``err``, prints the loss curve and generated text
    on ``out``; returns the result."""
    out = out or sys.stdout
    err = err or sys.stderr
    if config.threads:
        # The GEMM worker pool reads this when it starts (only the first run in a process).
        os.environ.setdefault("RAYON_NUM_THREADS", str(config.threads))
    if corpus_path is None:
        text, label = package_corpus(), "the ferrocaffe package's sources and docs"
    else:
        with open(corpus_path, encoding="utf-8", errors="replace") as f:
            text, label = f.read(), corpus_path
    model = CharRNN(text, config)
    print(
        f"char-RNN on {label}: {len(text):,} characters, vocabulary {len(model.vocab)}; "
        f"LSTM hidden {config.hidden_size}, {config.iterations} iterations of "
        f"{config.batch_size} x {config.seq_length} characters",
        file=out,
    )
    tty = hasattr(err, "isatty") and err.isatty()
    smooth = [None]
    marks = {max(1, round(config.iterations * k / 20)) for k in range(1, 21)}

    def progress(it, loss, cps):
        smooth[0] = loss if smooth[0] is None else 0.9 * smooth[0] + 0.1 * loss
        if tty:
            err.write("\r" + _bar(it, config.iterations, smooth[0], cps))
            err.flush()
        if it in marks or it == 1:
            if tty:
                err.write("\n")
            print(f"iteration {it:5d}  loss {smooth[0]:.3f}  {cps:,.0f} chars/s", file=out)
            out.flush()

    result = model.train(progress)
    if tty:
        err.write("\n")
    if len(result.losses) < config.iterations:
        print(
            f"stopped after {len(result.losses)} iterations: the time limit of "
            f"{config.max_seconds:g} s (--max-seconds) was reached",
            file=out,
        )
    first = float(np.mean(result.losses[: max(1, len(result.losses) // 10)]))
    last = float(np.mean(result.losses[-max(1, len(result.losses) // 10) :]))
    print(
        f"trained in {result.seconds:.1f} s ({result.chars_per_second:,.0f} chars/s); "
        f"loss {first:.3f} -> {last:.3f}",
        file=out,
    )
    result.sample = model.generate(config.sample_length)
    print("\n--- generated text ---", file=out)
    print(result.sample, file=out)
    return result
