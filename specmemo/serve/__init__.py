"""`specmemo serve`: an OpenAI-compatible HTTP server over a sequence pool (worker.py, app.py)."""
