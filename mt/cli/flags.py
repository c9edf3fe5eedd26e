"""The flags several commands share, each declared once as a type (`device: Device = "auto"`),
so that a command's signature is a line a flag and the flag means the same everywhere."""

from __future__ import annotations

from typing import Annotated

import typer

Device = Annotated[str, typer.Option("--device", help="auto, cpu or cuda")]
Precision = Annotated[
    str,
    typer.Option(
        "--precision", help="auto (GPU: the run's precision; CPU: fp32), fp32, bf16 or fp16"
    ),
]
Beam = Annotated[int | None, typer.Option("--beam", min=1, help="default: the run's")]
LengthPenalty = Annotated[float | None, typer.Option("--length-penalty", min=0.0)]
NatIterations = Annotated[
    int | None,
    typer.Option("--nat-iterations", min=1, help="model.arch nat: mask-predict's passes"),
]
NatLengthBeam = Annotated[
    int | None, typer.Option("--nat-length-beam", min=1, help="model.arch nat: candidate lengths")
]
Force = Annotated[bool, typer.Option("--force", help="overwrite --output if it exists")]
SrcLang = Annotated[
    str | None,
    typer.Option(
        "--src-lang",
        help="a model of several pairs: the source language (default: "
        "the run's data.src_lang, or the one pair into --tgt-lang's)",
    ),
]
TgtLang = Annotated[
    str | None,
    typer.Option(
        "--tgt-lang",
        help="a model of several pairs: the language to translate into "
        "(default: the run's data.tgt_lang)",
    ),
]
