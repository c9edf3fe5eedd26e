"""The special token ids, the same in every vocabulary mt trains (sentencepiece is told to use
them), in a module of their own so that the model and search need no tokenizer library."""

PAD, UNK, BOS, EOS = 0, 1, 2, 3
# What the non-autoregressive decoder and masked-LM pretraining hide a token behind: <unk>,
# which never occurs in text (the vocabularies mt trains cover every character), so the
# embedding shapes stay those of the translation model.
MASK = UNK
