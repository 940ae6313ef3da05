"""What a stage run saves and resumes from: checkpoints (safetensors + JSON manifest), frozen bases
named by content hash, LoRA passes and their adapter checkpoints (lora.py), and a trained model
exported in CatVTON's release layout (export.py). Imports published/ and recipes/, nothing of the loop or the jobs."""
