"""Reading a PyTorch file (``.pt``, ``.pth``: published weights drape did not write) without trusting it.

`torch.load(weights_only=True)` already refuses a pickle of Python objects, but its message names
neither the config field nor the file, and advises re-running with ``weights_only=False``: the one
step that would run the file's code. Every torch file drape reads goes through `load_tensors`,
whose `TorchFileError` names the field and the file, says what was expected, and never suggests
unpickling it. drape's own checkpoints are safetensors and never come here.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path

import torch


class TorchFileError(ValueError):
    """A torch file drape will not load; names the field (or what it is) and the file."""


def load_tensors(source: str | Path | io.BytesIO, where: str) -> object:
    """The tensors (and plain containers) in `source`; TorchFileError naming `where` (a config field
    and its file, or the object a buffer came from) when it holds anything else or is not a torch file."""
    try:
        with warnings.catch_warnings():  # its protocol warning says nothing a reader can act on
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(source, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError, IsADirectoryError):
        # torch's own message advises re-running with weights_only=False, which would run the file's code
        raise TorchFileError(
            f"{where}: not a file of tensors only: a pickle of Python objects (which drape never runs), damaged, or "
            "not a PyTorch file; expected a state dict of tensors (or a safetensors file converted from the published "
            "weights)"
        ) from None


def load_state_dict(source: str | Path, where: str) -> dict:
    """`load_tensors`, and a TorchFileError naming `where` unless it holds a dict (a state dict)."""
    state = load_tensors(source, where)
    if not isinstance(state, dict):
        raise TorchFileError(f"{where}: expected a state dict, got {type(state).__name__}")
    return state
