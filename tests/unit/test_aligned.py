"""The aligned checks: light and registration are undone, what changed in one place is not."""

from __future__ import annotations

import numpy as np
import pytest

from drape.gates.checks import aligned, face
from drape.gates.checks import light as lights
from drape.gates.run import check_scores
from drape.gates.suites.nuisance import NUISANCE
from drape.gates.suites.regressions import REGRESSIONS, render
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    from drape.data.dataset import synthesize_split

    gates = {name: {"method": "aligned"} for name in ("identity", "texture", "coherence")}
    config = tiny_config(tmp_path_factory.mktemp("aligned"), data={"resolution": 128}, gates=gates)
    return config, synthesize_split(config, "control", 6)


def test_the_light_fit_recovers_a_gain_and_offset_and_ignores_what_is_excluded(control):
    _, arrays = control
    target, mask = arrays["target"][0], arrays["mask"][0]
    relit = np.clip(target * np.array([1.05, 0.97, 0.92]) + np.array([3.0, -2.0, 5.0]), 0, 255)
    painted = relit.copy()
    painted[mask > 127] = [0, 255, 0]  # where the model paints: excluded from the fit
    light = lights.fit_light(painted.round().astype(np.uint8), target, mask <= 127)
    unclipped = (target.reshape(-1, 3) < 235).all(axis=1)
    error = np.abs(light.apply(target) - relit).reshape(-1, 3)[unclipped]
    assert np.median(error) < 1.5


def test_a_sub_pixel_shift_is_registered_away(control):
    _, arrays = control
    target, box = arrays["target"][1], arrays["meta"][1]["face_box"]
    moved = NUISANCE["shift 0.5 px"](target[None], [{}], np.random.default_rng(0))[0]
    light = lights.fit_light(moved, target)
    registered = aligned.residual(*aligned.align(moved, target, box, light))
    unregistered = aligned.residual(*aligned.align(moved, target, box, light, max_shift=0))
    assert registered < 0.5 * unregistered


def test_harmless_variation_scores_above_every_regression_of_its_check(control):
    """The checks' reason to exist, on six samples at 128 px: the worst nuisance variant of the ones
    a reviewer shrugs at most often scores above the median of each clear regression."""
    config, arrays = control
    target, meta = arrays["target"], arrays["meta"]
    floor = {check: 1.0 for check in ("identity", "texture", "coherence")}
    for name in ("shift 1 px", "brightness +6%", "white balance warm", "jpeg q75"):
        scores = check_scores(config, arrays, NUISANCE[name](target, meta, np.random.default_rng(0)), target)
        floor = {check: min(floor[check], float(values.min())) for check, values in scores.items()}
    clear = {"identity": "other hair colour", "texture": "look-alike letters", "coherence": "fit 12% looser"}
    for check, name in clear.items():
        redrawn = render(REGRESSIONS[check][name], meta, config.seed)
        value = float(np.median(check_scores(config, arrays, redrawn, target)[check]))
        assert value < floor[check], f"{check}: {name} scores {value:.3f}, nuisance floor {floor[check]:.3f}"


def test_a_perfect_output_scores_one_on_every_aligned_check(control):
    config, arrays = control
    scores = check_scores(config, arrays, arrays["target"], arrays["target"])
    assert all(np.allclose(values, 1.0, atol=1e-3) for values in scores.values()), scores


def test_a_large_region_is_registered_on_a_subset_of_its_points():
    """A 1024 px garment region would cost a full comparison per candidate shift; registration
    reads every few rows and columns instead and still finds the shift."""
    import torch

    rng = np.random.default_rng(0)
    noise = torch.from_numpy(rng.uniform(0, 255, (3, 660, 660)).astype(np.float32))
    image = aligned._blur(noise, 3.0).permute(1, 2, 0).numpy()
    image = ((image - image.min()) / (image.max() - image.min()) * 255).astype(np.uint8)
    moved = np.roll(image, (2, -3), axis=(0, 1))
    box, light = (20, 20, 640, 640), lights.Light(np.ones(3, np.float32), np.zeros(3, np.float32))
    registered = aligned.residual(*aligned.align(moved, image, box, light, max_shift=4, pad=0))
    unregistered = aligned.residual(*aligned.align(moved, image, box, light, max_shift=0, pad=0))
    assert registered < 0.1 * unregistered


