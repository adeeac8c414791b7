from datetime import UTC, datetime, timedelta, timezone

from preemptdiag.timeparse import YearTracker, parse_any, parse_iso, parse_month_day


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
