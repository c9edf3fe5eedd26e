"""How a run writes its text (data.text). raw: as the corpus has it, cased and detokenized,
what people read. lc_tok: lowercased, punctuation-normalised and tokenized by the Moses
scripts, as Multi30k's task1-tokenize.sh makes the text that the published Multi30k models
train on and are scored on. Such a run trains on that text, reads its sources so, and writes
its translations lowercased and detokenized again, so that `mt eval --lc-tok` scores them as
the papers do (tokenizing a detokenized line gives the tokenized line back: on Multi30k's
English, German and French every line of valid, test and 10,000 training lines; Czech loses
the space between a word and a number in 8 of 12,014 lines)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from mt.errors import MTError

MODES = ("raw", "lc_tok")


@functools.lru_cache(maxsize=1)
def moses_languages() -> list[str]:
    from sacremoses.corpus import NonbreakingPrefixes

    return sorted(set(NonbreakingPrefixes().available_langs.values()))


@functools.lru_cache(maxsize=16)
def _moses(lang: str):
    from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang)


def lc_tok(line: str, lang: str) -> str:
    """task1-tokenize.sh's text: lowercased, normalize-punctuation.perl, tokenizer.perl; the
    characters left as they are (no &apos; escapes: the model writes plain text)."""
    normalizer, tokenizer, _ = _moses(lang)
    normalized = normalizer.normalize(line.lower())
    return str(tokenizer.tokenize(normalized, escape=False, return_str=True))


@dataclass(frozen=True)
class TextForm:
    """One pair's text form: what training reads, what translation writes."""

    mode: str
    src: str
    tgt: str

    @property
    def raw(self) -> bool:
        return self.mode == "raw"

    def sources(self, lines: Iterable[str]) -> list[str]:
        return list(lines) if self.raw else [lc_tok(x, self.src) for x in lines]

    def targets(self, lines: Iterable[str]) -> list[str]:
        return list(lines) if self.raw else [lc_tok(x, self.tgt) for x in lines]

    def pairs(self, pairs: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
        """A corpus's (source, target) lines in this form."""
        for src, tgt in pairs:
            yield (src, tgt) if self.raw else (lc_tok(src, self.src), lc_tok(tgt, self.tgt))

    def references(self, lines: list[str]) -> list[str]:
        """References to score translations against during training: lowercased, as the
        translations are (sacreBLEU's own tokenization then splits both alike)."""
        return lines if self.raw else [x.lower() for x in lines]

    def outputs(self, lines: list[str]) -> list[str]:
        """The model's lines as a translation: detokenized (lc_tok)."""
        if self.raw:
            return lines
        detokenizer = _moses(self.tgt)[2]
        return [str(detokenizer.detokenize(x.split())) for x in lines]


RAW = TextForm("raw", "", "")  # (text as it is: no language needed)


def text_form(data, src: str | None = None, tgt: str | None = None) -> TextForm:
    """The text form of a data config (its data.text), for the pair src-tgt (default: its
    src_lang-tgt_lang); lc_tok on a language the Moses scripts do not know is refused (they
    would tokenize it as English without a word)."""
    form = TextForm(data.text, src or data.src_lang, tgt or data.tgt_lang)
    if not form.raw:
        known = moses_languages()
        for lang in (form.src, form.tgt):
            if lang not in known:
                raise MTError(
                    f"data.text lc_tok: the Moses scripts know no language {lang!r} (they "
                    f"know {', '.join(sorted(known))}); name the files by one of them, or use "
                    f"data.text raw"
                )
    return form


def check_raw_text(data) -> None:
    """An exported model reads and writes text as it is: a run of another data.text is
    refused (its Moses steps would be lost)."""
    if data.text != "raw":
        raise MTError(
            f"data.text {data.text}: this run reads Moses-tokenized lowercased text and writes "
            f"it detokenized; an exported model would carry neither step. Export a run "
            f"trained with data.text raw"
        )
