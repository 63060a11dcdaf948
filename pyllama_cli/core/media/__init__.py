"""Images (and audio) beside the text: libmtmd's projector, through llama-cpp-python's `mtmd_cpp`.

- `settings`: the projector flags as data (--mmproj, --no-mmproj, --mmproj-offload, --image-min/max-tokens).
- `check`: media bytes looked at before libmtmd decodes them (format, size, dimensions), so hostile
  files are refused with one clear error.
- `projector`: `Projector`, the loaded mmproj (an `mtmd_context`), and `open_projector`.
- `prompt`: `MediaPrompt`, a prompt's text and media as libmtmd's chunks, evaluated into a context.
"""
