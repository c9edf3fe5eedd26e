"""What a user sees and does while a run trains: how long it will take on this machine, and
Ctrl-C (once: stop after this update and save; twice: stop now, saying what was lost)."""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager

from mt.errors import Interrupted


@contextmanager
def stop_on_signal(on_signal, lost_work):
    """SIGINT/SIGTERM call on_signal(signum) (the loop stops after the current update and
    saves); a second Ctrl-C raises Interrupted(lost_work()) at once."""

    def handler(signum, frame):
        on_signal(signum)
        signal.signal(signal.SIGINT, second)
        sys.stderr.write(
            f"\n{signal.Signals(signum).name}: stopping after this update and "
            f"saving last.pt (Ctrl-C again to stop at once, losing it)\n"
        )
        sys.stderr.flush()

    def second(signum, frame):
        raise Interrupted(lost_work())

    try:
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: no signal handling
        old = {}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def lost_work_message(step: int, saved_step: int) -> str:
    resume = "run the same command again to resume from last.pt"
    if saved_step == step:
        return f"interrupted twice at step {step}, after last.pt was saved: {resume}"
    since = (
        f"since the last save (step {saved_step}, last.pt)"
        if saved_step >= 0
        else "since this run started or resumed"
    )
    return (
        f"interrupted twice at step {step}: stopped without saving; the updates {since} "
        f"are lost; {resume} (one Ctrl-C saves before stopping)"
    )


class Forecast:
    """How long the run will take, from the speed of its first updates in this process."""

    MEASURE_STEPS, MEASURE_SECONDS = 5, 10.0

    def __init__(self, step: int, seconds: float):
        self.start_step, self.start_seconds, self.done = step, seconds, False
        self.sec_per_step = 0.0

    def update(self, step: int, seconds: float, max_steps: int, budget: float) -> int | None:
        """The step the run will end at, once (when enough has been measured); else None."""
        steps, elapsed = step - self.start_step, seconds - self.start_seconds
        if self.done or steps < self.MEASURE_STEPS or elapsed < self.MEASURE_SECONDS:
            return None
        self.done = True
        return self._end(step, seconds, elapsed / steps, max_steps, budget)

    def revise(self, step: int, seconds: float, max_steps: int, budget: float) -> int | None:
        """The end step again, from the speed since the last forecast (validations included,
        which the time budget counts too); None before the first forecast. On a GPU the first
        updates ran about 5 times slower than later ones (docs/gpu.md), so a forecast made from
        them alone would end the progress bar thousands of steps early."""
        if not self.done or step <= self.now_step or seconds <= self.now_seconds:
            return None
        return self._end(
            step, seconds, (seconds - self.now_seconds) / (step - self.now_step), max_steps, budget
        )

    def _end(
        self, step: int, seconds: float, sec_per_step: float, max_steps: int, budget: float
    ) -> int:
        self.sec_per_step = sec_per_step
        self.now_step, self.now_seconds = step, seconds
        end = max_steps
        if budget > 0:
            end = min(max_steps, step + int(max(0.0, budget - seconds) / sec_per_step))
        self.end_step = max(end, step)
        return self.end_step

    def describe(self, max_steps: int, max_minutes: float) -> str:
        left = (self.end_step - self.now_step) * self.sec_per_step
        msg = (
            f"{self.sec_per_step:.2f} s per update on this machine: "
            f"{_duration(left)} of training left"
        )
        if self.end_step < max_steps:
            msg += (
                f"; the {max_minutes:g}-minute budget (train.max_minutes) stops it near "
                f"step {self.end_step:,} of {max_steps:,}"
            )
        else:
            msg += f" to step {max_steps:,}"
        return msg + ", plus validation"

    def shortfall(self, max_steps: int, max_minutes: float, expected_steps: int) -> str | None:
        """A warning when the time budget will stop the run well short (under 80%) of the
        updates the config's results came from (train.expected_steps); else None."""
        if not (self.done and expected_steps) or self.end_step >= min(
            max_steps, 0.8 * expected_steps
        ):
            return None
        left = (expected_steps - self.now_step) * self.sec_per_step
        return (
            f"warning: at this speed the {max_minutes:g}-minute budget ends near step "
            f"{self.end_step:,}, far short of the {expected_steps:,} updates this config's "
            f"results came from: expect a clearly lower BLEU. Give it a free core (is another "
            f"training or test run sharing this machine?) or a GPU, or train them all with "
            f"--set train.max_minutes=0 train.max_steps={expected_steps} (about "
            f"{_duration(left)} more at this speed)"
        )


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 1:
        return f"{int(seconds)} s"
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def show_progress(bar, st, cfg, forecast: Forecast, last_update, say) -> None:
    """After each update, on the tqdm `bar`: the first updates show their loss at once
    (log_every may be hundreds of steps away), and after a few seconds of steps the run says
    how long it will take (`say`). st: the TrainState; cfg: the train config; last_update:
    the (loss sum, NLL sum, tokens) of the update just made (mt/train/exchange.py)."""
    if st.step < cfg.log_every and st.step % max(1, min(10, cfg.log_every)) == 0:
        loss, _, tokens = last_update.tolist()
        if tokens:  # (0: skipped on the device)
            bar.set_postfix(loss=round(loss / tokens, 3))
    end_step = forecast.update(st.step, st.train_seconds, cfg.max_steps, 60 * cfg.max_minutes)
    if end_step is not None:
        say(forecast.describe(cfg.max_steps, cfg.max_minutes))
        short = forecast.shortfall(cfg.max_steps, cfg.max_minutes, cfg.expected_steps)
        if short:
            say(short)
    elif st.step % cfg.valid_every == 0:
        # silently, from the speed since: the first updates can be unrepresentative
        end_step = forecast.revise(st.step, st.train_seconds, cfg.max_steps, 60 * cfg.max_minutes)
    if end_step is not None and end_step != bar.total:
        bar.total = end_step  # a time budget ends the bar (and its ETA) earlier
        bar.refresh()
