"""Decoding: the speculative round loop (Decoder), automatic block size, prompt rendering and the
streaming detokenizer."""
