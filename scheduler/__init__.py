"""The GPU queue: memory profiles, fleet view, placement policy, durable queue, dispatcher and
launchers. Not built yet (see the queue issue); the train step is where it will plug in."""
