"""What trains: the model interface (model.py), the recipes that build it (pixel-dit, latent, catvton),
the diffusion objectives, and LoRA passes. Imports nothing of the loop or the jobs."""
