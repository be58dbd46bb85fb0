"""llama.cpp plumbing: the only package that imports llama_cpp."""
