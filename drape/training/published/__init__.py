"""Weights in the field's layouts: strict reading of diffusers folders (weights.py), pretrained
denoisers and their key maps, CatVTON's attention-only release, export, and where a config's weights come from."""
