"""How deeply a JSON document nests, found without recursion.

Triton 2.51's HTTP front parses request bodies with a recursive parser: a body nested ~60,000 deep
exhausts its stack and kills the server (fixed upstream in Triton 2.69). The HTTP guard measures the
nesting of every body with this scanner before Triton sees it. The scanner does not validate JSON (Triton
does that): it only counts brackets outside strings, and stops as soon as the limit is passed, so a hostile
body costs at most `limit` steps past its flat prefix.
"""

from __future__ import annotations

import re

# The bytes that can change the depth or the "inside a string" state.
_SPECIAL = re.compile(rb'[\[\]{}"\\]')
_OPENERS = frozenset(b"[{")
_CLOSERS = frozenset(b"]}")


def exceeds_depth(body: bytes, limit: int) -> bool:
    """True when `body` opens more than `limit` arrays/objects inside one another (outside strings)."""
    # Fast path: a body with no more opening brackets than the limit cannot nest deeper than it.
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    return max_depth(body, stop_above=limit) > limit


def max_depth(body: bytes, stop_above: int | None = None) -> int:
    """The deepest nesting of arrays and objects in `body`; stops counting once it passes `stop_above`."""
    depth = deepest = 0
    in_string = False
    position = 0
    search = _SPECIAL.search
    while True:
        match = search(body, position)
        if match is None:
            return deepest
        byte = body[match.start()]
        position = match.end()
        if in_string:
            if byte == 0x5C:  # backslash: the next byte is escaped, whatever it is
                position += 1
            elif byte == 0x22:  # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in _OPENERS:
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_above is not None and deepest > stop_above:
                    return deepest
        elif byte in _CLOSERS:
            depth = max(depth - 1, 0)
