"""Weights in the field's layouts, read strictly: diffusers folders (weights.py), pretrained denoisers and
their key maps, and CatVTON's attention-only release. Imports no other training room."""
