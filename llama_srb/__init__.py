"""llama-srb: single request batching on llama.cpp behind an OpenAI-compatible server."""
