"""`mt distill TEACHER_RUN --data DIR --out DIR2`: sequence-level knowledge distillation (Kim &
Rush 2016). The teacher translates the training sources with beam search, and its
translations replace the training targets: a corpus in DIR2 that any config can train on (the
non-autoregressive model learns from such a corpus far better than from the references,
Gu et al. 2018). The valid and test splits are copied unchanged, so scores stay against the
real references."""

from __future__ import annotations

import shutil
from pathlib import Path

from mt.artifacts import checkpoint
from mt.data.corpus import SPLITS, has_split, read_lines, split_paths
from mt.errors import MTError
from mt.outputs import check_folder_creatable, write_text


def distill(
    teacher: Path,
    data: Path,
    out: Path,
    beam: int | None = None,
    device: str = "auto",
    force: bool = False,
    log=print,
) -> int:
    """Write DIR2/{train,valid,test}.{src,tgt}; returns the number of training pairs."""
    from mt.decode.translator import Translator

    run = checkpoint.open_trained(teacher)
    d = run.config.data
    if not has_split(data, "train", d.src_lang, d.tgt_lang):
        src, tgt = split_paths(data, "train", d.src_lang, d.tgt_lang)
        raise MTError(
            f"--data {data}: no {src.name} and {tgt.name} (the teacher translates "
            f"{d.src_lang} -> {d.tgt_lang})"
        )
    if Path(out).resolve() == Path(data).resolve():
        raise MTError("--out must be another folder than --data: the references are kept")
    targets = [p for split in SPLITS for p in split_paths(out, split, d.src_lang, d.tgt_lang)]
    existing = [p for p in targets if p.exists()]
    if existing and not force:
        raise MTError(
            f"{existing[0]} already exists; pass --force to overwrite it or choose another --out"
        )
    check_folder_creatable(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    src_path, _ = split_paths(data, "train", d.src_lang, d.tgt_lang)
    sources = read_lines(src_path)
    translator = Translator.from_trained(run, device)
    log(
        translator.describe([run.path or teacher], translator.options(beam=beam))
        + f" ({len(sources):,} training sources)"
    )
    hyps = translator.translate(sources, beam=beam, progress=True)
    new_src, new_tgt = split_paths(out, "train", d.src_lang, d.tgt_lang)
    write_text(new_src, "".join(s + "\n" for s in sources))
    write_text(new_tgt, "".join(h + "\n" for h in hyps))
    for split in ("valid", "test"):
        if has_split(data, split, d.src_lang, d.tgt_lang):
            for a, b in zip(
                split_paths(data, split, d.src_lang, d.tgt_lang),
                split_paths(out, split, d.src_lang, d.tgt_lang),
                strict=True,
            ):
                shutil.copyfile(a, b)
    return len(sources)
