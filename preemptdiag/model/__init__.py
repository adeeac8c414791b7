"""Typed records every stage shares (hits, events, windows, verdict, lever, report),
the one error type, the thresholds and timestamp parsing. Depends on nothing else here."""
