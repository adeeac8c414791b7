"""Open the inputs: files, stdin, compression, rotated sets, /metrics scrapes."""
