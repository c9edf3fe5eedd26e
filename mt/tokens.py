"""The special token ids, the same in every vocabulary mt trains (sentencepiece is told to use
them), in a module of their own so that the model and search need no tokenizer library."""

PAD, UNK, BOS, EOS = 0, 1, 2, 3
# What the non-autoregressive decoder and masked-LM pretraining hide a token behind: <unk>,
# which never occurs in text (the vocabularies mt trains cover every character), so the
# embedding shapes stay those of the translation model.
MASK = UNK
# The piece that leads every source of a back-translated corpus (data.corpora's `tagged`:
# tagged back-translation, Caswell et al., WMT 2019): reserved whole in the BPE model, so the
# model tells synthetic sources from real ones; never written in a translation.
BT_TAG = "<BT>"
