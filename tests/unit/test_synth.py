"""The synthetic generator has the structure the gates rely on."""

import numpy as np

from drape.data.synth import FACE, GARMENT, _rng, generate_split, make_garment, make_identity, make_pose, render_person


def test_identity_and_garment_attributes_are_fixed_by_id():
    assert make_identity(0, 5) == make_identity(0, 5)
    assert make_identity(0, 5) != make_identity(0, 6)
    assert make_garment(0, 7) == make_garment(0, 7)


def test_same_identity_in_different_photos_keeps_face_attributes():
    samples = list(generate_split(seed=0, split="identity", num_samples=40, num_identities=3, num_garments=6, resolution=64))
    by_identity = {}
    for sample in samples:
        by_identity.setdefault(sample.meta["identity_id"], []).append(sample)
    photos = max(by_identity.values(), key=len)
    assert len(photos) >= 2
    assert len({tuple(sorted(p.meta["identity"].items())) for p in photos}) == 1
    assert len({tuple(p.meta["keypoints"]["wrist_l"]) for p in photos}) > 1  # different poses


def test_boxes_and_masks_match_the_drawing():
    identity, garment = make_identity(0, 1), make_garment(0, 2)
    size = 256
    points = make_pose(_rng(1), "down", size)
    _, labels, face_box, logo_box = render_person(identity, garment, points, _rng(2), size)
    labels = np.asarray(labels)
    x0, y0, x1, y1 = (int(v) for v in face_box)
    assert (labels[y0:y1, x0:x1] == FACE).mean() > 0.3
    cx, cy = int((logo_box[0] + logo_box[2]) / 2), int((logo_box[1] + logo_box[3]) / 2)
    assert labels[cy, cx] == GARMENT


def test_agnostic_hides_the_garment_and_keeps_the_face():
    sample = next(generate_split(seed=0, split="texture", num_samples=1, num_identities=2, num_garments=4, resolution=64))
    mask = np.asarray(sample.mask) > 0
    garment = np.asarray(sample.garment_mask) > 0
    assert (mask & garment).sum() >= 0.95 * garment.sum()
    agnostic, target = np.asarray(sample.agnostic), np.asarray(sample.target)
    assert np.all(agnostic[mask] == 128)
    x0, y0, x1, y1 = (int(v) for v in sample.meta["face_box"])
    np.testing.assert_array_equal(agnostic[y0 + 2 : y1 - 2, x0 + 2 : x1 - 2], target[y0 + 2 : y1 - 2, x0 + 2 : x1 - 2])


def test_stage_bias_shapes_the_splits():
    texture = list(generate_split(seed=0, split="texture", num_samples=20, num_identities=4, num_garments=16, resolution=32))
    identity = list(generate_split(seed=0, split="identity", num_samples=20, num_identities=4, num_garments=16, resolution=32))
    assert all(s.meta["garment"]["pattern"] != "solid" for s in texture)
    assert all(s.meta["garment"]["pattern"] == "solid" for s in identity)
