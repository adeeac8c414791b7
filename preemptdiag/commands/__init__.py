"""The pipeline composed (analyze) and the commands built on it: check, compare,
explain. The only layer that reaches all of the others."""
