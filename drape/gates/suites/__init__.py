"""The suites a gate is calibrated and validated with: corruptions and regressions it must catch,
nuisance and wider harmless changes it must pass, and the calibration that runs them."""
