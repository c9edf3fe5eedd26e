"""Data: corpora fetched and read, BPE, token ids, length-bucketed batches, the walk through
epochs."""
