"""What a job asks of the queue: a stage's training job (`training.py`), an inference benchmark
(`inference.py`), a shopper's personalization (`shoppers.py`), each sized by its memory profile
(`profiles.py`: estimated from the config, learned from measured peaks). The queue knows shapes and
memory profiles, never a model."""
