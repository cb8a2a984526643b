"""The story library: stories stored on the server (SQLite), merged across tabs and devices.

Pure of the model and the engine: schema (what a story is, bounded), merge (how a write
meets the writes of others), store (the SQLite file). api/routes/stories.py serves it.
"""
