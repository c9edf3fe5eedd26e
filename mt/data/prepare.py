"""The one entry point from a run's data config and run directory to the data it trains on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mt.config import Config
from mt.data import token_cache
from mt.data.batching import epoch_seed
from mt.data.corpus import (
    ParallelData,
    Stats,
    clean_pairs,
    drop_empty,
    encode_pairs,
    encode_stream,
    has_split,
    iter_parallel,
    read_parallel,
    sample_pairs,
    split_paths,
)
from mt.data.download import download, downloaded_into, is_empty_folder
from mt.data.tokenizer import Tokenizer
from mt.errors import MTError


def prepare_data(
    cfg: Config,
    run_dir: Path,
    dist,
    log,
    bpe_dropout: float = 0.0,
    inherited: Callable[[], Tokenizer | None] | None = None,
    saved: Callable[[str], Tokenizer | None] | None = None,
):
    """From the data config and the run directory to what training reads: the corpus fetched
    if the config names one and data.dir has none (rank 0), the run's BPE model (trained by
    rank 0 the first time), the training split as token ids, and the valid split as text and
    token ids. Returns (tokenizer, train data, (valid sources, valid references, valid data)).
    bpe_dropout > 0: the training data is epoch 0's BPE-dropout segmentation (the plain one is
    never trained on), so the logged counts are those of what the first epoch walks.
    inherited() -> the BPE model a new run adopts instead of training its own (that of a
    pretrained encoder, model.init_encoder), or None; saved(why) -> the BPE model a run's
    checkpoint holds, written again into the run directory when its own file is missing or
    damaged (why), or None."""
    if dist.is_main:  # one rank downloads and trains BPE; the others wait, then read
        ensure_data(cfg, log)
    dist.wait_for_main()
    d = cfg.data
    train_stats, valid_stats = Stats(), Stats()
    train_paths = split_paths(d.dir, "train", d.src_lang, d.tgt_lang)
    vsrc, vtgt = drop_empty(
        *read_parallel(*split_paths(d.dir, "valid", d.src_lang, d.tgt_lang)), valid_stats
    )
    if not vsrc:
        raise MTError(f"{d.dir}: the valid split has no non-empty pairs")
    if dist.is_main:
        load_tokenizer(cfg, run_dir, train_paths, log, inherited, saved)
    dist.wait_for_main()
    tokenizer = load_tokenizer(cfg, run_dir, train_paths, log, saved=saved)
    if bpe_dropout == 0 and token_cache.wanted(d.token_cache, train_paths):
        train_data = cached_train(cfg, tokenizer, train_paths, dist, log)
        train_stats = train_data.stats
    else:
        train_data = encode_train(cfg, tokenizer, train_stats, bpe_dropout, epoch=0)
    valid_data = encode_pairs(vsrc, vtgt, tokenizer, cfg.max_side_len, valid_stats)
    log(train_stats.describe("train"))
    log(valid_stats.describe("valid"))
    return tokenizer, train_data, (vsrc, vtgt, valid_data)


def encode_train(
    cfg: Config, tokenizer: Tokenizer, stats: Stats, bpe_dropout: float, epoch: int
) -> ParallelData:
    """The training split as token ids, streamed from disk (text is never held whole, only
    its ids); bpe_dropout > 0: the segmentation of `epoch`, seeded by train.seed and the epoch
    alone, so every rank and a resumed run get the same one."""
    d = cfg.data
    paths = split_paths(d.dir, "train", d.src_lang, d.tgt_lang)
    if bpe_dropout > 0:
        tokenizer.seed_dropout(epoch_seed(cfg.train.seed, epoch))
    data = encode_stream(
        clean_pairs(iter_parallel(*paths), stats), tokenizer, d.max_len, stats, dropout=bpe_dropout
    )
    if not len(data.src):
        why = (
            f"with train.bpe_dropout={bpe_dropout} no training pair fits data.max_len="
            f"{d.max_len}; raise data.max_len"
            if bpe_dropout > 0
            else f"no training pair left (empty, or longer than data.max_len={d.max_len})"
        )
        raise MTError(f"{paths[0]}: {why}")
    return data


def cached_train(cfg: Config, tokenizer: Tokenizer, paths, dist, log) -> ParallelData:
    """The training split's ids from the token cache (mt.data.token_cache): the first rank of
    each machine (local rank 0) encodes and writes them into that machine's cache folder the
    first time (into a shared MT_CACHE_DIR, a second machine's copy of the same key loses the
    race harmlessly), then every rank memory-maps its machine's files."""
    models = [tokenizer.src_model] + ([] if tokenizer.joint else [tokenizer.tgt_model])
    models += [] if tokenizer.vocab is None else [tokenizer.vocab.to_json()]
    folder = token_cache.folder_for(token_cache.cache_key(paths, models, cfg.data.max_len))
    encoded = None
    if dist.local_rank == 0 and token_cache.load(folder) is None:
        log(f"writing the training split's token ids to the cache {folder}")
        encoded = encode_train(cfg, tokenizer, Stats(), 0.0, epoch=0)
        try:
            token_cache.save(folder, encoded)
        except OSError as e:  # (a full disk, a read-only cache folder: the cache is a saving)
            log(
                f"warning: could not write the token cache {folder} ({e.strerror or e}); "
                f"training on the ids in memory (the token "
                f"cache is in MT_CACHE_DIR, else ~/.cache/mt; data.token_cache: false skips it)"
            )
    dist.wait_for_main()
    data = token_cache.load(folder)
    if data is not None:
        log(f"training split's token ids memory-mapped from the cache {folder}")
        return data
    if encoded is None:  # (this machine's cache could not be written)
        log(f"no token cache at {folder}: encoding the training split in memory")
        encoded = encode_train(cfg, tokenizer, Stats(), 0.0, epoch=0)
    return encoded


