internal import CPNG

/// Decodes a PNG with libpng's simplified API into 8-bit samples, keeping the file's own gray/colour and
/// alpha: palettes are expanded (tRNS becomes alpha), 1-, 2- and 4-bit gray is widened to 8 bits, and
/// 16-bit samples are reduced to 8 bits (Core ML's image inputs are 8-bit pixel buffers too).
///
/// 16-bit files without gAMA/sRGB chunks are read as sRGB-encoded (`PNG_IMAGE_FLAG_16BIT_sRGB`), which is
/// how nearly every tool writes them; libpng's default would take them as linear and gamma-encode them,
/// changing every mid-tone. A file that carries a non-sRGB gAMA chunk is converted to sRGB by libpng.
func decodePNG(_ bytes: UnsafeRawBufferPointer, limits: ImageLimits) throws(ImageInputError) -> DecodedImage {
    var image = png_image()
    image.version = UInt32(PNG_IMAGE_VERSION)
    guard png_image_begin_read_from_memory(&image, bytes.baseAddress, bytes.count) != 0 else {
        throw .corrupt(format: .png, reason: pngMessage(&image))
    }
    // From here libpng holds memory until finish_read succeeds or png_image_free is called.
    let width = Int(image.width), height = Int(image.height)
    do { try limits.check(width: width, height: height) } catch {
        png_image_free(&image)
        throw error
    }
    image.flags |= UInt32(PNG_IMAGE_FLAG_16BIT_sRGB)
    let color = image.format & UInt32(PNG_FORMAT_FLAG_COLOR) != 0
    let alpha = image.format & UInt32(PNG_FORMAT_FLAG_ALPHA) != 0
    // Clearing LINEAR asks for 8-bit output; clearing COLORMAP asks for expanded pixels.
    image.format = (color ? UInt32(PNG_FORMAT_FLAG_COLOR) : 0) | (alpha ? UInt32(PNG_FORMAT_FLAG_ALPHA) : 0)
    let channels = (color ? 3 : 1) + (alpha ? 1 : 0)
    var samples = [UInt8](repeating: 0, count: width * height * channels)
    let ok = samples.withUnsafeMutableBytes { buffer in
        png_image_finish_read(&image, nil, buffer.baseAddress, Int32(width * channels), nil)
    }
    guard ok != 0 else {
        // finish_read frees the image's memory itself when it fails.
        throw .corrupt(format: .png, reason: pngMessage(&image))
    }
    return DecodedImage(width: width, height: height, channels: channels, samples: samples)
}

/// libpng's message for the last error, a NUL-terminated char[64] inside the png_image.
private func pngMessage(_ image: inout png_image) -> String {
    withUnsafeBytes(of: &image.message) { raw in
        let text = String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        return text.isEmpty ? "libpng gave no reason" : text
    }
}
