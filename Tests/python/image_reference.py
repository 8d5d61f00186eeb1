"""Independent reference for Attune's image inputs (Sources/AttuneImage).

    image_reference.py OUTDIR

writes PNG and JPEG files of many kinds into OUTDIR and OUTDIR/cases.json: for each file the model's
image constraint, the scaler, and the input tensor Attune must produce, computed here in float64 NumPy:

  pixels  PNG: the array this script generated and wrote (Pillow writes it losslessly; checked by
          reading it back); 16-bit samples v become v/257 on the 0..255 scale, rounded to 8 bits as
          Core ML's 8-bit pixel buffers hold them. JPEG: the pixels Pillow decodes (libjpeg-turbo,
          accurate integer IDCT, smooth upsampling: the same settings Attune asks TurboJPEG for).
  alpha   composited on black: colour * alpha / 255.
  gray    0.299 R + 0.587 G + 0.114 B; a gray source feeding RGB/BGR repeats its value.
  resize  the whole image to width x height (aspect ratio not kept), triangle filter in pixel-centre
          coordinates widened by the shrink factor, weights normalised over the image: written here as
          dense matrices, and checked against Pillow's own Image.resize(BILINEAR) on float images.
  scaler  channelScale * x + bias of the channel (red/green/blue/gray).
  layout  [C, H, W]; RGB planes R, G, B; BGR planes B, G, R.

It also writes files that must be refused, with the kind of error expected.
"""
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

RNG = np.random.default_rng(20261123)


# ---------------------------------------------------------------- pixel sources

def pattern(height, width, channels, bits=8):
    """Smooth gradients plus noise, so both resizing and per-pixel errors show."""
    top = (1 << bits) - 1
    y, x = np.mgrid[0:height, 0:width]
    planes = []
    for c in range(channels):
        smooth = 0.5 + 0.5 * np.sin((x + 1.7 * c) / max(width, 2) * 5.0 + (y - c) / max(height, 2) * 3.0)
        noise = RNG.uniform(-0.25, 0.25, size=(height, width))
        planes.append(np.clip(smooth + noise, 0, 1) * top)
    out = np.rint(np.stack(planes, axis=-1)).astype(np.uint16 if bits == 16 else np.uint8)
    return out


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def write_png16(path, array):
    """A 16-bit gray/RGB/RGBA PNG written by hand (Pillow cannot write 16-bit colour)."""
    height, width, channels = array.shape
    color_type = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    rows = b"".join(b"\x00" + array[y].astype(">u2").tobytes() for y in range(height))
    data = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(rows)) + png_chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(data)


def to_eight_bits(array16):
    # 16 to 8 bits as libpng reduces them: v/257, rounded (an off-by-one level would fail the test).
    return np.floor(array16.astype(np.float64) / 257.0 + 0.5)


# ---------------------------------------------------------------- the reference pipeline

def triangle_weights(source, target):
    """Dense (target x source) matrix of the resize filter along one axis."""
    scale = source / target
    support = max(scale, 1.0)
    centres = (np.arange(target) + 0.5) * scale
    distance = np.abs((np.arange(source) + 0.5)[None, :] - centres[:, None]) / support
    w = np.clip(1.0 - distance, 0.0, None)
    return w / w.sum(axis=1, keepdims=True)


def resize(plane, width, height):
    rows = triangle_weights(plane.shape[0], height)
    cols = triangle_weights(plane.shape[1], width)
    return rows @ plane @ cols.T


def pillow_resize(plane, width, height):
    image = Image.fromarray(plane.astype(np.float32), mode="F")
    return np.asarray(image.resize((width, height), Image.BILINEAR), dtype=np.float64)


def expected_tensor(pixels, color_space, width, height, scaler):
    """pixels: H x W x C float64 on the 0..255 scale, C in 1..4 (2 and 4 carry alpha)."""
    channels = pixels.shape[2]
    if channels in (2, 4):
        colour = pixels[:, :, :-1] * (pixels[:, :, -1:] / 255.0)
    else:
        colour = pixels
    if color_space == "GRAYSCALE":
        planes = [colour[:, :, 0]] if colour.shape[2] == 1 else [
            0.299 * colour[:, :, 0] + 0.587 * colour[:, :, 1] + 0.114 * colour[:, :, 2]]
        biases = [scaler["grayBias"]]
    else:
        rgb = [colour[:, :, 0]] * 3 if colour.shape[2] == 1 else [colour[:, :, c] for c in range(3)]
        biases = [scaler["redBias"], scaler["greenBias"], scaler["blueBias"]]
        if color_space == "BGR":
            rgb, biases = rgb[::-1], biases[::-1]
        planes = rgb
    out, pillow_gap = [], 0.0
    for plane, bias in zip(planes, biases):
        resized = resize(plane, width, height)
        pillow_gap = max(pillow_gap, float(np.abs(resized - pillow_resize(plane, width, height)).max()))
        out.append(scaler["channelScale"] * resized + bias)
    return np.stack(out), pillow_gap


