"""Samples from the data a producer has at hand: NumPy arrays, CSV rows, image files."""
from __future__ import annotations

import csv
import gzip
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np

from .errors import InvalidJob
from .features import Double, FeatureValue, Image, Int64, MultiArray, String
from .job import Sample

Label = Union[str, int]


def label_value(label: Any) -> FeatureValue:
    """A class label as the model takes it: a str becomes stringValue, an integer int64Value.

    Give labels in the model's own type (`attune model describe NAME` shows it): the digits model's
    labels are the strings "0"…"9", so pass `labels.astype(str)` for it.
    """
    if isinstance(label, (str, np.str_)):
        return String(str(label))
    if isinstance(label, (bool, np.bool_)):
        raise InvalidJob(f"label {label!r} is a bool: give the model's class label as a str or an int")
    if isinstance(label, (int, np.integer)):
        return Int64(int(label))
    if isinstance(label, (float, np.floating)):
        return Double(float(label))  # a regressor's target
    raise InvalidJob(f"label {label!r} is a {type(label).__name__}: give a str, an int or a float")


def _value(row: Any) -> FeatureValue:
    array = np.asarray(row)
    if array.ndim == 0:
        return label_value(array.item())
    if array.dtype.kind not in "biuf":
        raise InvalidJob(f"an array feature must hold numbers, not {array.dtype}")
    return MultiArray(tuple(float(v) for v in array.ravel()), tuple(array.shape))


def samples_from_arrays(features: Mapping[str, Any], labels: Any, label_feature: str) -> List[Sample]:
    """One sample per row: each feature's array has the samples along its first axis.

    A row of one number becomes doubleValue (int64Value for integer arrays, stringValue for strings); a
    row of more becomes a multiArray with the row's shape. `labels` holds one label per row.
    """
    label_rows = np.asarray(labels)
    if label_rows.ndim != 1:
        raise InvalidJob(f"labels must be one-dimensional (one per sample), not of shape {label_rows.shape}")
    columns: Dict[str, Any] = {}
    for name, array in features.items():
        column = np.asarray(array)
        if column.ndim == 0 or len(column) != len(label_rows):
            raise InvalidJob(f"feature {name} has {1 if column.ndim == 0 else len(column)} rows but there are "
                             f"{len(label_rows)} labels: give one row per sample along the first axis")
        columns[name] = column
    if label_feature in columns:
        raise InvalidJob(f"{label_feature} is both an input feature and the label feature")
    samples = []
    for i in range(len(label_rows)):
        values: Dict[str, FeatureValue] = {name: _value(column[i]) for name, column in columns.items()}
        values[label_feature] = label_value(label_rows[i].item())
        samples.append(Sample(values))
    return samples


def read_csv_rows(path: str, rows: Optional[slice] = None) -> List[List[str]]:
    """The rows of a CSV file (.csv.gz read directly), blank lines skipped, `rows` a slice of them."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        table = [row for row in csv.reader(f) if any(cell.strip() for cell in row)]
    return table[rows] if rows is not None else table


def samples_from_csv(path: str, rows: Optional[slice] = None, *, input_feature: str = "pixels",
                     label_feature: str = "digit", int64_labels: bool = False) -> List[Sample]:
    """Rows of numbers followed by a label (the layout of examples/data/digits.csv.gz).

    The numbers go as one multiArray without a shape (the worker takes the model's input shape when the
    count matches); the label as a string, or an integer with `int64_labels`.
    """
    samples = []
    for number, row in enumerate(read_csv_rows(path, rows)):
        if len(row) < 2:
            raise InvalidJob(f"{path} row {number}: needs numbers followed by a label")
        try:
            values = tuple(float(cell) for cell in row[:-1])
        except ValueError as error:
            raise InvalidJob(f"{path} row {number}: {error}") from None
        label = row[-1].strip()
        try:
            target: FeatureValue = Int64(int(label)) if int64_labels else String(label)
        except ValueError:
            raise InvalidJob(f"{path} row {number}: label {label!r} is not an integer") from None
        samples.append(Sample({input_feature: MultiArray(values), label_feature: target}))
    return samples


def samples_from_images(images: Iterable[Union[str, bytes, Image]], labels: Sequence[Label], *,
                        image_feature: str, label_feature: str) -> List[Sample]:
    """One sample per image (a file path, PNG/JPEG bytes, or an Image) with its label.

    The bytes go as they are: the worker scales them to the model's input size (aspect ratio not kept)
    and converts the colour space, so send images of the model's aspect ratio, EXIF rotation applied.
    """
    pictures = [_image(each) for each in images]
    if len(pictures) != len(labels):
        raise InvalidJob(f"{len(pictures)} images but {len(labels)} labels: give one label per image")
    return [Sample({image_feature: picture, label_feature: label_value(label)})
            for picture, label in zip(pictures, labels)]


def _image(each: Union[str, bytes, Image]) -> Image:
    if isinstance(each, Image):
        return each
    if isinstance(each, bytes):
        return Image(each)
    return Image.from_file(each)

