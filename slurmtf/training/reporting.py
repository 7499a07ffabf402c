"""Per-rank log files, chief-only human progress (event lines: :mod:`slurmtf.events`)."""

from __future__ import annotations

import logging as std_logging
import sys
import time
from pathlib import Path

from absl import logging

from slurmtf.contracts import format_seconds


def setup_logging(rank: int, is_chief: bool, log_dir: str | None, all_ranks: bool) -> str | None:
    """Every rank logs INFO to ``<log_dir>/rank<N>.log``; only the chief logs INFO to stderr.

    Called once by the model entry point: it owns the ``absl`` logger's handlers.
    """
    logger = std_logging.getLogger("absl")
    logger.setLevel(std_logging.INFO)
    logger.propagate = False
    for old in list(logger.handlers):
        if getattr(old, "_slurmtf", False):
            logger.removeHandler(old)
            old.close()
    fmt = std_logging.Formatter(
        f"%(asctime)s rank{rank} %(levelname).1s %(message)s", datefmt="%H:%M:%S"
    )
    console = std_logging.StreamHandler(sys.stderr)
    console.setLevel(std_logging.INFO if (is_chief or all_ranks) else std_logging.WARNING)
    handlers: list[std_logging.Handler] = [console]
    path = None
    if log_dir:
        path = Path(log_dir) / f"rank{rank}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        file_handler = std_logging.FileHandler(path)
        file_handler.setLevel(std_logging.INFO)
        handlers.append(file_handler)
    for handler in handlers:
        handler.setFormatter(fmt)
        handler._slurmtf = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    return None if path is None else str(path)


class Progress:
    """Step, loss, accuracy, examples/s and ETA every ``every`` steps."""

    def __init__(self, total_steps: int, global_batch: int, every: int, start_step: int) -> None:
        self.total = total_steps
        self.batch = global_batch
        self.every = every
        self._t0 = time.monotonic()
        self._last_time = self._t0
        self._last_step = start_step
        self._loss = 0.0
        self._correct = 0.0
        self._count = 0

    def update(self, loss: float, accuracy: float) -> None:
        self._loss += loss
        self._correct += accuracy
        self._count += 1

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.total

    def report(self, step: int) -> dict[str, float]:
        """Log the interval's averages and reset them; returns the numbers logged."""
        now = time.monotonic()
        steps = max(step - self._last_step, 1)
        rate = steps * self.batch / max(now - self._last_time, 1e-9)
        eta = (self.total - step) * (now - self._last_time) / steps
        n = max(self._count, 1)
        values = {
            "loss": self._loss / n,
            "accuracy": self._correct / n,
            "examples_per_sec": rate,
        }
        logging.info(
            "step %d/%d loss %.4f accuracy %.4f %.1f examples/s ETA %s",
            step,
            self.total,
            values["loss"],
            values["accuracy"],
            rate,
            format_seconds(eta),
        )
        self._last_time, self._last_step = now, step
        self._loss, self._correct, self._count = 0.0, 0.0, 0
        return values
