"""User-facing errors: one line that names the offending value and how to fix it."""

from __future__ import annotations


class AdvisorError(ValueError):
    """Any input problem the CLI reports as a single line with exit code 2."""


class PlanError(AdvisorError):
    """A plan or search that cannot be costed as asked (advisor.api, advisor.search)."""


def format_validation_error(exc: Exception) -> str:
    """Turn a pydantic ValidationError into one line: 'field.path: message (got VALUE)'."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc).splitlines()[0]
    parts = []
    for err in errors()[:3]:
        loc = ".".join(_key(p) for p in err.get("loc", ())) or "value"
        msg = err.get("msg", "invalid")
        kind = err.get("type", "")
        if kind == "value_error" and msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if kind == "extra_forbidden":
            msg = "unknown key (remove it or check its spelling)"
        elif kind == "missing":
            msg = "required key is missing"
        got = err.get("input")
        got_s = "" if kind in ("missing", "extra_forbidden") or isinstance(got, dict) else f" (got {_short(got)})"
        if kind in WRONG_TYPE:  # the value and the fix in the message itself
            msg, got_s = _wrong_type(kind, got), ""
        if got_s and isinstance(got, str) and repr(got) in msg:  # the message quotes the value already
            got_s = ""
        parts.append(f"{msg}{got_s}" if not err.get("loc") else f"{loc}: {msg}{got_s}")
    more = len(errors()) - 3
    text = "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
    return text.replace("\r", "\\r").replace("\n", "\\n")  # one line, even for keys or values with newlines


# pydantic's wrong-type errors (pydantic_core's ErrorType), in its own leading words
WRONG_TYPE = {"int_from_float": "a whole number", "int_type": "a valid integer", "float_type": "a valid number",
              "string_type": "a valid string", "dict_type": "a mapping", "model_type": "a mapping", "list_type": "a list"}


def _wrong_type(kind: str, got) -> str:
    """'Input should be a valid string, not 42: write it in quotes': the value given and what to give instead."""
    fix = ("give one, or leave it out for its default" if got is None else "round it" if kind == "int_from_float"
           else "give its keys under it, key: value" if kind in ("dict_type", "model_type")
           else f"write it as a list, [{got}]" if kind == "list_type" and isinstance(got, (str, int, float))
           else "write it as a list, [a, b]" if kind == "list_type"
           else "write it in quotes" if kind == "string_type" and isinstance(got, (int, float))
           else f"give one {'string' if kind == 'string_type' else 'number'} in its place")
    return f"Input should be {WRONG_TYPE[kind]}, not {_short(got)}: {fix}"


def plain(value, sep: str = "") -> str:
    """A number as its digits (``sep`` between each three): a whole float (a bound such as le=1e18) without its
    exponent, 1000000000000000000 where repr and format(x, ",") write 1e+18; any other value as repr writes it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, float) and not (value == value and abs(value) != float("inf") and value.is_integer()):
        return repr(value)
    return f"{int(value):,}".replace(",", sep)


def _key(part) -> str:
    """A key as the user typed it; quoted when it is empty, padded or holds control characters."""
    text = str(part)
    return text if text and text.isprintable() and text.strip() == text else repr(text)


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
