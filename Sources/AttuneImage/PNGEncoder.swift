internal import CPNG
public import Foundation

/// Writes 8-bit gray pixels as a PNG with libpng's simplified API: how the command line turns a CSV row into
/// the image a model with an image input takes (`--image-size`), so that what it sends is exactly the file
/// an app would send.
public enum PNGEncoder {
    /// `pixels` row-major, `width * height` values.
    public static func gray(width: Int, height: Int, pixels: [UInt8]) throws(ImageInputError) -> Data {
        precondition(pixels.count == width * height, "gray PNG: \(pixels.count) pixels are not \(width)×\(height)")
        var image = png_image()
        image.version = UInt32(PNG_IMAGE_VERSION)
        image.width = UInt32(width)
        image.height = UInt32(height)
        image.format = UInt32(PNG_FORMAT_GRAY)
        var size = 0
        // First call measures, second writes.
        let measured = pixels.withUnsafeBytes {
            png_image_write_to_memory(&image, nil, &size, 0, $0.baseAddress, Int32(width), nil)
        }
        guard measured != 0, size > 0 else { throw .corrupt(format: .png, reason: "libpng could not size the PNG") }
        var out = Data(count: size)
        let written = out.withUnsafeMutableBytes { memory in
            pixels.withUnsafeBytes {
                png_image_write_to_memory(&image, memory.baseAddress, &size, 0, $0.baseAddress, Int32(width), nil)
            }
        }
        guard written != 0 else { throw .corrupt(format: .png, reason: "libpng could not write the PNG") }
        return out.prefix(size)
    }
}
