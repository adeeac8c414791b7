"""Windows to classes and the incident verdict (rules), and the verdict to the one
lever (advice, budget), with the runbook text both speak."""