def _face_terms(arrays, outputs) -> tuple[np.ndarray, np.ndarray]:
    """Per sample, the face's (residual, skin-tone ΔE) as aligned_identity_scores takes them."""
    terms = [face.face_change(o, s, m["face_box"]) for o, s, m in zip(outputs, arrays["target"], arrays["meta"])]
    return np.array([t[0] for t in terms]), np.array([t[1] for t in terms])


def test_a_resized_or_re_encoded_face_changes_less_than_a_nose_a_little_longer(control):
    """Registration on both pictures a little blurred (a soft output no longer pulls the shift to a
    fraction of a pixel) and the reference also re-encoded and resampled: a thumbnail re-served
    at full size or a JPEG q60 leaves less than a nose 6% of the face longer (1.5 px at 128 px)."""
    config, arrays = control
    target, meta = arrays["target"], arrays["meta"]
    nose, _ = _face_terms(arrays, render(REGRESSIONS["identity"]["nose longer or shorter"], meta, config.seed))
    for name in ("resized 0.75", "jpeg q60"):
        residual, _ = _face_terms(arrays, NUISANCE[name](target, meta, np.random.default_rng(0)))
        assert np.median(residual) < 0.8 * np.median(nose), (name, residual, nose)


def test_a_quarter_step_of_skin_tone_shows_where_re_encoding_and_light_do_not(control):
    """The tone term reads the face ellipse's flat skin (white hair as light as the skin is not
    skin) and the least change against any delivered version of the reference; the identity score
    (the larger of the two terms, each in its unit) of every sample with a quarter step of skin
    tone is below that of every sample re-encoded or relit."""
    config, arrays = control
    target, meta = arrays["target"], arrays["meta"]
    _, tone = _face_terms(arrays, render(REGRESSIONS["identity"]["skin tone 1/4 step"], meta, config.seed))
    assert tone.min() > 2.0, tone  # a quarter step is 2.5-5 ΔE
    turned = _scores(config, arrays, render(REGRESSIONS["identity"]["skin tone 1/4 step"], meta, config.seed), "identity")
    for name in ("jpeg q60", "jpeg q75", "white balance warm", "brightness -6%", "contrast +5%", "contrast -5%"):
        harmless = _scores(config, arrays, NUISANCE[name](target, meta, np.random.default_rng(0)), "identity")
        assert turned.max() < harmless.min(), (name, turned, harmless)


def _scores(config, arrays, outputs, check: str) -> np.ndarray:
    return check_scores(config, arrays, outputs, arrays["target"])[check]


def test_a_mark_softened_on_its_own_changes_more_than_a_whole_picture_softened_as_much(control):
    """The mark's reference is made as soft and encoded as the picture around the mark shows: the
    whole picture blurred by 0.75 px is compared with a reference blurred as much, the same blur on the
    mark alone (the start of a melted mark) with the sharp one."""
    from PIL import Image, ImageFilter

    from drape.gates.suites.corruptions import _edit_region

    config, arrays = control
    target, meta = arrays["target"], arrays["meta"]
    soften = lambda patch, i: np.asarray(Image.fromarray(patch).filter(ImageFilter.GaussianBlur(0.75)))  # noqa: E731
    alone = 1 - _scores(config, arrays, _edit_region(target, meta, "logo_box", 0, soften), "texture")
    whole = 1 - _scores(config, arrays, np.stack([soften(image, i) for i, image in enumerate(target)]), "texture")
    assert (alone > whole).all() and np.median(alone) > 2 * np.median(whole), (alone, whole)


def test_a_garment_hue_a_little_turned_scores_below_a_whole_picture_resized_or_re_encoded(control):
    """The garment's reference is made as soft and encoded as the picture beyond the garment shows,
    registered on both a little blurred (a soft output no longer pulls the shift to a fraction of a
    pixel, which left a resized picture's edges as its largest change)."""
    config, arrays = control
    target, meta = arrays["target"], arrays["meta"]
    turned = _scores(
        config, arrays, render(REGRESSIONS["coherence"]["garment hue turned 30 deg"], meta, config.seed), "coherence"
    )
    turned = turned[[REGRESSIONS["coherence"]["garment hue turned 30 deg"].applies(m) for m in meta]]
    for name in ("resized 0.75", "jpeg q60"):
        harmless = _scores(config, arrays, NUISANCE[name](target, meta, np.random.default_rng(0)), "coherence")
        assert turned.max() < harmless.min(), (name, turned, harmless)