def bpe_dropout_epochs(cfg: Config, tokenizer: Tokenizer, first: ParallelData):
    """train.bpe_dropout > 0: a function from an epoch to that epoch's training data, the
    training split segmented anew with BPE-dropout (Provilkov et al., ACL 2020). `first` is
    epoch 0's, already encoded by prepare_data: handed out once, then dropped."""
    kept = {0: first}

    def epoch_data(epoch: int) -> ParallelData:
        data = kept.pop(epoch, None)
        kept.clear()  # a resumed run starts past epoch 0: not held for nothing
        return (
            data
            if data is not None
            else encode_train(cfg, tokenizer, Stats(), cfg.train.bpe_dropout, epoch)
        )

    return epoch_data


def ensure_data(cfg: Config, log) -> None:
    """data.dir's train and valid splits exist, or data.dataset is fetched into data.dir when
    that folder is absent, empty or an earlier download's (never among a user's files)."""
    d = cfg.data
    missing = [s for s in ("train", "valid") if not has_split(d.dir, s, d.src_lang, d.tgt_lang)]
    if not missing:
        return
    for split in missing:  # (a download would write into it, or wait on a FIFO for ever)
        for path in split_paths(d.dir, split, d.src_lang, d.tgt_lang):
            if path.exists() and not path.is_file():
                kind = "a folder" if path.is_dir() else "not a regular file (a FIFO, socket...)"
                raise MTError(
                    f"{path} is {kind}: the {split} split is read from text files; put the "
                    f"{split}.{d.src_lang} and {split}.{d.tgt_lang} files in {d.dir}"
                )
    folder = Path(d.dir)
    own = downloaded_into(folder)
    if d.dataset is None or not (is_empty_folder(folder) or own == d.dataset):
        raise MTError(_no_split_message(cfg, missing[0], own))
    names = ", ".join(Path(f).name for f in split_paths(d.dir, missing[0], d.src_lang, d.tgt_lang))
    log(
        f"data.dir {folder.resolve()} has no {missing[0]} split ({names}): downloading the "
        f"{d.dataset} corpus (data.dataset) into it; to train on your own files, set data.dir "
        f"to their folder ..."
    )
    try:
        download(
            d.dataset,
            folder,
            config=d.dataset_config,
            langs=(d.src_lang, d.tgt_lang) if d.dataset != "synthetic" else None,
            force=own is not None,
        )
    except MTError as e:
        if folder.is_absolute():
            raise
        raise MTError(
            f"{e} (data.dir {d.dir} is relative to the current folder, {Path.cwd()}: run from "
            f"the folder the config's paths start from, or make data.dir absolute)"
        ) from None
    for split in missing:
        if not has_split(d.dir, split, d.src_lang, d.tgt_lang):
            raise MTError(_no_split_message(cfg, split, d.dataset))


