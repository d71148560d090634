"""Checkpoints on the Hub and on disk: downloads (in a child process), the Hugging Face cache, the
pairing catalogue, whether a drafter fits a target, and whether a pairing fits this machine."""
