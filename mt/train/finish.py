"""The end of a run, after its last update: a final validation if none was made, last.pt,
the average of the last snapshots (kept as best.pt when better), decoding tuned on the valid
split with best.pt's weights, the training picture, and what the user should know."""

from __future__ import annotations

from mt.artifacts import checkpoint
from mt.evaluate.metrics import score
from mt.runtime.memory import release_free_memory


def finish_run(trainer, rank_rng: list[dict]) -> None:
    """Rank 0's end-of-run work (the trainer's counters and last save are up to date)."""
    st = trainer.state
    if trainer.validation is None:  # an encoder objective: its weights alone
        if trainer.last_save_step != st.step:
            trainer.save("last.pt", rank_rng)
        return
    if trainer.last_valid_step != st.step and st.best_bleu < 0 and not trainer.stop_signal:
        trainer.validate()
        trainer.last_save_step = -1
    if trainer.last_save_step != st.step:  # not twice in a row: last.pt.prev stays an older state
        trainer.save("last.pt", rank_rng)
    if not trainer.stop_signal and trainer.cfg.average_last:
        if checkpoint.snapshots(trainer.run_dir)[-1:] != [trainer.run_dir / f"step_{st.step}.pt"]:
            trainer.save_snapshot()
        rec = average_snapshots(trainer)
        if rec:
            trainer.say(
                f"average of the last {rec['averaged']} snapshots: valid BLEU "
                f"{rec['valid_bleu']}" + (" (best)" if rec.get("best") else "")
            )
    d = trainer.validation.decode
    asks = d.tune_nat_length_beams if trainer.translator().non_autoregressive else d.tune_beams
    if not trainer.stop_signal and asks and st.best_bleu >= 0:
        tune_best_in_memory(trainer)
    draw_training_picture(trainer.run_dir, trainer.say)
    if st.fp16_skipped:
        trainer.say(
            f"note: the fp16 loss scaler skipped {st.fp16_skipped} update(s) with "
            f"overflowing gradients (not counted as steps)"
        )
    if st.oom_skipped:
        trainer.say(
            f"warning: {st.oom_skipped} batch(es) were skipped after running out of "
            f"memory; lower train.max_tokens to use them"
        )


def draw_training_picture(run_dir, say) -> None:
    """RUN_DIR/training.png, redrawn after every validation; a picture never stops a run."""
    from mt.evaluate.plot import plot_run

    try:
        plot_run(run_dir)
    except Exception as e:
        say(f"warning: could not draw training.png ({e})")


def with_weights(trainer, weights: dict, work):
    """work() with the model holding `weights`, its own weights back afterwards."""
    current = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.model.load_state_dict(weights)
    try:
        trainer.model.eval()
        return work()
    finally:
        trainer.model.load_state_dict(current)


def average_snapshots(trainer) -> dict | None:
    """Average the last `average_last` snapshots into averaged.pt, validate it, and make it
    best.pt when its validation BLEU beats the best single checkpoint."""
    paths = checkpoint.snapshots(trainer.run_dir)[-trainer.cfg.average_last :]
    if trainer.cfg.average_last < 2 or len(paths) < 2:
        return None
    averaged = checkpoint.average(paths)
    checkpoint.atomic_save(averaged, trainer.run_dir / "averaged.pt")
    v = trainer.validation
    s = with_weights(
        trainer,
        checkpoint.weights_of(averaged),
        lambda: score(trainer.translator().translate(v.src, beam=v.beam), v.refs),
    )
    record = {
        "step": trainer.state.step,
        "averaged": len(paths),
        "valid_bleu": round(s.bleu, 2),
        "valid_chrf": round(s.chrf, 2),
    }
    if s.bleu > trainer.state.best_bleu:
        trainer.state.best_bleu = s.bleu
        checkpoint.set_train_state(averaged, trainer.state.state_dict())
        checkpoint.atomic_save(averaged, trainer.run_dir / "best.pt")
        record["best"] = True
    trainer.write_log(record)
    return record


def tune_best_in_memory(trainer) -> None:
    """The decode.tune_* grid (decoding_grid) on the valid split with best.pt's weights in the
    training model (best.pt read once), the winner stored in best.pt."""
    from mt.evaluate.tuning import decoding_grid, describe_settings, tune_decoding

    d, v = trainer.validation.decode, trainer.validation
    release_free_memory()
    path = trainer.run_dir / "best.pt"
    ckpt = checkpoint.load(path)

    def tune():
        translator = trainer.translator()
        grid = decoding_grid(
            translator,
            d.tune_beams,
            d.tune_length_penalties,
            d.tune_nat_length_beams,
            d.tune_nat_iterations,
        )
        return tune_decoding(translator, v.src, v.refs, grid)

    rec = with_weights(trainer, checkpoint.weights_of(ckpt), tune)
    best = rec["tuned_decoding"]
    checkpoint.set_decoding(ckpt, best)
    checkpoint.atomic_save(ckpt, path)
    trainer.write_log({"step": trainer.state.step, **rec})
    trainer.say(
        f"decoding tuned on valid: {describe_settings(best)} (BLEU {best['valid_bleu']}), "
        f"stored in best.pt"
    )