def _no_split_message(cfg: Config, split: str, downloaded: str | None) -> str:
    """Which files a split needs, which the folder has, and what to change."""
    d = cfg.data
    src, tgt = split_paths(d.dir, split, d.src_lang, d.tgt_lang)
    folder = Path(d.dir)
    if not folder.is_dir():
        return (
            f"data.dir {d.dir} does not exist: fetch a corpus with `mt download` or set "
            f"data.dir to the folder of {split}.{d.src_lang} and {split}.{d.tgt_lang}"
        )
    there = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    found = ", ".join(there[:8]) + (", ..." if len(there) > 8 else "") if there else "no files"
    fix = "check data.src_lang and data.tgt_lang, or name the files so"
    if d.dataset is not None and downloaded != d.dataset:
        fix += f" (mt downloads {d.dataset} only into an absent or empty folder)"
    return f"no {split} data: {src} and {tgt} must exist ({d.dir} has {found}); {fix}"


def load_tokenizer(
    cfg: Config,
    run_dir: Path,
    train_paths: tuple[Path, Path],
    log,
    inherited: Callable[[], Tokenizer | None] | None = None,
    saved: Callable[[str], Tokenizer | None] | None = None,
) -> Tokenizer:
    """The run's BPE model: the one it saved (a run with a checkpoint: saved()'s copy when
    that file is missing or damaged), else inherited()'s, else trained on (a sample of) the
    training split the first time."""
    saved = saved or (lambda _why: None)
    try:
        tok = Tokenizer.load(run_dir)
    except MTError as e:
        tok = saved(f"its BPE model is damaged ({e})")
        if tok is None:
            raise
    if tok is None:
        tok = saved("its BPE model is missing")
    if tok is None and inherited is not None:
        tok = inherited()
        if tok is not None:
            tok.save(run_dir)
    if tok is None:
        t = cfg.tokenizer
        log(f"training {'joint' if t.joint else 'separate'} BPE (vocab {t.vocab_size}) ...")
        src, tgt = sample_pairs(
            clean_pairs(iter_parallel(*train_paths), Stats()), t.max_sentences, cfg.train.seed
        )
        if not src:
            raise MTError(f"{train_paths[0]}: the training split has no non-empty pairs")
        tok = Tokenizer.train(
            src,
            tgt,
            vocab_size=t.vocab_size,
            joint=t.joint,
            character_coverage=t.character_coverage,
            max_sentences=t.max_sentences,
            seed=cfg.train.seed,
        )
        tok.save(run_dir)
        sizes = {tok.src_vocab_size, tok.tgt_vocab_size}
        if max(sizes) < t.vocab_size:  # (sentencepiece stops where the corpus has no more)
            got = " and ".join(map(str, sorted(sizes)))
            log(
                f"tokenizer.vocab_size {t.vocab_size}: the training split gave {got} pieces, "
                f"which the model and its checkpoints use (the BPE model in {run_dir} says so)"
            )
    return tok
