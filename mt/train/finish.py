"""The end of a run, after its last update: a final validation if none was made, last.pt,
the average of the last snapshots (kept as best.pt when better), decoding tuned on the valid
split with best.pt's weights, the training picture, and what the user should know."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from mt.artifacts import checkpoint
from mt.artifacts.average import average
from mt.runtime.memory import release_free_memory
from mt.train.saving import Checkpoints
from mt.train.state import TrainState
from mt.train.validation import Validator


class RunEnd:
    """Rank 0's work at the end of a run. validator: None for an objective that does not
    translate; average_last: how many snapshots are averaged (train.average_last); say: a
    line for the user; write_log: a record for train_log.jsonl."""

    def __init__(
        self,
        run_dir: Path,
        checkpoints: Checkpoints,
        validator: Validator | None,
        average_last: int,
        say: Callable[[str], None],
        write_log: Callable[[dict], None],
    ):
        self.run_dir, self.checkpoints, self.validator = run_dir, checkpoints, validator
        self.average_last = average_last
        self.say, self.write_log = say, write_log

    def finish(self, st: TrainState, rank_rng: list[dict], stopped: bool, validated: bool):
        """st: the run's counters, settled; stopped: a signal ended the run (then only what
        keeps it resumable is done); validated: the last update was validated."""
        if self.validator is not None and not validated and st.best_bleu < 0 and not stopped:
            self.validator.validate(st)
        # not twice in a row (last.pt.prev stays an older state), but again after anything
        # that changed the counters it holds
        if not self.checkpoints.holds(st):
            self.checkpoints.save("last.pt", st, rank_rng)
        if self.validator is None:  # an encoder objective: its weights alone
            return
        if not stopped and self.average_last:
            if checkpoint.snapshots(self.run_dir)[-1:] != [self.run_dir / f"step_{st.step}.pt"]:
                self.checkpoints.save_snapshot(st)
            rec = self.average_snapshots(st)
            if rec:
                self.say(
                    f"average of the last {rec['averaged']} snapshots: valid BLEU "
                    f"{rec['valid_bleu']}" + (" (best)" if rec.get("best") else "")
                )
        d = self.validator.validation.decode
        nat = self.validator.translator().non_autoregressive
        asks = d.tune_nat_length_beams if nat else d.tune_beams
        if not stopped and asks and st.best_bleu >= 0:
            self.tune_best(st)
        draw_training_picture(self.run_dir, self.say, wait=True)
        if not stopped:  # (last.pt says so: a re-run of the same budget does nothing)
            st.finished = True
            self.checkpoints.save("last.pt", st, rank_rng)
        if st.fp16_skipped:
            self.say(
                f"note: the fp16 loss scaler skipped {st.fp16_skipped} update(s) with "
                f"overflowing gradients (not counted as steps)"
            )
        if st.oom_skipped:
            self.say(
                f"warning: {st.oom_skipped} batch(es) were skipped after running out of "
                f"memory; lower train.max_tokens to use them"
            )

    def average_snapshots(self, st: TrainState) -> dict | None:
        """Average the last `average_last` snapshots into averaged.pt, validate it, and make it
        best.pt when its validation BLEU beats the best single checkpoint."""
        assert self.validator is not None
        self.checkpoints.wait()  # (the last snapshot may still be being written)
        paths = checkpoint.snapshots(self.run_dir)[-self.average_last :]
        if self.average_last < 2 or len(paths) < 2:
            return None
        averaged = average(paths)
        checkpoint.atomic_save(averaged, self.run_dir / "averaged.pt")
        bleu, chrf = self.validator.bleu_with(checkpoint.weights_of(averaged))
        record = {
            "step": st.step,
            "averaged": len(paths),
            "valid_bleu": round(bleu, 2),
            "valid_chrf": round(chrf, 2),
        }
        if bleu > st.best_bleu:
            st.best_bleu = bleu
            checkpoint.set_train_state(averaged, st.state_dict())
            checkpoint.atomic_save(averaged, self.run_dir / "best.pt")
            record["best"] = True
        self.write_log(record)
        return record

    def tune_best(self, st: TrainState) -> None:
        """The decode.tune_* grid (decoding_grid) on the valid split with best.pt's weights in
        the training model (best.pt read once), the winner stored in best.pt."""
        from mt.evaluate.tuning import decoding_grid, describe_settings, tune_decoding
        from mt.train.validation import with_weights

        validator = self.validator
        assert validator is not None
        v, d = validator.validation, validator.validation.decode
        release_free_memory()
        self.checkpoints.wait()
        path = self.run_dir / "best.pt"
        ckpt = checkpoint.load(path)

        def tune():
            translator = validator.translator()
            grid = decoding_grid(
                translator,
                d.tune_beams,
                d.tune_length_penalties,
                d.tune_nat_length_beams,
                d.tune_nat_iterations,
            )
            return tune_decoding(translator, v.src, grid, lambda h: validator.criterion(h)[0])

        rec = with_weights(validator.model, checkpoint.weights_of(ckpt), tune)
        best = rec["tuned_decoding"]
        checkpoint.set_decoding(ckpt, best)
        checkpoint.atomic_save(ckpt, path)
        self.write_log({"step": st.step, **rec})
        self.say(
            f"decoding tuned on valid: {describe_settings(best)} (BLEU {best['valid_bleu']}), "
            f"stored in best.pt"
        )


_DRAWING: dict[str, threading.Thread] = {}  # each run directory's drawing under way


def draw_training_picture(run_dir, say, wait: bool = False) -> None:
    """RUN_DIR/training.png, redrawn after every validation on a thread of its own, so that
    matplotlib's seconds stay off the training step (a validation that finds a drawing under
    way leaves its points to the next one), and drawn once more at the run's end (`wait`: in
    the caller, after the drawing under way). A picture never stops a run."""
    under_way = _DRAWING.get(str(run_dir))
    if wait:
        if under_way is not None:
            under_way.join()
        _draw(run_dir, say)
    elif under_way is None or not under_way.is_alive():
        thread = threading.Thread(target=_draw, args=(run_dir, say), name="training.png")
        thread.daemon = True  # (the run's end draws the last picture itself)
        _DRAWING[str(run_dir)] = thread
        thread.start()


def _draw(run_dir, say) -> None:
    from mt.evaluate.plot import plot_run

    try:
        plot_run(run_dir)
    except Exception as e:
        say(f"warning: could not draw training.png ({e})")
