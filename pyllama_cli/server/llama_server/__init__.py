"""llama-server's native API: /completion, /infill, /slots (and save/restore), /props, token counting.

schemas.py holds the request bodies, prepare.py turns them into engine jobs, answers.py shapes the
engine's events into llama-server's bodies and stream chunks, routes.py adds the routes to the app.
"""
