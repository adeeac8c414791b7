"""Hits to events on one clock per replica, events to windows, and the replica's
facts (configuration, KV capacity)."""
