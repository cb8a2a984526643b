"""llama-srb: single request batching on llama.cpp behind an OpenAI-compatible server."""

# llama.cpp's libraries load before any other native library: on a CUDA build (CUDA 13,
# 2026-12-04), numpy loaded first made the model's load crash the process.
import llama_cpp  # noqa: F401
