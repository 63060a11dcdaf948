"""Reading JSON that users hand in (files, flags, request bodies) without Python's own failures leaking."""

from __future__ import annotations

import json
import math
from typing import Any

from ...errors import InputError


def loads(text: str | bytes, what: str) -> Any:
    """json.loads, with its failures other than a syntax error made one-line InputErrors naming `what`.

    json.JSONDecodeError still propagates: each caller words it for its input. Deep nesting
    (RecursionError), integers longer than Python converts (a ValueError) and NaN or Infinity
    (which Python reads but JSON does not have, so they would come back out as text no JSON
    reader takes) become InputErrors.
    """

    def refuse_constant(name: str) -> Any:
        raise InputError(f"{what} is not JSON: {name} is not a JSON number",
                         hint="write numbers as JSON does (1.5, -2, 1e10)")

    try:
        return json.loads(text, parse_constant=refuse_constant)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise InputError(f"{what} nests too deeply to read") from None
    except ValueError:  # Python converts integers of at most sys.get_int_max_str_digits() digits
        raise InputError(f"cannot read {what}: a number in it has too many digits") from None


def json_ready(value: Any) -> Any:
    """`value` with every NaN or infinity made None, for writing: JSON has no such numbers, and
    json.dumps would write NaN/Infinity, which strict readers (jq, JavaScript) reject. A ± of one
    scored token, a correlation with no variance or a GGUF's float metadata can hold them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value
