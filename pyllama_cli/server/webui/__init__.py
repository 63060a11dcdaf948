"""The chat page `pyllama serve` answers GET / with: routes.py (the page, its script and style, and
POST /render), render.py (Markdown to sanitized HTML), and the page's own index.html, app.js, style.css."""
