"""The checks a gate measures per control sample: identity, texture (OCR), cloth coherence, the aligned
comparison and the light it undoes, and the outputs refused before any threshold."""