def _dark_background_and_bright_print() -> tuple[np.ndarray, np.ndarray, tuple]:
    """(picture, garment mask, face box), 128×96: a background spanning some 25 dark levels per
    channel, and in the mask a bright dotted print far above anything outside it."""
    import torch

    rng = np.random.default_rng(0)
    noise = aligned._blur(torch.from_numpy(rng.normal(0, 30, (3, 128, 96)).astype(np.float32)), 4.0)
    picture = np.array([40.0, 30.0, 25.0]) + noise.permute(1, 2, 0).numpy()
    mask = np.zeros((128, 96), np.uint8)
    mask[40:100, 25:75] = 255
    rows, columns = np.mgrid[0:128, 0:96]
    dots = (rows % 6 < 3) & (columns % 6 < 3)
    garment = np.where(dots[..., None], [230.0, 200.0, 120.0], [150.0, 60.0, 70.0])
    picture[mask > 127] = garment[mask > 127]
    return np.clip(picture, 0, 255).round().astype(np.uint8), mask, (40, 5, 56, 25)


def test_one_offset_tells_a_contrast_change_from_an_offset_on_a_dark_background(monkeypatch):
    """Over a rest of one dark range, a contrast change (gain 1.05 about the picture's mean) and a
    small offset fit alike; with an offset per channel the fit took the one for the other and a bright
    print read 0.02 off. The one-offset fit, tried beside it, recovers the gain, and the print is
    compared under the light that explains it."""
    picture, mask, box = _dark_background_and_bright_print()
    rest = lights.outside(picture.shape, [box], mask)
    brighter = NUISANCE["contrast +5%"](picture[None], [{}], np.random.default_rng(0))[0]
    per_channel, shared, none = lights.plausible_lights(brighter, picture, rest)
    assert np.abs(shared.gain - 1.05).max() < 0.02, shared
    assert abs(float(shared.offset[0]) + 0.05 * float(picture.astype(np.float32).mean())) < 0.6, shared
    assert none is lights.NO_LIGHT
    change = lambda: 1 - aligned.aligned_coherence_scores(brighter[None], picture[None], [box], mask[None], 2.5)[0]  # noqa: E731
    every = change()
    monkeypatch.setattr(aligned, "plausible_lights", lambda *args: (lights.fit_light(*args),))
    alone = change()
    assert every * aligned.CLOTH_UNIT < 0.005 < alone * aligned.CLOTH_UNIT, (every, alone)


def test_the_print_a_re_encoding_blurred_scores_above_a_denser_pattern():
    """The demo config's control set at 128 px, the samples that exposed it: on two dotted and
    striped prints over a dark background (16, 26) JPEG q60 read 0.044 and 0.038 (the fit's light
    was off, and the codec's nearest quality 5 away), above a pattern a third denser on two others
    (4: 0.036, 12: 0.035). With every plausible light and qualities every 5 they part."""
    from drape.config import default_config_path, load_config
    from drape.data.dataset import synthesize_split

    config = load_config(default_config_path())
    config = config.model_copy(update={"data": config.data.model_copy(update={"resolution": 128})})
    arrays = synthesize_split(config, "control", 27)
    pick = [4, 12, 16, 26]
    arrays = {field: [values[i] for i in pick] if isinstance(values, list) else values[pick] for field, values in arrays.items()}
    target, meta = arrays["target"], arrays["meta"]
    faces = [m["face_box"] for m in meta]
    change = lambda outputs: 1 - aligned.aligned_coherence_scores(outputs, target, faces, arrays["mask"], 2.5)  # noqa: E731
    encoded = change(NUISANCE["jpeg q60"](target, meta, np.random.default_rng(0)))[2:]
    denser = change(render(REGRESSIONS["coherence"]["pattern a third denser"], meta, config.seed))[:2]
    assert encoded.max() < denser.min(), (encoded * aligned.CLOTH_UNIT, denser * aligned.CLOTH_UNIT)


