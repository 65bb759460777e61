"""The ``demo`` command: a character-level LSTM trained on the package's own sources (or a
given file) whose loss falls, with progress output and generated text."""

import io
import subprocess
import sys

import numpy as np
import pytest

from ferrocaffe import __main__ as cli
from ferrocaffe import char_rnn, core, workspace


@pytest.fixture(autouse=True)
def fresh():
    core.Net._net_names_used = set()
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


SMALL = dict(hidden_size=32, seq_length=16, batch_size=8, sample_length=40)


def test_package_corpus_is_the_packages_own_text():
    text = char_rnn.package_corpus()
    assert len(text) > 50_000
    assert "def package_corpus" in text  # this very module is part of it
    assert "RecurrentNetwork" in text


def test_training_loss_falls_and_text_is_generated():
    out, err = io.StringIO(), io.StringIO()
    result = char_rnn.run(char_rnn.Config(iterations=120, **SMALL), out=out, err=err)
    losses = np.array(result.losses)
    assert len(losses) == 120
    assert np.isfinite(losses).all()
    first, last = losses[:15].mean(), losses[-15:].mean()
    # From about log(vocabulary) down by a clear margin.
    assert first > 3.0
    assert last < first - 0.8, (first, last)
    assert result.chars_per_second > 0
    assert len(result.sample) == len("def ") + 40
    assert set(result.sample) <= set(char_rnn.package_corpus())
    printed = out.getvalue()
    assert "iteration   120" in printed and "generated text" in printed
    assert "loss" in printed and "chars/s" in printed


def test_cli_demo_on_a_given_corpus(tmp_path, capsys):
    corpus = tmp_path / "abc.txt"
    corpus.write_text("abcabcabd " * 400)
    code = cli.main(
        [
            "demo",
            "--corpus",
            str(corpus),
            "--iterations",
            "60",
            "--hidden-size",
            "16",
            "--seq-length",
            "8",
            "--batch-size",
            "4",
            "--threads",
            "2",
            "--sample-length",
            "20",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert f"char-RNN on {corpus}" in printed
    assert "vocabulary 5" in printed
    curve = [
        float(line.split("loss")[1].split()[0])
        for line in printed.splitlines()
        if line.startswith("iteration")
    ]
    assert curve[-1] < curve[0] - 0.5, curve
    sample = printed.split("--- generated text ---")[1].strip()
    assert set(sample) <= set("abcd ") | set("def")


def test_cli_demo_rejects_bad_input(tmp_path, capsys):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("ab")
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--corpus", str(tiny)])
    assert e.value.code == 2
    assert "needs more than" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--corpus", str(tmp_path / "missing.txt")])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--iterations", "0"])
    assert e.value.code == 2


def test_python_dash_m_demo_help():
    proc = subprocess.run(
        [sys.executable, "-m", "ferrocaffe", "demo", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0
    for option in (
        "--hidden-size",
        "--seq-length",
        "--batch-size",
        "--iterations",
        "--threads",
        "--corpus",
    ):
        assert option in proc.stdout


def test_time_limit_stops_training_early():
    out = io.StringIO()
    cfg = char_rnn.Config(iterations=100_000, max_seconds=0.5, **SMALL)
    result = char_rnn.run(cfg, out=out, err=io.StringIO())
    assert 1 <= len(result.losses) < 100_000
    assert result.seconds < 30
    assert "time limit of 0.5 s" in out.getvalue()
