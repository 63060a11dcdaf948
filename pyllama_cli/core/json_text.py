"""Reading JSON that users hand in (files, flags, request bodies) without Python's own failures leaking."""

from __future__ import annotations

import json
from typing import Any

from ..errors import InputError


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
