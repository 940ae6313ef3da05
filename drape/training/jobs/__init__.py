"""A stage as a job: StageJob (the one way a stage trains), a node apart that shares only the object
store, and the one-trainer-per-stage lock."""
