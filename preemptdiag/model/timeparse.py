"""Timestamps: fast paths for the formats logs use, dateutil for the rest.

Only signal lines reach here, so dateutil's ~15 us per call is affordable as a
fallback, but the common formats are parsed by slicing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from functools import lru_cache

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
# syslog stamps on hosts with another LC_TIME: the German, Spanish and French three-letter
# months that differ from the English ones.
_MONTHS.update(
    {"Mär": 3, "Mrz": 3, "Mai": 5, "Okt": 10, "Dez": 12}
    | {"Ene": 1, "Abr": 4, "Ago": 8, "Dic": 12}
    | {"Fév": 2, "Avr": 4, "Aoû": 8, "Déc": 12}
)


def month_number(abbr: str) -> int | None:
    """The month of a syslog stamp's three letters (any case), or None."""
    return _MONTHS.get(abbr[:1].upper() + abbr[1:3].lower())


def in_range(dt: datetime) -> datetime | None:
    """A stamp every later step can shift by a day and a zone (Go's zero time, year 1,
    and year 9999 stamps cannot be): outside, it is treated as unparseable. So is one
    whose zone is no zone: dateutil builds offsets of any size (`+9999999`), and the
    datetime then fails where it is first compared or hashed."""
    try:
        dt.utcoffset()
    except ValueError:
        return None
    return dt if 1900 <= dt.year <= 9000 else None


@lru_cache(maxsize=256)
def parse_iso(text: str) -> datetime | None:
    """RFC 3339 / ISO 8601 with optional fraction (any length) and zone; naive -> UTC.

    Cached: a dense log (SGLang prints a batch line several times a second) repeats
    each stamp, and its events then share one datetime."""
    s = text.strip().replace(",", ".")
    zone: timezone | None = None
    if s.endswith("Z"):
        s, zone = s[:-1], UTC
    elif len(s) > 6 and s[-6] in "+-" and s[-3] == ":":
        zone = _offset(s[-6:].replace(":", ""))
        s = s[:-6]
        if zone is None:
            return None
    elif len(s) > 5 and s[-5] in "+-" and s[-4:].isdigit() and ("T" in s or " " in s):
        zone = _offset(s[-5:])
        s = s[:-5]
        if zone is None:
            return None
    frac = 0
    if "." in s:
        s, f = s.split(".", 1)
        frac = int((f + "000000")[:6]) if f.isdigit() else 0
    dt = _date_time(s)
    return None if dt is None else in_range(dt.replace(microsecond=frac, tzinfo=zone or UTC))


def _date_time(s: str) -> datetime | None:
    """`YYYY-MM-DD[ T]HH:MM:SS`, by slicing when the shape is exact (strptime costs
    ~15 us a call), else by strptime."""
    if (
        len(s) == 19
        and s.isascii()
        and s[4] + s[7] + s[10] + s[13] + s[16] in ("-- ::", "--T::")
        and (s[:4] + s[5:7] + s[8:10] + s[11:13] + s[14:16] + s[17:]).isdigit()
    ):
        try:
            return datetime(
                int(s[:4]), int(s[5:7]), int(s[8:10]), int(s[11:13]), int(s[14:16]), int(s[17:])
            )
        except ValueError:
            return None  # an impossible date, which strptime rejects too
    try:
        return datetime.strptime(s.replace("T", " "), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None


def _offset(text: str) -> timezone | None:
    sign = -1 if text[0] == "-" else 1
    if not text[1:5].isdigit() or not text[1:5].isascii():
        return None  # `+ab:cd`: not a zone
    delta = timedelta(hours=int(text[1:3]), minutes=int(text[3:5]))
    if delta >= timedelta(hours=24):
        return None  # not a real zone: treat the stamp as unparseable
    return timezone(sign * delta)


def parse_any(text: str) -> datetime | None:
    """Fallback for RFC 1123 (`Mon, 15 Jan 2024 14:22:01 +0000`), dmesg -T, etc."""
    from dateutil import parser as du_parser  # ~15 ms to import; rare formats only

    try:
        dt = du_parser.parse(text)
    except (ValueError, ArithmeticError):  # dateutil: decimal.InvalidOperation on 1e40 s
        return None
    return in_range(dt if dt.tzinfo else dt.replace(tzinfo=UTC))


def parse_month_day(text: str, year: int, tz: timezone = UTC) -> datetime | None:
    """vLLM `MM-DD HH:MM:SS` or syslog `Aug 19 18:34:30` with a borrowed year."""
    try:
        if not text[:1].isdigit():
            found = month_number(text[:3])
            if found is None:
                return None
            month = found
            day = int(text[4:6])
            hms = text[7:15]
        else:
            month = int(text[0:2])
            day = int(text[3:5])
            hms = text[6:14]
        h, m, s = (int(x) for x in hms.split(":"))
        return datetime(year, month, day, h, m, s, tzinfo=tz)
    except (ValueError, IndexError):
        return None


@dataclass
class YearTracker:
    """Assigns years to year-less timestamps of one source, in file order.

    A month that jumps backwards by more than six months is a Dec -> Jan rollover;
    small backwards steps are out-of-order multi-process lines, not a new year.
    """

    year: int
    last_month: int | None = None

    def resolve(self, month: int) -> int:
        if self.last_month is not None:
            if month < self.last_month and self.last_month - month > 6:
                self.year += 1
            elif month > self.last_month and month - self.last_month > 6:
                # Out-of-order line from just before the rollover.
                return self.year - 1
        self.last_month = month
        return self.year
