"""What a user sees and does while a run trains: how long it will take on this machine, and
Ctrl-C (once: stop after this update and save; twice: stop now, saying what was lost)."""

from __future__ import annotations

import signal
import sys
import time
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


def compiles_so_far() -> int:
    """The graphs torch.compile has made in this process (0 where nothing imported it)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else int(utils.counters["stats"]["unique_graphs"])


class Forecast:
    """How long the run will take at its steady rate: measured over a window that opens
    WARMUP_STEPS updates after the start or after the last compile (torch.compile's graphs
    are made, and CUDA graphs recorded, in the first updates of a shape; a compile opens the
    window again), closed by a device sync at both ends (a GPU's host runs ahead of it). The
    first forecast comes once the window holds MEASURE_STEPS updates and MEASURE_SECONDS
    seconds, later ones at every log line. Validations are left out of the window (told by
    `validated`: the first one compiles the decoder on a GPU) and counted apart: the budget
    pays one every `valid_every` updates, at the latest one's time. clock: seconds (tests give
    their own); sync: waits for the device; compiles: the count of compiled graphs so far."""

    WARMUP_STEPS, MEASURE_STEPS, MEASURE_SECONDS = 3, 5, 5.0

    def __init__(
        self,
        step: int,
        clock=time.perf_counter,
        sync=None,
        compiles=compiles_so_far,
        valid_every: int = 0,
    ):
        self.clock, self.sync, self.compiles = clock, sync or (lambda: None), compiles
        self.seen, self.valid_every = compiles(), valid_every
        self.began = clock()
        self.warmup_seconds = 0.0  # from the start to the window's opening (compiles included)
        self.quiet_since = step  # the step of the last compile seen, or the start
        self.window: tuple[int, float] | None = None  # (step, clock) where the rate is measured
        self.left_out = 0.0  # the validations' seconds inside the window
        self.validations: list[float] = []  # each validation's seconds
        self.done = False  # whether the first forecast was made
        self.sec_per_step, self.now_step, self.end_step = 0.0, step, step

    def validated(self, seconds: float) -> None:
        """A validation took `seconds` (of the clock's) since the last update."""
        self.validations.append(seconds)
        self.left_out += seconds

    def update(
        self, step: int, seconds: float, max_steps: int, budget: float, revise: bool = False
    ) -> int | None:
        """After each update: the step the run will end at, when a forecast is due (the first
        once the window is long enough; later ones where `revise`: at a log line); else None.
        seconds: the training time the budget (`budget` seconds; 0: none) counts so far."""
        count = self.compiles()
        if count != self.seen:  # this update compiled: what came before was warm-up
            self.seen, self.quiet_since, self.window = count, step, None
            return None
        if self.window is None:
            if step - self.quiet_since >= self.WARMUP_STEPS:
                self.sync()
                self.window, self.left_out = (step, self.clock()), 0.0
                if not self.done:
                    self.warmup_seconds = self.window[1] - self.began
            return None
        if self.done and not revise:
            return None
        start, opened = self.window
        if step - start < self.MEASURE_STEPS or self.clock() - opened < self.MEASURE_SECONDS:
            return None
        self.sync()
        self.done = True
        steady = (self.clock() - opened - self.left_out) / (step - start)
        return self._end(step, seconds, steady, max_steps, budget)

    def _end(
        self, step: int, seconds: float, sec_per_step: float, max_steps: int, budget: float
    ) -> int:
        self.sec_per_step, self.now_step = sec_per_step, step
        end = max_steps
        if budget > 0:  # (the budget's clock runs through validations too)
            spent = sec_per_step + self._validation_per_step()
            end = min(max_steps, step + int(max(0.0, budget - seconds) / spent))
        self.end_step = max(end, step)
        return self.end_step

    def _validation_per_step(self) -> float:
        """A validation's seconds (the latest: the first compiles) spread over its updates."""
        return (
            self.validations[-1] / self.valid_every
            if self.validations and self.valid_every
            else 0.0
        )

    def describe(self, max_steps: int, max_minutes: float) -> str:
        left = (self.end_step - self.now_step) * self.sec_per_step
        rate = (
            f"{self.sec_per_step:.2f} s per update"
            if self.sec_per_step >= 0.1
            else f"{1 / self.sec_per_step:.0f} updates/s"
        )
        warm = (
            f" after {self.warmup_seconds:.0f} s of compiling and warm-up"
            if self.warmup_seconds >= 1
            else ""
        )
        msg = f"{rate} on this machine{warm}: {_duration(left)} of training left"
        if self.validations:
            msg += f" (a validation: {self.validations[-1]:.1f} s)"
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
    the (loss sum, NLL sum, tokens) of the update just made (mt/train/update/exchange.py)."""
    if st.step < cfg.log_every and st.step % max(1, min(10, cfg.log_every)) == 0:
        loss, _, tokens = last_update.tolist()
        if tokens:  # (0: skipped on the device)
            bar.set_postfix(loss=round(loss / tokens, 3))
    first = not forecast.done
    end_step = forecast.update(
        st.step, st.train_seconds, cfg.max_steps, 60 * cfg.max_minutes, st.step % cfg.log_every == 0
    )
    if end_step is not None and first:  # (revisions move the bar alone)
        say(forecast.describe(cfg.max_steps, cfg.max_minutes))
        short = forecast.shortfall(cfg.max_steps, cfg.max_minutes, cfg.expected_steps)
        if short:
            say(short)
    if end_step is not None and end_step != bar.total:
        bar.total = end_step  # a time budget ends the bar (and its ETA) earlier
        bar.refresh()


def done_message(run_dir, st, cfg) -> str:
    """What a re-run of a run that ended (its end ran, its budget is spent) says: it trains
    nothing and leaves its checkpoints as they were; how to let it go on. cfg: the train
    section."""
    if st.step >= cfg.max_steps:
        why, more = f"train.max_steps {cfg.max_steps:,}", f"train.max_steps={st.step * 2}"
    else:
        minutes = st.train_seconds / 60
        why = f"train.max_minutes {cfg.max_minutes:g}, {minutes:.0f} minutes trained"
        more = f"train.max_minutes={2 * cfg.max_minutes:g}"
    return (
        f"{run_dir} is done: it ended at step {st.step:,} ({why}) and its end ran "
        f"(validation, averaging, tuning); nothing was trained, its checkpoints are as they "
        f"were. To train on: --set {more} (a higher budget resumes it)"
    )
