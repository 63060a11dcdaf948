"""The chat page `pyllama serve` answers GET / with: routes.py (the page, its files, and POST /render),
render.py (Markdown to sanitized HTML), and the page itself as package data: index.html, style.css,
and the ES modules app.js imports (api, chats, stream, view, util)."""