IDENTITY = {"channelScale": 1.0, "redBias": 0.0, "greenBias": 0.0, "blueBias": 0.0, "grayBias": 0.0}


# ---------------------------------------------------------------- cases

def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    cases, errors = [], []

    def add(name, data_or_writer, pixels, color_space, width, height, scaler=None, kind="png", tolerance=1e-3):
        path = os.path.join(outdir, name)
        if callable(data_or_writer):
            data_or_writer(path)
        if pixels is None:  # JPEG: what Pillow decodes
            pixels = np.asarray(Image.open(path)).astype(np.float64)
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        tensor, gap = expected_tensor(pixels.astype(np.float64), color_space, width, height, scaler or IDENTITY)
        assert gap < 1e-3, f"{name}: the dense-matrix resize is {gap} from Pillow's"
        cases.append({"name": name, "file": name, "kind": kind, "colorSpace": color_space, "width": width,
                      "height": height, "scaler": scaler, "tolerance": tolerance,
                      "sourceWidth": int(pixels.shape[1]), "sourceHeight": int(pixels.shape[0]),
                      "pillowResizeGap": gap, "expected": tensor.reshape(-1).tolist()})

    def save_pil(mode_array, mode, **options):
        def write(path):
            Image.fromarray(mode_array, mode=mode).save(path, **options)
        return write

    def check_lossless(name, array):
        back = np.asarray(Image.open(os.path.join(outdir, name)))
        assert np.array_equal(back, array), f"{name} did not read back as written"

    unit = {"channelScale": 1 / 255.0, "redBias": -0.5, "greenBias": -0.25, "blueBias": 0.125, "grayBias": -0.5}
    imagenet = {"channelScale": 0.017, "redBias": -2.1179, "greenBias": -2.0357, "blueBias": -1.8044, "grayBias": 0.0}

    # 8-bit PNGs: the written array is the truth.
    gray = pattern(7, 13, 1)[:, :, 0]
    add("gray8_13x7_to_8x8.png", save_pil(gray, "L"), gray, "GRAYSCALE", 8, 8, unit)
    check_lossless("gray8_13x7_to_8x8.png", gray)
    gray2 = pattern(9, 5, 1)[:, :, 0]
    add("gray8_5x9_to_rgb_10x6.png", save_pil(gray2, "L"), gray2, "RGB", 10, 6, unit)
    rgb = pattern(11, 17, 3)
    add("rgb8_17x11_up_40x30.png", save_pil(rgb, "RGB"), rgb, "RGB", 40, 30)
    check_lossless("rgb8_17x11_up_40x30.png", rgb)
    big = pattern(48, 64, 3)
    add("rgb8_64x48_down_bgr_7x5.png", save_pil(big, "RGB"), big, "BGR", 7, 5, imagenet)
    add("rgb8_64x48_down_gray_9x4.png", save_pil(big, "RGB"), big, "GRAYSCALE", 9, 4, unit)
    same = pattern(6, 6, 3)
    add("rgb8_6x6_same_size.png", save_pil(same, "RGB"), same, "RGB", 6, 6, unit)
    rgba = pattern(20, 20, 4)
    rgba[:5, :, 3] = 0      # fully transparent rows
    rgba[5:9, :, 3] = 255   # opaque rows
    add("rgba8_20x20_to_rgb_10x10.png", save_pil(rgba, "RGBA"), rgba, "RGB", 10, 10, unit)
    check_lossless("rgba8_20x20_to_rgb_10x10.png", rgba)
    add("rgba8_20x20_to_gray_9x9.png", save_pil(rgba, "RGBA"), rgba, "GRAYSCALE", 9, 9, unit)
    la = pattern(6, 7, 2)
    add("gray_alpha8_7x6_to_gray_6x6.png", save_pil(la, "LA"), la, "GRAYSCALE", 6, 6, unit)
    check_lossless("gray_alpha8_7x6_to_gray_6x6.png", la)

    # Palettes: indices and a palette, expanded here.
    palette = RNG.integers(0, 256, size=(16, 3), dtype=np.uint8)
    indices = RNG.integers(0, 16, size=(15, 15), dtype=np.uint8)

    def write_palette(path, transparency=None):
        image = Image.fromarray(indices, mode="P")
        image.putpalette(palette.reshape(-1).tolist())
        options = {} if transparency is None else {"transparency": transparency}
        image.save(path, **options)
    add("palette_15x15_to_rgb_15x15.png", write_palette, palette[indices], "RGB", 15, 15, unit)
    alpha = np.full(16, 255, dtype=np.uint8)
    alpha[3], alpha[7] = 0, 100
    expanded = np.concatenate([palette[indices], alpha[indices][:, :, None]], axis=-1)
    add("palette_trns_15x15_to_bgr_8x8.png", lambda p: write_palette(p, alpha.tobytes()), expanded, "BGR", 8, 8, unit)

    # 1-bit gray.
    bits = (RNG.uniform(size=(10, 12)) > 0.5)
    add("gray1_12x10_to_gray_6x5.png", lambda p: Image.fromarray(bits).save(p), bits * 255.0, "GRAYSCALE", 6, 5)

    # 16-bit: written by hand (colour) or by Pillow (gray); the truth is the 16-bit array.
    gray16 = pattern(10, 12, 1, bits=16)
    add("gray16_12x10_to_gray_12x10.png", lambda p: write_png16(p, gray16), to_eight_bits(gray16), "GRAYSCALE", 12, 10, unit)
    rgb16 = pattern(7, 9, 3, bits=16)
    add("rgb16_9x7_to_rgb_5x5.png", lambda p: write_png16(p, rgb16), to_eight_bits(rgb16), "RGB", 5, 5, unit)
    rgba16 = pattern(8, 8, 4, bits=16)
    rgba16[:2, :, 3] = 65535
    add("rgba16_8x8_to_bgr_4x4.png", lambda p: write_png16(p, rgba16), to_eight_bits(rgba16), "BGR", 4, 4, unit)

    # JPEGs: Pillow's decoded pixels are the truth (same libjpeg-turbo family, same IDCT and upsampling).
    jgray = pattern(21, 33, 1)[:, :, 0]
    add("jpeg_gray_33x21_to_gray_16x16.jpg", save_pil(jgray, "L", quality=90), None, "GRAYSCALE", 16, 16, unit, kind="jpeg")
    jrgb = pattern(30, 40, 3)
    add("jpeg_420_40x30_to_rgb_20x15.jpg", save_pil(jrgb, "RGB", quality=85, subsampling=2), None, "RGB", 20, 15,
        unit, kind="jpeg")
    add("jpeg_444_40x30_up_bgr_64x48.jpg", save_pil(jrgb, "RGB", quality=95, subsampling=0), None, "BGR", 64, 48,
        imagenet, kind="jpeg")
    add("jpeg_progressive_40x30_to_gray_10x10.jpg", save_pil(jrgb, "RGB", quality=80, progressive=True), None,
        "GRAYSCALE", 10, 10, unit, kind="jpeg")
    add("jpeg_odd_37x23_422_to_rgb_11x13.jpg", save_pil(pattern(23, 37, 3), "RGB", quality=75, subsampling=1), None,
        "RGB", 11, 13, kind="jpeg")

    # ---------------------------------------------------------------- refusals
    def refuse(name, data, expect):
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(data)
        errors.append({"name": name, "file": name, "expect": expect})

    png_bytes = open(os.path.join(outdir, "rgb8_17x11_up_40x30.png"), "rb").read()
    refuse("truncated.png", png_bytes[: len(png_bytes) // 2], "corrupt")
    jpeg_bytes = open(os.path.join(outdir, "jpeg_420_40x30_to_rgb_20x15.jpg"), "rb").read()
    refuse("truncated.jpg", jpeg_bytes[: len(jpeg_bytes) // 2], "corrupt")
    refuse("garbage.bin", bytes(RNG.integers(0, 256, size=64, dtype=np.uint8)), "unrecognizedFormat")
    gif = io.BytesIO()
    Image.fromarray(gray).save(gif, format="GIF")
    refuse("image.gif", gif.getvalue(), "unrecognizedFormat")
    bmp = io.BytesIO()
    Image.fromarray(rgb).save(bmp, format="BMP")
    refuse("image.bmp", bmp.getvalue(), "unrecognizedFormat")
    # A valid PNG header declaring 100000 x 100000 (10 Gpx) followed by one tiny IDAT.
    huge = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(b"\x00" * 301)) + png_chunk(b"IEND", b""))
    refuse("huge_declared.png", huge, "tooLarge")
    # A real JPEG whose frame header (SOF) is patched to declare 60000 x 60000.
    data = bytearray(jpeg_bytes)
    at = 2
    while at < len(data):
        marker, length = data[at + 1], struct.unpack(">H", data[at + 2:at + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            data[at + 5:at + 9] = struct.pack(">HH", 60000, 60000)
            break
        at += 2 + length
    refuse("huge_declared.jpg", bytes(data), "tooLarge")
    cmyk = io.BytesIO()
    Image.fromarray(pattern(8, 8, 4), mode="CMYK").save(cmyk, format="JPEG")
    refuse("cmyk.jpg", cmyk.getvalue(), "unsupportedJPEGColorSpace")

    with open(os.path.join(outdir, "cases.json"), "w") as f:
        json.dump({"cases": cases, "errors": errors}, f)
    print(f"{len(cases)} cases, {len(errors)} refusals; largest gap to Pillow's resize "
          f"{max(c['pillowResizeGap'] for c in cases):.2e}")


if __name__ == "__main__":
    main(sys.argv[1])
