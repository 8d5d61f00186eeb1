/// Why image bytes could not be turned into a model's input. Every case is the producer's to fix (a job
/// carrying one can never succeed), and its description says what to send instead.
public enum ImageInputError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The bytes are neither PNG nor JPEG; `found` names what the signature looks like.
    case unrecognizedFormat(found: String)
    /// The decoder refused the bytes (truncated, corrupt, or a variant it cannot read).
    case corrupt(format: ImageFormat, reason: String)
    /// The declared dimensions exceed the limit; refused before any pixel memory is allocated.
    case tooLarge(width: Int, height: Int, maxPixels: Int)
    /// A JPEG in a colour space other than gray or YCbCr/RGB (CMYK, YCCK).
    case unsupportedJPEGColorSpace(String)
    /// The model's image feature asks for something this decoder cannot produce.
    case unsupportedConstraint(String)
    /// The model's preprocessing subtracts a mean image, which is not implemented.
    case meanImageUnsupported(featureName: String)
    /// The model has no image input of that name.
    case noImageInput(name: String)

    public var description: String {
        switch self {
        case .unrecognizedFormat(let found):
            return "image bytes are \(found); send PNG or JPEG bytes (base64 in the JSON `image` field)"
        case .corrupt(let format, let reason):
            return "the \(format.rawValue) image could not be decoded (\(reason)); send the complete, unmodified file"
        case .tooLarge(let width, let height, let maxPixels):
            return "the image declares \(width)×\(height) pixels, more than the limit of \(maxPixels); "
                + "shrink it before sending (the model only sees its own input size anyway)"
        case .unsupportedJPEGColorSpace(let space):
            return "the JPEG is in the \(space) colour space; send a grayscale or RGB (YCbCr) JPEG, or a PNG"
        case .unsupportedConstraint(let what):
            return "the model's image input cannot be fed from PNG/JPEG bytes: \(what)"
        case .meanImageUnsupported(let name):
            return "the model preprocesses image input \"\(name)\" by subtracting a mean image, which Attune does not "
                + "support; convert the model with a scaler (channel scale and biases) instead"
        case .noImageInput(let name):
            return "the model has no image input named \"\(name)\"; send image bytes only for the model's image inputs"
        }
    }
}

/// The encodings Attune decodes, recognised by their signatures.
public enum ImageFormat: String, Sendable {
    case png = "PNG"
    case jpeg = "JPEG"

    /// The format whose signature starts `bytes`, or an error naming what the bytes look like.
    static func recognize(_ bytes: UnsafeRawBufferPointer) throws(ImageInputError) -> ImageFormat {
        func starts(_ signature: [UInt8], at offset: Int = 0) -> Bool {
            bytes.count >= offset + signature.count
                && signature.indices.allSatisfy { bytes[offset + $0] == signature[$0] }
        }
        if starts([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]) { return .png }
        if starts([0xFF, 0xD8, 0xFF]) { return .jpeg }
        let found: String
        if bytes.isEmpty { found = "empty" }
        else if starts(Array("GIF8".utf8)) { found = "a GIF" }
        else if starts(Array("BM".utf8)) { found = "a BMP" }
        else if starts(Array("RIFF".utf8)) && starts(Array("WEBP".utf8), at: 8) { found = "a WebP" }
        else if starts([0x49, 0x49, 0x2A, 0x00]) || starts([0x4D, 0x4D, 0x00, 0x2A]) { found = "a TIFF" }
        else if starts(Array("ftyp".utf8), at: 4) { found = "an HEIF/AVIF/MP4 container" }
        else {
            let head = bytes.prefix(8).map { String($0, radix: 16, uppercase: true) }
                .map { $0.count == 1 ? "0" + $0 : $0 }.joined(separator: " ")
            found = "of an unknown format (first bytes \(head))"
        }
        throw .unrecognizedFormat(found: found)
    }
}
