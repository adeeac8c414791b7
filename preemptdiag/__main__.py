from preemptdiag.cli import run

run()