def test_a_re_encoded_face_reads_less_tone_change_than_a_quarter_step():
    """The demo config's control set at 128 px, sample 25: against the reference re-encoded at
    q55/70/85, its JPEG q75 read a skin-tone change of 2.4 ΔE, near a quarter step's (2.5 at the
    least), and set the identity threshold above the nose's residual. With qualities every 5 it is
    well under."""
    from drape.config import default_config_path, load_config
    from drape.data.dataset import synthesize_split

    config = load_config(default_config_path())
    config = config.model_copy(update={"data": config.data.model_copy(update={"resolution": 128})})
    arrays = synthesize_split(config, "control", 26)
    target, meta = arrays["target"][25:], arrays["meta"][25:]
    box = meta[0]["face_box"]
    encoded = NUISANCE["jpeg q75"](target, meta, np.random.default_rng(0))[0]
    turned = render(REGRESSIONS["identity"]["skin tone 1/4 step"], meta, config.seed)[0]
    _, harmless = face.face_change(encoded, target[0], box)
    _, quarter = face.face_change(turned, target[0], box)
    assert harmless < 0.6 * quarter, (harmless, quarter)


def test_a_resampled_mark_is_registered_on_the_resampled_reference():
    """The held-apart control set (seed 1) at 128 px, sample 16: an orange mark on a black dress,
    the whole picture resized 0.75. Registered on the sharp reference, the resampled one landed a
    quarter pixel off (resampling rings at the mark's edges) and read 0.041 of full scale, the
    texture floor above letters of similar shape on other samples; registered on its own it reads
    what resampling left. Letters of similar shape still read far above it."""
    from drape.config import default_config_path, load_config
    from drape.data.dataset import synthesize_split

    config = load_config(default_config_path())
    config = config.model_copy(update={"seed": 1, "data": config.data.model_copy(update={"resolution": 128})})
    arrays = synthesize_split(config, "control", 17)
    target, meta = arrays["target"][16:], arrays["meta"][16:]
    logos, faces = [m["logo_box"] for m in meta], [m["face_box"] for m in meta]
    change = lambda outputs: float(1 - aligned.aligned_texture_scores(outputs, target, logos, faces, 2.5)[0]) * aligned.MARK_UNIT  # noqa: E731
    resampled = change(NUISANCE["resized 0.75"](target, meta, np.random.default_rng(0)))
    look_alike = change(render(REGRESSIONS["texture"]["look-alike letters"], meta, config.seed))
    assert resampled < 0.02 < 0.1 < look_alike, (resampled, look_alike)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_mark_of_its_plate_s_luminance_is_seen_in_chroma(seed):
    """The control sets of seeds 0 and 1 at 128 px, sample 21: a red Z on blue and a purple K on
    red, each of nearly its plate's luminance. With chroma a quarter of the residual, the K turned
    12° read 0.021, under the nuisance floor; registered on luminance only, the Z moved half a pixel
    read 0.051 at half. Registered and compared in chroma too, a turn reads above what a shift,
    JPEG q60 or a resampling leaves."""
    from drape.config import default_config_path, load_config
    from drape.data.dataset import synthesize_split

    config = load_config(default_config_path())
    config = config.model_copy(update={"seed": seed, "data": config.data.model_copy(update={"resolution": 128})})
    arrays = synthesize_split(config, "control", 22)
    target, meta = arrays["target"][21:], arrays["meta"][21:]
    boxes = [meta[0]["logo_box"]], [meta[0]["face_box"]]
    change = lambda outputs: float(1 - aligned.aligned_texture_scores(outputs, target, *boxes, 2.5)[0]) * aligned.MARK_UNIT  # noqa: E731
    harmless = max(
        change(NUISANCE[name](target, meta, np.random.default_rng(0))) for name in ("shift 0.5 px", "jpeg q60", "resized 0.75")
    )
    turned = change(render(REGRESSIONS["texture"]["mark turned 12 deg"], meta, config.seed))
    assert harmless < 0.02 < 0.035 < turned, (harmless, turned)
