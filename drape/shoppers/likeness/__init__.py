"""The likeness measure the personalization gate compares base and adapter with (`face.likeness_scores`):
a face's residual and skin-tone change once light (`light`), registration and delivery
(`registration`) are undone. A measure of improvement between two models, not a gate's threshold."""
