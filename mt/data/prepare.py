"""The one entry point from a run's data config and run directory to the data it trains on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mt.config import Config
from mt.config.data import CorpusConfig
from mt.data import token_cache
from mt.data.batching import epoch_seed
from mt.data.corpus import (
    ParallelData,
    Stats,
    clean_pairs,
    concat_pairs,
    corpus_paths,
    drop_empty,
    encode_pairs,
    encode_stream,
    iter_parallel,
    read_parallel,
    split_paths,
)
from mt.data.fetch import ensure_data
from mt.data.pairs import Languages, Pair, tagged
from mt.data.selection import (
    check_tag,
    part_weights,
    reserved_symbols,
    sample_pairs,
    train_parts,
    unique_pairs,
)
from mt.data.textform import text_form
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
    token ids. Returns (tokenizer, train data, (valid sources, valid references, valid data,
    each pair's count of valid lines in order: empty for one pair)); with several pairs
    (data.pairs) the splits hold every pair's, one after another, the sources led by their
    target-language token where the model needs one (mt/data/pairs.py).
    bpe_dropout > 0: the training data is epoch 0's BPE-dropout segmentation (the plain one is
    never trained on), so the logged counts are those of what the first epoch walks.
    inherited() -> the BPE model a new run adopts instead of training its own (that of a
    pretrained encoder, model.init_encoder), or None; saved(why) -> the BPE model a run's
    checkpoint holds, written again into the run directory when its own file is missing or
    damaged (why), or None."""
    if dist.is_main:  # one rank downloads and trains BPE; the others wait, then read
        ensure_data(cfg, log)
    dist.wait_for_main()
    valid_stats = Stats()
    vsrc, vtgt, counts = read_valid(cfg, valid_stats)
    if dist.is_main:
        load_tokenizer(cfg, run_dir, log, inherited, saved)
    dist.wait_for_main()
    tokenizer = load_tokenizer(cfg, run_dir, log, saved=saved)
    train_data = train_split(cfg, tokenizer, dist, log, bpe_dropout)
    form = text_form(cfg.data)  # (data.text lc_tok: one pair)
    valid_data = encode_pairs(
        form.sources(vsrc), form.targets(vtgt), tokenizer, cfg.max_side_len, valid_stats
    )
    log(valid_stats.describe("valid"))
    return tokenizer, train_data, (vsrc, vtgt, valid_data, counts)


def read_valid(cfg: Config, stats: Stats) -> tuple[list[str], list[str], tuple]:
    """(the valid sources, led by their target-language token where the model needs one, the
    references, ((pair, lines), ...) for several pairs, else ()), empty pairs dropped."""
    d, langs = cfg.data, Languages.of(cfg.data)
    srcs: list[str] = []
    refs: list[str] = []
    counts = []
    for pair in langs.pairs:
        src, tgt = drop_empty(
            *read_parallel(*split_paths(d.dir, "valid", pair.src, pair.tgt)), stats
        )
        if not src:
            which = f" of {pair}" if len(langs.pairs) > 1 else ""
            raise MTError(f"{d.dir}: the valid split{which} has no non-empty pairs")
        srcs += tagged(src, langs.tag_of(pair))
        refs += tgt
        counts.append((str(pair), len(src)))
    return srcs, refs, tuple(counts) if len(counts) > 1 else ()


def train_split(cfg: Config, tokenizer: Tokenizer, dist, log, bpe_dropout: float) -> ParallelData:
    """The training split's token ids, each pair's from the token cache where it applies
    (cached_train), else encoded (epoch 0's segmentation under BPE-dropout); several pairs
    concatenated, each example's pair kept."""
    d, langs = cfg.data, Languages.of(cfg.data)
    parts = []
    for pair, corpus in train_parts(cfg):
        paths = part_paths(d, pair, corpus)
        tag = langs.tag_of(pair)
        check_tag(corpus, tokenizer)
        if bpe_dropout == 0 and token_cache.wanted(d.token_cache, paths):
            data = cached_train(cfg, tokenizer, pair, tag, dist, log, corpus)
        else:
            data = encode_train(cfg, tokenizer, Stats(), bpe_dropout, 0, pair, tag, corpus)
        name = f"train.{corpus.name}" if corpus else "train"
        log(data.stats.describe(name if len(langs.pairs) == 1 else f"{name} {pair}"))
        parts.append(data)
    return concat_pairs(parts, part_weights(cfg))


