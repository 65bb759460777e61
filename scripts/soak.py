"""Soak test: trains the demo model (``python -m ferrocaffe demo``'s char-RNN) for many
iterations and reports how much resident memory grew after warm-up.

    python scripts/soak.py [--iterations N] [--warmup W] [--hidden-size H] ...

Prints VmRSS (from /proc/self/status) after the warm-up iterations, every tenth of the run,
and at the end; the last line is ``rss growth X% over N iterations`` (growth from the
warm-up figure to the final one, over the N iterations that followed the warm-up).
"""

from __future__ import annotations

import argparse
import gc
import sys

from ferrocaffe.char_rnn import CharRNN, Config, package_corpus


def rss_kib() -> int:
    """Resident memory of this process in KiB (``VmRSS`` of /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS line in /proc/self/status (Linux only)")


def main(argv: list[str] | None = None) -> int:
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=10000, help="measured iterations")
    p.add_argument("--warmup", type=int, default=200, help="iterations before the baseline")
    p.add_argument("--hidden-size", type=int, default=d.hidden_size)
    p.add_argument("--seq-length", type=int, default=d.seq_length)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--threads", type=int, default=d.threads)
    a = p.parse_args(argv)
    if a.iterations < 1 or a.warmup < 1:
        p.error("--iterations and --warmup must be at least 1")

    config = Config(
        hidden_size=a.hidden_size,
        seq_length=a.seq_length,
        batch_size=a.batch_size,
        iterations=a.warmup + a.iterations,
        threads=a.threads,
        max_seconds=0,  # no time limit: every iteration runs
    )
    model = CharRNN(package_corpus(), config)
    total = config.iterations
    marks = {a.warmup + round(a.iterations * k / 10) for k in range(1, 10)}
    state = {"baseline": None}

    def progress(it: int, loss: float, cps: float) -> None:
        if it == a.warmup:
            gc.collect()
            state["baseline"] = rss_kib()
            print(f"after {it} warm-up iterations: rss {state['baseline'] / 1024:.1f} MiB")
        elif it in marks:
            print(
                f"iteration {it - a.warmup}/{a.iterations}: rss {rss_kib() / 1024:.1f} MiB, "
                f"loss {loss:.3f}, {cps:,.0f} chars/s"
            )
        sys.stdout.flush()

    result = model.train(progress)
    if len(result.losses) != total:
        print(f"error: {len(result.losses)} of {total} iterations ran", file=sys.stderr)
        return 1
    gc.collect()
    end = rss_kib()
    base = state["baseline"]
    print(f"after {a.iterations} more iterations: rss {end / 1024:.1f} MiB")
    print(f"rss growth {100.0 * (end - base) / base:.2f}% over {a.iterations} iterations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
