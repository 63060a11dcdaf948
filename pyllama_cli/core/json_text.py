"""Reading JSON that users hand in (files, flags, request bodies) without Python's own failures leaking."""

from __future__ import annotations

import json
from typing import Any

from ..errors import InputError


def loads(text: str | bytes, what: str) -> Any:
    """json.loads, with its failures other than a syntax error made one-line InputErrors naming `what`.

    json.JSONDecodeError still propagates: each caller words it for its input. Deep nesting
    (RecursionError) and integers longer than Python converts (a ValueError) become InputErrors.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise InputError(f"{what} nests too deeply to read") from None
    except ValueError:  # Python converts integers of at most sys.get_int_max_str_digits() digits
        raise InputError(f"cannot read {what}: a number in it has too many digits") from None
