"""The models: checkpoint loading, the Gemma 4 target and its MTP drafter, their layers, caches,
the vision encoders and image preprocessing, and Metal memory settings."""
