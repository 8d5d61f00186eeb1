/// Pixels as the decoder gave them: 8 bits per sample, rows top to bottom, samples interleaved.
/// `channels` is 1 (gray), 2 (gray, alpha), 3 (R, G, B) or 4 (R, G, B, alpha); alpha is straight
/// (not premultiplied).
struct DecodedImage {
    var width: Int
    var height: Int
    var channels: Int
    var samples: [UInt8]

    var hasAlpha: Bool { channels == 2 || channels == 4 }
    var isColor: Bool { channels >= 3 }
}

/// How much a decoder may allocate for one image. Checked against the header's declared size before
/// any pixel memory exists, so a few hundred bytes declaring 100000×100000 cost nothing.
public struct ImageLimits: Sendable {
    /// Most pixels (width × height) a decoded image may have.
    public var maxPixels: Int

    /// 64 Mi pixels: a 64-megapixel photo (256 MiB as RGBA) passes, a decompression bomb does not.
    public static let standard = ImageLimits(maxPixels: 64 << 20)

    public init(maxPixels: Int) { self.maxPixels = maxPixels }

    func check(width: Int, height: Int) throws(ImageInputError) {
        let (pixels, overflow) = width.multipliedReportingOverflow(by: height)
        if overflow || pixels > maxPixels {
            throw .tooLarge(width: width, height: height, maxPixels: maxPixels)
        }
    }
}

/// Decodes PNG or JPEG bytes, recognised by signature.
func decodeImage(_ bytes: UnsafeRawBufferPointer, limits: ImageLimits) throws(ImageInputError) -> DecodedImage {
    switch try ImageFormat.recognize(bytes) {
    case .png: return try decodePNG(bytes, limits: limits)
    case .jpeg: return try decodeJPEG(bytes, limits: limits)
    }
}
