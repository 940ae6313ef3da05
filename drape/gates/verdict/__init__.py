"""How measured values become a verdict: thresholds on lower confidence bounds (report.py), per-sample
rules, the nuisance floor at gate time, and the report rendered for people."""
