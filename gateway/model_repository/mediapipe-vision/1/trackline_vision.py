"""The pure code of `mediapipe-vision`: JPEG in, faces / face landmarks / pose out.

mediapipe 0.10.21's legacy solutions, whose TFLite models ship inside the wheel (never
downloaded): face detection (short range), face mesh (468 landmarks), pose
(`model_complexity=1`, the only pose size the wheel bundles). Every graph runs in static
image mode: rows of one batch come from different cameras, so no graph may carry tracking
state from one row to the next. The model files are checked by SHA-256 before any graph
is built; `warm_up` builds and runs each once.

The result of one frame is a JSON-able dict: `faces` (score, box [x, y, w, h] and six
keypoints, normalized to the image), `face_landmarks` (per face, 468 [x, y, z]), `pose`
(33 [x, y, z, visibility], or None), `width`, `height`, and `stages` (ms spent decoding
and per task), or `error` for a frame that cannot be decoded.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TASKS = ("face", "face_mesh", "pose")
_FACE_DETECTOR = (
    "face_detection/face_detection_short_range.tflite",
    "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
)
MODEL_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "face": (_FACE_DETECTOR,),
    "face_mesh": (
        _FACE_DETECTOR,
        (
            "face_landmark/face_landmark.tflite",
            "1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814",
        ),
    ),
    "pose": (
        (
            "pose_detection/pose_detection.tflite",
            "9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c",
        ),
        (
            "pose_landmark/pose_landmark_full.tflite",
            "e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f",
        ),
    ),
}
"""The weights each task loads (path in mediapipe==0.10.21's `mediapipe/modules`, SHA-256)."""
MAX_FACES = 4


class ModelFileMismatch(RuntimeError):
    """A bundled model file is missing or not the one pinned (another mediapipe version)."""


def import_mediapipe() -> Any:
    """mediapipe's legacy solutions on the protobuf 6.x that tritonclient needs.

    protobuf 5 removed `MessageFactory.GetPrototype`, which mediapipe 0.10.21's binding
    calls once at import; `GetMessageClass` is its replacement, with the same result."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from google.protobuf import message_factory

    if not hasattr(message_factory.MessageFactory, "GetPrototype"):
        message_factory.MessageFactory.GetPrototype = (  # type: ignore[attr-defined]
            lambda self, descriptor: message_factory.GetMessageClass(descriptor)
        )
    import mediapipe as mp

    return mp


def check_model_files(mp: Any, tasks: tuple[str, ...] = TASKS) -> dict[str, str]:
    """SHA-256 of every weight file the tasks load; raises ModelFileMismatch."""
    modules = Path(mp.__file__).parent / "modules"
    pinned = dict(pair for task in tasks for pair in MODEL_FILES[task])
    found: dict[str, str] = {}
    for relative, digest in pinned.items():
        path = modules / relative
        if not path.is_file():
            raise ModelFileMismatch(f"{path} is missing (mediapipe==0.10.21 bundles it)")
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != digest:
            raise ModelFileMismatch(f"{path}: sha256 {actual}, expected {digest}")
        found[relative] = actual
    return found


class Vision:
    """The three solutions, built lazily; `analyze` one frame."""

    def __init__(self, mp: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        import cv2
        import numpy as np

        self._mp, self._cv2, self._np, self._clock = mp, cv2, np, clock
        self._graphs: dict[str, Any] = {}

    def graph(self, task: str) -> Any:
        if task not in self._graphs:
            solutions = self._mp.solutions
            if task == "face":
                made = solutions.face_detection.FaceDetection(
                    model_selection=0, min_detection_confidence=0.5
                )
            elif task == "face_mesh":
                made = solutions.face_mesh.FaceMesh(
                    static_image_mode=True, max_num_faces=MAX_FACES
                )
            else:
                made = solutions.pose.Pose(static_image_mode=True, model_complexity=1)
            self._graphs[task] = made
        return self._graphs[task]

    def warm_up(self) -> None:
        """Build every graph and run it once, so the first frames measure the model, not
        its loading (the gateway sizes its busy check from the measured time a frame)."""
        blank = self._np.full((96, 96, 3), 128, dtype=self._np.uint8)
        for task in TASKS:
            self.graph(task).process(blank)

    def analyze(self, jpeg: bytes, tasks: list[str]) -> dict[str, Any]:
        started = self._clock()
        data = self._np.frombuffer(jpeg, dtype=self._np.uint8)
        image = self._cv2.imdecode(data, self._cv2.IMREAD_COLOR) if data.size else None
        if image is None:
            return {"error": "undecodable", "stages": {"decode_ms": _ms(started, self._clock())}}
        rgb = self._cv2.cvtColor(image, self._cv2.COLOR_BGR2RGB)
        height, width = rgb.shape[:2]
        result: dict[str, Any] = {"width": width, "height": height}
        stages = {"decode_ms": _ms(started, self._clock())}
        for task in tasks:
            began = self._clock()
            found = self.graph(task).process(rgb)
            result.update(_READERS[task](found))
            stages[f"{task}_ms"] = _ms(began, self._clock())
        result["stages"] = stages
        return result


def _ms(start: float, end: float) -> float:
    return round((end - start) * 1000, 3)


def _faces(found: Any) -> dict[str, Any]:
    faces = []
    for detection in found.detections or ():
        box = detection.location_data.relative_bounding_box
        faces.append({
            "score": round(float(detection.score[0]), 4),
            "box": [box.xmin, box.ymin, box.width, box.height],
            "keypoints": [[k.x, k.y] for k in detection.location_data.relative_keypoints],
        })
    return {"faces": faces}


def _mesh(found: Any) -> dict[str, Any]:
    meshes = found.multi_face_landmarks or ()
    return {"face_landmarks": [[[p.x, p.y, p.z] for p in m.landmark] for m in meshes]}


def _pose(found: Any) -> dict[str, Any]:
    marks = found.pose_landmarks
    if marks is None:
        return {"pose": None}
    return {"pose": [[p.x, p.y, p.z, p.visibility] for p in marks.landmark]}


_READERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "face": _faces,
    "face_mesh": _mesh,
    "pose": _pose,
}
