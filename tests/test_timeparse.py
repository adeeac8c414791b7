from datetime import UTC, datetime, timedelta, timezone

from hypothesis import example, given, settings
from hypothesis import strategies as st

from preemptdiag.model.timeparse import (
    YearTracker,
    _date_time,
    parse_any,
    parse_iso,
    parse_month_day,
)


def _strptime_or_none(s: str) -> datetime | None:
    try:
        return datetime.strptime(s.replace("T", " "), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None


@settings(max_examples=3000, deadline=None)
@given(
    st.one_of(
        st.text(alphabet="0123456789-: T+", min_size=17, max_size=21),
        st.builds(
            lambda i, c: "2025-11-02 09:58:06"[:i] + c + "2025-11-02 09:58:06"[i + 1 :],
            st.integers(0, 18),
            st.sampled_from("0123456789-: T+x\u0663"),
        ),
    )
)
@example("2025-02-30 09:58:06")  # impossible date
@example("+025-11-02 09:58:06")  # int() takes a sign, strptime does not
@example("2025-11-02 09:58: 6")  # nor a space
@example("2025-11-02 09:58:0\u0663")  # nor, here, a non-ASCII digit
@example("2024-02-29T23:59:59")
def test_date_time_fast_path_agrees_with_strptime(s: str) -> None:
    assert _date_time(s) == _strptime_or_none(s)


def test_parse_iso_forms():
    assert parse_iso("2025-10-15T00:02:38.756689123Z") == datetime(
        2025, 10, 15, 0, 2, 38, 756689, tzinfo=UTC
    )
    assert parse_iso("2025-08-19T18:34:30+0000") == datetime(2025, 8, 19, 18, 34, 30, tzinfo=UTC)
    assert parse_iso("2025-08-19T20:34:30+02:00") == datetime(
        2025, 8, 19, 20, 34, 30, tzinfo=timezone(timedelta(hours=2))
    )
    assert parse_iso("2024-07-08 15:17:34") == datetime(2024, 7, 8, 15, 17, 34, tzinfo=UTC)
    assert parse_iso("not a time") is None


def test_parse_any_rfc1123():
    assert parse_any("Mon, 15 Jan 2024 14:22:45 +0000") == datetime(
        2024, 1, 15, 14, 22, 45, tzinfo=UTC
    )


def test_month_day_with_borrowed_year():
    assert parse_month_day("06-16 21:24:15", 2024) == datetime(2024, 6, 16, 21, 24, 15, tzinfo=UTC)
    assert parse_month_day("Aug 19 18:34:30", 2025) == datetime(2025, 8, 19, 18, 34, 30, tzinfo=UTC)
    assert parse_month_day("13-40 99:00:00", 2025) is None


def test_year_rollover_and_out_of_order_lines():
    t = YearTracker(2025)
    assert t.resolve(12) == 2025
    assert t.resolve(1) == 2026  # Dec -> Jan
    assert t.resolve(12) == 2025  # a straggler from before midnight
    assert t.resolve(1) == 2026
    assert t.resolve(2) == 2026


def test_dateutils_decimal_error_is_no_time() -> None:
    # Found by bench/fuzz.py (seed 8081): decimal.InvalidOperation, not a ValueError.
    from preemptdiag.model.timeparse import parse_any

    assert parse_any("2026-12-01T23:" + "9" * 41 + ":41.696Z") is None


def test_seed_10101_index_11591_a_zone_of_days_is_no_time() -> None:
    # dateutil builds tzoffset(+99999999 s); the datetime failed only when first
    # hashed (events._dedupe_ranks): ValueError, exit 3.
    assert parse_any("Mon, 15 Jan 2024 14:22:01 +99999999") is None
    assert parse_any("Mon, 15 Jan 2024 14:22:01 +0130") is not None
