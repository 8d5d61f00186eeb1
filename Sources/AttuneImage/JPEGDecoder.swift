internal import CTurboJPEG

/// Decodes a baseline or progressive JPEG with TurboJPEG: gray files to 1 channel, YCbCr/RGB files to
/// R, G, B. The IDCT is the accurate integer one and chroma upsampling the smooth ("fancy") one, which
/// is also libjpeg's default, so other libjpeg-based readers (Pillow) see the same pixels. Any warning
/// (a truncated file, a corrupt segment) stops the decode and is reported: a half-gray image would
/// train the model on pixels the producer never sent. EXIF orientation is not applied (Core ML's
/// `init(cgImage:constraint:)` also takes the image as `.up`).
func decodeJPEG(_ bytes: UnsafeRawBufferPointer, limits: ImageLimits) throws(ImageInputError) -> DecodedImage {
    guard let handle = tjInitDecompress() else {
        throw .corrupt(format: .jpeg, reason: "TurboJPEG could not start a decompressor")
    }
    defer { tjDestroy(handle) }
    let source = bytes.bindMemory(to: UInt8.self)
    var width: Int32 = 0, height: Int32 = 0, subsampling: Int32 = 0, colorspace: Int32 = 0
    guard tjDecompressHeader3(handle, source.baseAddress, UInt(bytes.count), &width, &height, &subsampling,
                              &colorspace) == 0 else {
        throw .corrupt(format: .jpeg, reason: jpegMessage(handle))
    }
    try limits.check(width: Int(width), height: Int(height))
    let channels: Int, pixelFormat: TJPF
    switch TJCS(rawValue: UInt32(colorspace)) {
    case TJCS_GRAY: (channels, pixelFormat) = (1, TJPF_GRAY)
    case TJCS_YCbCr, TJCS_RGB: (channels, pixelFormat) = (3, TJPF_RGB)
    case TJCS_CMYK: throw .unsupportedJPEGColorSpace("CMYK")
    case TJCS_YCCK: throw .unsupportedJPEGColorSpace("YCCK")
    default: throw .unsupportedJPEGColorSpace("unknown (\(colorspace))")
    }
    var samples = [UInt8](repeating: 0, count: Int(width) * Int(height) * channels)
    let flags = TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS
    let status = samples.withUnsafeMutableBufferPointer { buffer in
        tjDecompress2(handle, source.baseAddress, UInt(bytes.count), buffer.baseAddress, width, 0, height,
                      Int32(pixelFormat.rawValue), flags)
    }
    guard status == 0 else { throw .corrupt(format: .jpeg, reason: jpegMessage(handle)) }
    return DecodedImage(width: Int(width), height: Int(height), channels: channels, samples: samples)
}

private func jpegMessage(_ handle: tjhandle) -> String {
    guard let text = tjGetErrorStr2(handle) else { return "TurboJPEG gave no reason" }
    return String(cString: text)
}