def encode_train(
    cfg: Config,
    tokenizer: Tokenizer,
    stats: Stats,
    bpe_dropout: float,
    epoch: int,
    pair: Pair,
    tag: str | None = None,
    corpus: CorpusConfig | None = None,
) -> ParallelData:
    """One pair's training split (or its corpus of data.corpora) as token ids, streamed from
    disk (text is never held whole, only its ids); tag: the target language whose token leads
    every source; bpe_dropout > 0: the segmentation of `epoch`, seeded by train.seed and the
    epoch alone, so every rank and a resumed run get the same one."""
    d = cfg.data
    paths = part_paths(d, pair, corpus)
    if bpe_dropout > 0:
        tokenizer.seed_dropout(epoch_seed(cfg.train.seed, epoch))
    text = text_form(d, pair.src, pair.tgt).pairs(iter_parallel(*paths))
    cleaned = clean_pairs(text, stats)
    data = encode_stream(
        unique_pairs(cleaned, stats) if d.drop_duplicates else cleaned,
        tokenizer,
        d.max_len,
        stats,
        dropout=bpe_dropout,
        tag=tag,
        max_ratio=d.max_len_ratio,
        back_translated=corpus is not None and corpus.tagged,
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


def part_paths(d, pair: Pair, corpus: CorpusConfig | None) -> tuple[Path, Path]:
    """The (source, target) training files of a pair, or of its corpus of data.corpora
    (which must be there: one line otherwise)."""
    if corpus is None:
        return split_paths(d.dir, "train", pair.src, pair.tgt)
    paths = corpus_paths(d.dir, corpus.name, pair.src, pair.tgt)
    for path in paths:
        if not path.is_file():
            raise MTError(
                f"data.corpora {corpus.name}: {path} not found; put train.{corpus.name}."
                f"{pair.src} and train.{corpus.name}.{pair.tgt} in {d.dir}, or remove it"
            )
    return paths


def encode_epoch(cfg: Config, tokenizer: Tokenizer, bpe_dropout: float, epoch: int) -> ParallelData:
    """Every pair's training split in `epoch`'s BPE-dropout segmentation."""
    langs = Languages.of(cfg.data)
    parts = [
        encode_train(cfg, tokenizer, Stats(), bpe_dropout, epoch, p, langs.tag_of(p), corpus)
        for p, corpus in train_parts(cfg)
    ]
    return concat_pairs(parts, part_weights(cfg))


def cached_train(
    cfg: Config,
    tokenizer: Tokenizer,
    pair: Pair,
    tag: str | None,
    dist,
    log,
    corpus: CorpusConfig | None = None,
) -> ParallelData:
    """One pair's training ids (or its corpus's of data.corpora) from the token cache
    (mt.data.token_cache): the first rank of each machine (local rank 0) encodes and writes
    them into that machine's cache folder the first time (into a shared MT_CACHE_DIR, a second
    machine's copy of the same key loses the race harmlessly), then every rank memory-maps its
    machine's files."""
    paths = part_paths(cfg.data, pair, corpus)
    models = [tokenizer.src_model] + ([] if tokenizer.joint else [tokenizer.tgt_model])
    models += [b"sources led by <BT>"] if corpus is not None and corpus.tagged else []
    models += [] if tokenizer.vocab is None else [tokenizer.vocab.to_json()]
    models += [] if tag is None else [f"sources led by {tag}".encode()]
    models += [] if cfg.data.text == "raw" else [f"text {cfg.data.text}".encode()]
    filters = (cfg.data.max_len_ratio, cfg.data.drop_duplicates)
    models += [] if filters == (0.0, False) else [f"filters {filters}".encode()]
    folder = token_cache.folder_for(token_cache.cache_key(paths, models, cfg.data.max_len))

    def encode() -> ParallelData:
        return encode_train(cfg, tokenizer, Stats(), 0.0, 0, pair, tag, corpus)

    encoded = None
    if dist.local_rank == 0 and token_cache.load(folder) is None:
        log(f"writing the training split's token ids to the cache {folder}")
        encoded = encode()
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
        encoded = encode()
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
            data if data is not None else encode_epoch(cfg, tokenizer, cfg.train.bpe_dropout, epoch)
        )

    return epoch_data


def load_tokenizer(
    cfg: Config,
    run_dir: Path,
    log,
    inherited: Callable[[], Tokenizer | None] | None = None,
    saved: Callable[[str], Tokenizer | None] | None = None,
) -> Tokenizer:
    """The run's BPE model: the one it saved (a run with a checkpoint: saved()'s copy when
    that file is missing or damaged), else inherited()'s, else trained on (a sample of) the
    training split the first time (bpe_sample), the target-language tokens of several pairs
    reserved whole in it."""
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
        t, langs = cfg.tokenizer, Languages.of(cfg.data)
        log(f"training {'joint' if t.joint else 'separate'} BPE (vocab {t.vocab_size}) ...")
        src, tgt = bpe_sample(cfg, langs)
        tok = Tokenizer.train(
            src,
            tgt,
            vocab_size=t.vocab_size,
            joint=t.joint,
            character_coverage=t.character_coverage,
            max_sentences=t.max_sentences,
            seed=cfg.train.seed,
            symbols=reserved_symbols(cfg),
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


def bpe_sample(cfg: Config, langs: Languages) -> tuple[list[str], list[str]]:
    """(source lines, target lines) to train BPE on: one pair's, at most
    tokenizer.max_sentences pairs drawn uniformly; several pairs', an equal share of
    tokenizer.max_sentences from each language's lines (from the first pair that has it, each
    pair's files read once), so that a language with less text keeps its pieces. A joint BPE
    model reads both lists as one."""
    d, t = cfg.data, cfg.tokenizer
    one = len(langs.pairs) == 1
    share = t.max_sentences if one else max(1, t.max_sentences // len(langs.every))
    # each language from the first pair that has it; each such pair sampled once
    source = {lang: next(p for p in langs.pairs if lang in (p.src, p.tgt)) for lang in langs.every}
    samples = {}
    for pair in dict.fromkeys(source.values()):
        paths = split_paths(d.dir, "train", pair.src, pair.tgt)
        text = text_form(d, pair.src, pair.tgt).pairs(iter_parallel(*paths))
        samples[pair] = sample_pairs(clean_pairs(text, Stats()), share, cfg.train.seed)
        if not samples[pair][0]:
            raise MTError(f"{paths[0]}: the training split has no non-empty pairs")
    if one:
        return samples[langs.pairs[0]]
    lines = {lang: samples[p][0 if lang == p.src else 1] for lang, p in source.items()}
    if cfg.tokenizer.joint:  # (each language once, also one both read and written)
        return [x for lang in langs.every for x in lines[lang]], []
    src = [x for lang in langs.sources for x in lines[lang]]
    return src, [x for lang in langs.targets for x in lines[lang]]
