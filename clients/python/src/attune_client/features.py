"""Feature values as a sample carries them: the JSON mapping of `attune.v1.FeatureValue`."""
from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import Any, Dict, Sequence, Tuple, Union

from .errors import InvalidJob

JSON = Dict[str, Any]

_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG = b"\xff\xd8\xff"


def _finite(name: str, value: float) -> float:
    # Workers refuse NaN and infinities; saying so here names the feature before anything is sent.
    if not math.isfinite(value):
        raise InvalidJob(f"feature {name} holds {value}: every number in a job must be finite")
    return value


@dataclass(frozen=True)
class MultiArray:
    """A dense array, values row-major. An empty shape lets the worker use the model's declared shape."""
    values: Tuple[float, ...]
    shape: Tuple[int, ...] = ()

    def to_json(self, name: str) -> JSON:
        if self.shape and math.prod(self.shape) != len(self.values):
            raise InvalidJob(f"feature {name}: shape {list(self.shape)} needs {math.prod(self.shape)} values, "
                             f"it has {len(self.values)}")
        body: JSON = {"values": [_finite(name, v) for v in self.values]}
        if self.shape:
            body["shape"] = [str(d) for d in self.shape]  # int64 as strings, as the protobuf JSON mapping writes them
        return {"multiArray": body}


@dataclass(frozen=True)
class Double:
    value: float

    def to_json(self, name: str) -> JSON:
        return {"doubleValue": _finite(name, self.value)}


@dataclass(frozen=True)
class Int64:
    value: int

    def to_json(self, name: str) -> JSON:
        if not -(2**63) <= self.value < 2**63:
            raise InvalidJob(f"feature {name}: {self.value} does not fit in 64 bits")
        return {"int64Value": str(self.value)}


@dataclass(frozen=True)
class String:
    value: str

    def to_json(self, name: str) -> JSON:
        return {"stringValue": self.value}


@dataclass(frozen=True)
class Image:
    """PNG or JPEG bytes, sent as they are (base64 in JSON); the worker decodes and scales them."""
    data: bytes

    def __post_init__(self) -> None:
        # Workers take only PNG and JPEG, recognised from the signature; refusing others here saves a round trip.
        if not (self.data.startswith(_PNG) or self.data.startswith(_JPEG)):
            raise InvalidJob("an image feature must be PNG or JPEG bytes (GIF, BMP, WebP, HEIF… are refused): "
                             "convert it first, e.g. with Pillow's Image.save(…, 'PNG')")

    @classmethod
    def from_file(cls, path: str) -> Image:
        with open(path, "rb") as f:
            data = f.read()
        try:
            return cls(data)
        except InvalidJob as error:
            raise InvalidJob(f"{path}: {error}") from None

    @classmethod
    def from_array(cls, pixels: Any) -> Image:
        """A PNG of a uint8 array, H×W (gray), H×W×3 (RGB) or H×W×4 (RGBA). Needs Pillow (attune-client[images])."""
        try:
            from PIL import Image as PILImage
        except ImportError:
            raise InvalidJob("turning arrays into images needs Pillow: pip install 'attune-client[images]'") from None
        import io

        import numpy as np

        array = np.asarray(pixels)
        if array.dtype != np.uint8:
            raise InvalidJob(f"image arrays must be uint8 (0 black to 255 white), not {array.dtype}: "
                             "scale and convert with .clip(0, 255).astype(numpy.uint8)")
        out = io.BytesIO()
        PILImage.fromarray(array).save(out, format="PNG")
        return cls(out.getvalue())

    def to_json(self, name: str) -> JSON:
        return {"image": base64.b64encode(self.data).decode("ascii")}


FeatureValue = Union[MultiArray, Double, Int64, String, Image]


def multi_array(values: Sequence[float], shape: Sequence[int] = ()) -> MultiArray:
    return MultiArray(tuple(float(v) for v in values), tuple(int(d) for d in shape))
