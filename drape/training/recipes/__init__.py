"""What trains: the model interface (model.py), the recipes that build it (pixel-dit, latent, catvton),
the diffusion objectives, and where a config's denoiser weights come from (sources.py). Imports
published/ only."""
