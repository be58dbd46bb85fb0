"""Model files: the catalog, installing, pulling, GGUF headers and vocabularies."""
