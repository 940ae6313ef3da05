"""Training, in five rooms; each imports only the rooms before it in this list (tests/unit/test_house.py):

published/    the field's weights as they ship, read strictly: diffusers folders, pretrained
              denoisers and their key maps, CatVTON's attention-only release
recipes/      what trains: the model interface, the recipes that build it (pixel-dit, latent,
              catvton), the diffusion objectives, and where a config's weights come from
checkpoints/  what a stage saves and resumes from: checkpoints (safetensors + JSON manifest), frozen
              bases named by content hash, LoRA adapters, a trained model exported as CatVTON's release
loop/         the training loop: the trainer and its state (model, optimizer, EMA, the first step),
              one step, the batches, distributed training, and stopping by signal
jobs/         a stage as a job: StageJob (the one way a stage trains), a node apart that shares only
              the object store, the one-trainer-per-stage lock
"""
