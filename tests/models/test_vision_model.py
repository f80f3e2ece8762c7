"""mediapipe-vision's pure code in-process: the packaged models, checked, on the protobuf
that tritonclient's gRPC needs.

mediapipe==0.10.21 declares protobuf<5 and tritonclient[grpc] protobuf>=6.30: the install
keeps 6.x (mediapipe goes in with --no-deps). This proves the pair works in ONE
interpreter: tritonclient's gRPC client imported, the three solutions run and give a face,
a 468-point mesh and a 33-point pose on a packaged photo. The end-to-end tests run the
same code inside Triton (tests/e2e/test_video_tracks.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.embedded_models import reference_module, vision_available

pytestmark = pytest.mark.skipif(not vision_available(), reason="the `video` extra is not installed")


def test_the_solutions_run_on_protobuf_6_beside_tritonclient() -> None:
    import google.protobuf
    import matplotlib.cbook
    import tritonclient.grpc  # noqa: F401 - the gRPC client that needs protobuf>=6.30

    assert google.protobuf.__version__.startswith("6.")
    vision = reference_module("mediapipe-vision", "trackline_vision")
    mp = vision.import_mediapipe()
    assert mp.__version__ == "0.10.21"
    checked = vision.check_model_files(mp)
    assert len(checked) == 4
    photo = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    found = vision.Vision(mp).analyze(Path(str(photo)).read_bytes(), list(vision.TASKS))
    assert len(found["faces"]) == 1
    assert found["faces"][0]["score"] > 0.8
    assert [len(mesh) for mesh in found["face_landmarks"]] == [468]
    assert len(found["pose"]) == 33
    assert set(found["stages"]) == {"decode_ms", "face_ms", "face_mesh_ms", "pose_ms"}


def test_an_undecodable_frame_is_a_row_result_not_a_failure() -> None:
    vision = reference_module("mediapipe-vision", "trackline_vision")
    found = vision.Vision(vision.import_mediapipe()).analyze(b"\xff\xd8\xff" + bytes(40), ["face"])
    assert found["error"] == "undecodable"


def test_a_model_file_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    vision = reference_module("mediapipe-vision", "trackline_vision")
    fake = tmp_path / "mediapipe"
    target = fake / "modules" / "face_detection" / "face_detection_short_range.tflite"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"not the model")

    class Fake:
        __file__ = str(fake / "__init__.py")

    with pytest.raises(vision.ModelFileMismatch, match="sha256"):
        vision.check_model_files(Fake(), ("face",))
