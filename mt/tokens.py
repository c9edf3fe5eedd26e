"""The special token ids, the same in every vocabulary mt trains (sentencepiece is told to use
them), in a module of their own so that the model and search need no tokenizer library."""
PAD, UNK, BOS, EOS = 0, 1, 2, 3
