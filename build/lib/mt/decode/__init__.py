"""Decoding: the Translator, search (greedy, beam, sampling), ensembles, alignments."""
