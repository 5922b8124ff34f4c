"""Building blocks: one token mixer per file, plus norms, MLP and rotary embeddings."""
