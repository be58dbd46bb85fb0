"""localspec: lossless speculative decoding for local GGUF models."""

import time

STARTED_AT = time.perf_counter()  # when the process began, as near as Python code can see: time to first token counts from here

__version__ = "0.1.0"
