"""The checks a gate measures per control sample: identity, texture (OCR), cloth coherence, the
control set's own checks, and the outputs refused before any threshold."""
