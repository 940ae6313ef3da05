"""The training loop: the stage trainer and its state (state.py: model, optimizer, EMA, where it resumes),
one optimizer step, optimizer and schedule, each step's batches and where they are decoded, distributed
training (torchrun, DDP/FSDP2, DCP checkpoints), and stopping by signal (stop.py)."""
