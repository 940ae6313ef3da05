"""The training loop: the stage trainer, one optimizer step, optimizer and schedule, each step's batches
and where they are decoded, and distributed training (torchrun, DDP/FSDP2, DCP checkpoints)."""
