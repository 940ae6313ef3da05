"""What a stage run saves and resumes from: checkpoints (safetensors + JSON manifest), frozen bases
named by content hash, and the trainable state (parameters, optimizer, EMA)."""
