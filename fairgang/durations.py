"""Human durations ("90s", "30m", "2h", "1h30m", "2d") to seconds and back."""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(value: object) -> float:
    """Parse a duration given as seconds (int/float) or a string such as ``"1h30m"``.

    Raises:
        ValueError: when the value is not a positive duration.
    """
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 90, '30m' or '2h'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        else:
            pos = 0
            seconds = 0.0
            for match in _PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(f"'{value}' is not a duration (use e.g. 90, '30m', '2h', '1h30m')")
    else:
        raise ValueError("must be a duration such as 90, '30m' or '2h'")
    if seconds <= 0:
        raise ValueError("must be longer than zero")
    return seconds


def format_duration(seconds: float) -> str:
    """Format seconds compactly, e.g. 5400 -> '1h30m'."""
    seconds = round(seconds)
    if seconds <= 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            count, seconds = divmod(seconds, size)
            parts.append(f"{count}{unit}")
    return "".join(parts)
